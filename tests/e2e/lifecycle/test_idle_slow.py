"""Idle GPUs and a slow run, end to end on this machine with the real trainer (torch on CPU) and the real
watchdog: ``nvidia-smi`` is a script first on PATH printing 0 %, read exactly as the real one is read."""

from __future__ import annotations

import json
from pathlib import Path

from gpucli.run import records as runs
from gpucli.run.records import PlannedSpeed
from tests.support.cli import FAST_TRAINER, cli, rows_of, wait_for

FAST = ["--set", "data.max_bytes=400000", *FAST_TRAINER]


def fake_smi(folder: Path, monkeypatch) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\nprintf '0, 0\\n1, 0\\n'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{__import__('os').environ['PATH']}")


def test_idle_gpus_stop_a_local_run_with_a_checkpoint(capsys, tmp_path, monkeypatch):
    fake_smi(tmp_path / "bin", monkeypatch)
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--name", "idle-e2e",
                         "--provider", "local", "--idle-stop", "5s", *FAST)
    assert code == 0, err
    record = runs.load("idle-e2e")
    assert record.limits.idle_stop_minutes == 5 / 60

    def stopped():
        code, out, _ = cli(capsys, "status", "idle-e2e", "--json")
        got = json.loads(out) if code == 0 else {}
        return got if got.get("state") == "stopped" else None

    got = wait_for(stopped, 180, "the idle stop")
    assert got["finished_reason"].startswith("idle: GPUs at 0 % for "), got
    finished = [r for r in rows_of(capsys, "idle-e2e") if r.get("event") == "finished"]
    assert finished and finished[-1]["reason"] == "signal"  # the trainer was signalled: its checkpoint is written
    from gpucli.run.checkpoints import list_checkpoints
    from gpucli.run.targets import open_host

    with open_host(runs.load("idle-e2e")) as host:
        cks = list_checkpoints(host, record.workdir)
    assert any(c.step == finished[-1]["step"] for c in cks), [(c.step, c.kind) for c in cks]
    log = (Path(record.workdir) / "watchdog.log").read_text()
    assert "idle stop: every GPU at or under 5 %" in log and "sent SIGTERM" in log
    assert runs.load("idle-e2e").end_reason.startswith("idle: GPUs at 0 %")


def test_a_slow_run_says_so_in_status_and_tail(capsys, tmp_path, monkeypatch):
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--name", "slow-e2e",
                         "--provider", "local", *FAST)
    assert code == 0, err
    record = runs.load("slow-e2e")
    assert record.planned.tokens_per_s is None and record.limits.slow_below == 0.7
    # A CPU run has no plan to compare with: nothing said. With the plan set far above any CPU (as a
    # GPU run's record holds it), status and tail say slow with both numbers.
    wait_for(lambda: sum(r.get("kind") == "train" for r in rows_of(capsys, "slow-e2e")) >= 9, 180, "9 train rows")
    code, out, _ = cli(capsys, "status", "slow-e2e", "--json")
    assert json.loads(out).get("slow") is None
    runs.save(runs.load("slow-e2e").with_(planned=PlannedSpeed(tokens_per_s=3e7, source="test")))
    code, out, _ = cli(capsys, "status", "slow-e2e", "--json")
    slow = json.loads(out)["slow"]
    assert slow.startswith("slow: 0 % of plan (") and "tok/s measured, 30.0M planned)" in slow
    code, out, _ = cli(capsys, "status", "slow-e2e")
    assert "slow: 0 % of plan" in out
    code, out, err = cli(capsys, "down", "slow-e2e")
    assert code == 0, err
