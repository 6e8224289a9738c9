"""Keys in $XDG_CONFIG_HOME/gpucli (moved there once from the data home, the old file still read), and
the user's launch defaults (``gpucli config``) below the command line and task.yaml."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from tests.support.cli import cli


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUCLI_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(sys, "platform", "linux")
    return tmp_path


def test_keys_move_to_the_config_home_once(capsys, xdg):
    old = xdg / "data" / "gpucli" / "keys.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps({"runpod": "rp-key-0123456789abcdef"}))
    code, out, err = cli(capsys, "keys", "list", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["runpod"]["source"] == "keys.json"
    new = xdg / "config" / "gpucli" / "keys.json"
    assert json.loads(new.read_text()) == {"runpod": "rp-key-0123456789abcdef"} and not old.exists()
    assert stat.S_IMODE(new.stat().st_mode) == 0o600
    code, out, err = cli(capsys, "keys", "path")
    assert out.strip() == str(new)
    # an older gpucli wrote the old file again: what only it holds is still read
    old.write_text(json.dumps({"vast": "vast-key-0123456789abcdef", "runpod": "stale"}))
    from gpucli.settings import load_keys

    assert load_keys() == {"vast": "vast-key-0123456789abcdef", "runpod": "rp-key-0123456789abcdef"}


def test_config_defaults_fill_the_launch(capsys, tmp_path):
    assert cli(capsys, "config", "set", "phase", "extreme")[0] == 0
    assert cli(capsys, "config", "set", "local.python", sys.executable)[0] == 0
    assert cli(capsys, "config", "set", "runpod.disk", "120")[0] == 0
    code, out, err = cli(capsys, "config", "list", "--json")
    assert json.loads(out) == {"phase": "extreme", "local": {"python": sys.executable}, "runpod": {"disk": 120}}
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["phase"] == "extreme" and plan["command"].startswith(sys.executable + " -m trainer.train")
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--dry-run", "--json")
    assert json.loads(out)["phase"] == "fast"  # the command line wins
    assert cli(capsys, "config", "set", "provider", "ssh")[0] == 0
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--dry-run")
    assert code != 0 and "--provider ssh needs --host" in err  # the default provider was used
    assert cli(capsys, "config", "unset", "provider")[0] == 0
    code, out, err = cli(capsys, "config", "get", "runpod.disk")
    assert out.strip() == "120"


@pytest.mark.parametrize("args, needle", [
    (["set", "runpod.disk", "-5"], "positive whole number"),
    (["set", "runpod.disk", "1.5"], "positive whole number"),
    (["set", "provider", "aws"], "unknown provider"),
    (["set", "nope", "1"], "unknown setting"),
    (["set", "vast.spot", "maybe"], "true or false"),
    (["set", "ready_timeout", "nan"], "unknown setting"),
])
def test_bad_settings_are_one_line(capsys, args, needle):
    code, out, err = cli(capsys, "config", *args)
    assert code != 0 and needle in err and "Traceback" not in err


def test_a_broken_config_file_is_one_line(capsys):
    from gpucli.runs.userconfig import path

    path().write_text("provider: [runpod\n")
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--dry-run")
    assert code != 0 and "config.yaml" in err and "Traceback" not in err
    path().write_text("runpod: {disk: lots}\n")
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--dry-run")
    assert code != 0 and "runpod.disk" in err


def test_reliability_default_filters_the_offers_a_launch_takes(capsys, vast_emulator):
    from gpucli.errors import NoCapacityError
    from gpucli.plan.catalog import load_catalog
    from gpucli.providers.registry import get_target

    target, catalog = get_target("vast"), load_catalog()
    before = target.choose_offers(catalog, "rtx4090", 2, spot=False)
    assert before and all(o.reliability is not None for o in before)
    best = max(o.reliability for o in before)
    assert cli(capsys, "config", "set", "vast.reliability", str(best))[0] == 0
    kept = target.choose_offers(catalog, "rtx4090", 2, spot=False)
    assert kept and all(o.reliability >= best for o in kept)
    assert cli(capsys, "config", "set", "vast.reliability", "1")[0] == 0
    with pytest.raises(NoCapacityError, match="reliability >= 1"):
        target.choose_offers(catalog, "rtx4090", 2, spot=False)
    assert cli(capsys, "config", "set", "vast.reliability", "1.5")[0] != 0
