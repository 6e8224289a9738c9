"""Your own code with a store: a Hugging Face Trainer-style script run by `gpucli launch --provider local`
writes checkpoint-N folders; the uploader sends each (scored by the eval loss its console logged, as
fetch-best scores them), the watchdog's end waits for the last, and fetch-best reads the store once the
run folder is gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.owncode.helpers import finished_rows, launch_own
from tests.e2e.store.test_store_runs import stored
from tests.support.cli import cli, wait_for
from tests.support.s3server import s3_server  # noqa: F401


@pytest.fixture(autouse=True)
def quick_watchdog(monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "15")
    monkeypatch.setenv("GPUCLI_STORE_POLL_S", "1")


def test_own_checkpoints_reach_the_store_and_come_back(capsys, tmp_path, s3_server):  # noqa: F811
    name = "own-stored"
    code, out, err = launch_own(capsys, tmp_path, "hf", name, "--provider", "local", "--profile", "cpu",
                                "--store", "s3://runs/e2e")
    assert code == 0, err
    finished_rows(capsys, name)
    workdir = Path(runs.load(name).workdir)

    def watchdog_done() -> bool:
        try:
            return json.loads((workdir / "watchdog.json").read_text()).get("state") == "done"
        except (OSError, ValueError):
            return False

    wait_for(watchdog_done, 120, "the watchdog's end")
    log = (workdir / "watchdog.log").read_text()
    assert "the store has every checkpoint" in log, log
    cks = stored(name)
    assert {c.kind for c in cks.values()} == {"own"} and "checkpoint-20" in cks, cks
    ck_root = workdir / "code" / "checkpoints"
    for rel, (_, size) in cks["checkpoint-20"].files.items():
        assert (ck_root / rel).stat().st_size == size
    shutil.rmtree(workdir)
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(tmp_path / "back"), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["checkpoint"] == "checkpoint-20" and got["val_loss"] == pytest.approx(1.9)
