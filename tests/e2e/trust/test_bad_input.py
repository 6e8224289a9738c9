"""One line for every bad input: run records of the wrong shape, JSON nested thousands deep, a
GPUCLI_HOME that is not a usable folder, a host that accepts TCP but never speaks SSH, two first
launches creating gpucli's SSH key at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucli.errors import ConnectionFailed
from gpucli.runs import records as runs
from tests.support.cli import cli

REPO = Path(__file__).resolve().parents[3]


def one_line(code: int, out: str, err: str) -> str:
    assert code != 0, out
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "internal error" not in err and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("kind", ["a-file", "missing-parent-of-a-file", "dev-null"])
def test_a_home_that_is_not_a_usable_folder_is_one_line(kind, tmp_path, monkeypatch, capsys):
    target = {"a-file": tmp_path / "file", "missing-parent-of-a-file": tmp_path / "file" / "home",
              "dev-null": Path("/dev/null")}[kind]
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("GPUCLI_HOME", str(target))
    for command in (("ls",), ("status", "x"), ("down", "--strays", "--yes")):
        line = one_line(*cli(capsys, *command))
        assert "GPUCLI_HOME" in line and "cannot be used" in line


def base_record(**over):
    data = {"name": "odd", "provider": "local", "created_at": "2026-11-24T00:00:00+00:00", "profile": "cpu",
            "phase": "fast", "model": "tiny", "n_gpus": 1, "gpu": None, "workdir": "/nonexistent/odd",
            "status": "stopped", "launch": {"request": {"profile": "cpu", "provider": "local", "limits": {}}}}
    data.update(over)
    return data


ODD = {
    "step-string": {"step": "12"}, "step-inf": {"step": 1e309}, "step-list": {"step": [1]},
    "loss-markup": {"loss": "[/bold]"}, "reason-markup": {"end_reason": "[/bold] \x1b[2J"},
    "message-list": {"message": ["a"]}, "limits-list": {"limits": [1, 2]}, "ssh-string": {"ssh": "host"},
    "launch-list": {"launch": [1]}, "launch-request-string": {"launch": {"request": "cpu"}},
    "launch-limits-string": {"launch": {"request": {"profile": "cpu", "provider": "local", "limits": "x"}}},
    "launch-extra-number": {"launch": {"request": {"profile": "cpu", "provider": "local", "limits": {},
                                                   "extra": 5}}},
    "n-gpus-huge": {"n_gpus": 10 ** 400}, "launcher-number": {"launcher": 5},
}


@pytest.mark.parametrize("case", sorted(ODD))
def test_a_record_of_the_wrong_shape_is_one_line(case, capsys):
    raw = json.dumps(base_record(**ODD[case]), allow_nan=True) if case != "n-gpus-huge" else \
        json.dumps(base_record()).replace('"n_gpus": 1', '"n_gpus": ' + "9" * 5000)
    (runs.runs_dir() / "odd.json").write_text(raw)
    for command in (("status", "odd"), ("resume", "odd"), ("down", "odd")):
        code, out, err = cli(capsys, *command)
        assert "internal error" not in err and "Traceback" not in err and "\x1b" not in out + err, (command, err)
    code, out, err = cli(capsys, "ls")
    assert code == 0 and "internal error" not in err


def test_json_nested_thousands_deep_is_one_line(capsys):
    (runs.runs_dir() / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    line = one_line(*cli(capsys, "status", "deep"))
    assert "nested too deep" in line
    code, out, err = cli(capsys, "ls")
    assert code == 0 and "skipped" in err and "nested too deep" in err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["step", "loss", "status", "end_reason", "message", "limits", "planned",
                                        "n_gpus", "cost_usd", "previous_instances", "launch", "ssh", "pid"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                                    lambda kids: st.lists(kids, max_size=3)
                                    | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=8),
                       max_size=4))
def test_any_field_values_never_end_in_an_internal_error(capsys, fields):
    (runs.runs_dir() / "odd.json").write_text(json.dumps(base_record(**fields), default=str))
    for command in (("ls",), ("status", "odd")):
        code, out, err = cli(capsys, *command)
        assert "internal error" not in err and "Traceback" not in err, (command, fields, err)


def test_a_host_that_never_sends_a_banner_is_one_line_within_its_deadline(capsys):
    from gpucli.ssh.remote import Remote, SshTarget

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held: list = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    try:
        with pytest.raises(ConnectionFailed) as exc:
            Remote(SshTarget(host="127.0.0.1", port=server.getsockname()[1], user="u"), connect_timeout_s=1.5).connect()
    finally:
        server.close()
    assert "sent no SSH banner within 1.5 s" in str(exc.value) and "\n" not in str(exc.value)
    _, err = capsys.readouterr()
    assert "Traceback" not in err and "Exception (client)" not in err


def test_two_first_launches_share_one_key(isolated_home):
    """Eight processes ask for gpucli's key pair in a fresh home at once: one pair is made, every
    process gets it whole, and none deletes another's."""
    script = ("from gpucli.providers.cloudtarget import ssh_keypair; k, pub = ssh_keypair(); "
              "print(pub); print(open(k).read().splitlines()[0])")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    pubs = {o.splitlines()[0] for o, _ in outs}
    assert len(pubs) == 1
    key = isolated_home / "id_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600
    assert (isolated_home / "id_ed25519.pub").read_text().strip() == pubs.pop()
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True).stdout
    assert derived.split()[1] == (isolated_home / "id_ed25519.pub").read_text().split()[1]
    assert not [p for p in isolated_home.iterdir() if ".tmp" in p.name]
