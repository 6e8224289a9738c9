"""Idle GPUs and a slow run, end to end on this machine with the real trainer (torch on CPU) and the real
watchdog: ``nvidia-smi`` is a script first on PATH printing 0 %, read exactly as the real one is read."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpucli.runs import records as runs
from gpucli.runs.records import PlannedSpeed
from tests.support.cli import FAST_TRAINER, cli, rows_of, wait_for
from tests.support.sshd import SshServer

FAST = ["--set", "data.max_bytes=400000", *FAST_TRAINER]


def fake_smi(folder: Path, monkeypatch) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\nprintf '0, 0\\n1, 0\\n'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def idle_stop_ends_the_run(capsys, name: str, launch_args: list[str]) -> None:
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--name", name,
                         "--idle-stop", "5s", *launch_args, *FAST)
    assert code == 0, err
    record = runs.load(name)
    assert record.limits.idle_stop_minutes == 5 / 60

    def stopped():
        code, out, _ = cli(capsys, "status", name, "--json")
        got = json.loads(out) if code == 0 else {}
        return got if got.get("state") == "stopped" else None

    got = wait_for(stopped, 180, "the idle stop")
    assert got["finished_reason"].startswith("idle: GPUs at 0 % for "), got
    finished = [r for r in rows_of(capsys, name) if r.get("event") == "finished"]
    assert finished and finished[-1]["reason"] == "signal"  # the trainer was signalled: its checkpoint is written
    from gpucli.providers.registry import open_host
    from gpucli.run.files.checkpoints import list_checkpoints

    with open_host(runs.load(name)) as host:
        cks = list_checkpoints(host, record.workdir)
        log = host.read_file(f"{record.workdir}/watchdog.log").decode()
    assert any(c.step == finished[-1]["step"] for c in cks), [(c.step, c.kind) for c in cks]
    assert "idle stop: every GPU at or under 5 %" in log and "sent SIGTERM" in log
    assert runs.load(name).end_reason.startswith("idle: GPUs at 0 %")
    code, out, _ = cli(capsys, "status", name)
    assert code == 0 and "idle: GPUs at 0 %" in out


def test_idle_gpus_stop_a_local_run_with_a_checkpoint(capsys, tmp_path, monkeypatch):
    fake_smi(tmp_path / "bin", monkeypatch)
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    idle_stop_ends_the_run(capsys, "idle-local", ["--provider", "local"])


def test_idle_gpus_stop_an_ssh_run_with_a_checkpoint(capsys, tmp_path, monkeypatch, client_key):
    """The ssh host's sessions get a PATH with the fake nvidia-smi first (sshd SetEnv), as a GPU host's do."""
    fake_smi(tmp_path / "bin", monkeypatch)
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    server = SshServer.start(tmp_path / "sshd", authorized_keys=[client_key[1]],
                             set_env={"PATH": os.environ["PATH"]})
    try:
        idle_stop_ends_the_run(capsys, "idle-ssh", [
            "--provider", "ssh", "--host", f"{server.user}@127.0.0.1:{server.port}", "--identity", str(client_key[0]),
            "--python", sys.executable, "--workdir", str(tmp_path / "host" / "run")])
    finally:
        server.stop()


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
