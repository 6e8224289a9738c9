"""A launch owns the pod it created until it hands it over, whatever ends the launch.

Each launch runs as its own process against the RunPod and vast.ai emulators (pods are real sshd
processes on this machine) and is ended by a signal at a stage: while the pod is being created and
waited for, or while it is being set up (the watchdog already running on it). TERM, HUP and INT run
the launch's cleanup; a SIGKILL cannot, so ``ls`` names the run's pod a stray and ``down --strays``
ends it - or, left alone, the pod's own early watchdog does. Afterwards no pod is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import TINY, emulator_for
from tests.support.cli import cli, wait_for
from tests.support.emulators import PodBehaviour


def slow_python(tmp_path: Path) -> str:
    """The pod's python, 1 s slower at each script read from stdin (bootstrap checks, procid): the
    set-up stage lasts long enough to be interrupted in."""
    path = tmp_path / "slowpy"
    path.write_text(f'#!/bin/sh\n[ "$1" = "-" ] && sleep 1\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def start_launch(tmp_path: Path, provider: str, name: str) -> subprocess.Popen:
    args = ["launch", "--provider", provider, "--profile", "rtx4090", "--phase", "fast", "--name", name,
            "--workdir", str(tmp_path / "pod" / name), "--python", slow_python(tmp_path), "--ready-timeout", "120",
            *TINY]
    return subprocess.Popen([sys.executable, "-c", "from gpucli.cli.app import entry; entry()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])})


def record_of(name: str):
    try:
        return runs.load(name)
    except Exception:  # noqa: BLE001 - not written yet
        return None


def reach(stage: str, emu, name: str, tmp_path: Path) -> None:
    if stage == "provisioning":  # the pod exists, its id is recorded, it is not ready yet
        wait_for(lambda: (r := record_of(name)) is not None and r.instance_id and emu.ledger.created(), 60,
                 "the pod's creation")
    else:  # set-up on the pod: the watchdog is running, the trainer is not started
        wait_for(lambda: (Path(tmp_path / "pod" / name / ".launching")).exists()
                 and (r := record_of(name)) is not None and r.watchdog_pid, 90, "the set-up stage")
        assert record_of(name).status == "starting"


def end_with(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


CASES = [(p, stage, sig) for p in ("runpod", "vast") for stage in ("provisioning", "setup")
         for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL)
         if p == "runpod" or sig in (signal.SIGTERM, signal.SIGKILL)]


@pytest.mark.parametrize(("provider", "stage", "sig"), CASES,
                         ids=[f"{p}-{st}-{signal.Signals(s).name}" for p, st, s in CASES])
def test_a_launch_ended_by_any_signal_leaves_no_pod(provider, stage, sig, request, capsys, tmp_path):
    emu = emulator_for(request, provider)
    if stage == "provisioning":
        emu.behaviours.append(PodBehaviour(stuck=True))
    name = f"sig-{stage[:4]}-{signal.Signals(sig).name.lower()}"
    proc = start_launch(tmp_path, provider, name)
    reach(stage, emu, name, tmp_path)
    code, err = end_with(proc, sig)
    assert "Traceback" not in err and "internal error" not in err, err
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        assert emu.ledger.alive(), "a SIGKILLed launch cannot end its pod itself"
        code, out, err = cli(capsys, "ls")
        assert code == 0, err
        assert "stray: launch died" in out
        code, out, err = cli(capsys, "down", "--strays", "--yes")
        assert code == 0, err
        assert emu.ledger.created()[0].pod_id in out
        assert runs.load(name).status == "failed"
    else:
        assert code != 0
        if sig != signal.SIGINT:
            assert f"ended by {signal.Signals(sig).name}" in err, (code, err)
        assert runs.load(name).status == "failed"
        code, out, err = cli(capsys, "down", "--strays", "--yes")
        assert code == 0, err
        assert "no stray gpucli pods" in err + out
    wait_for(lambda: not emu.ledger.alive(), 30, "every pod ended")
    assert emu.running_sshd_count() == 0
    code, out, err = cli(capsys, "ls")
    assert code == 0 and "stray" not in out


def test_the_pods_own_watchdog_ends_a_pod_whose_launch_was_killed(request, monkeypatch, tmp_path):
    """No `down --strays`: the watchdog started before the set-up ends the pod once the launch is silent."""
    emu = emulator_for(request, "runpod")
    monkeypatch.setenv("GPUCLI_WATCHDOG_LAUNCH_MIN", "0.05")  # 3 s without a sign of the launch
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.2")
    name = "killed-alone"
    proc = start_launch(tmp_path, "runpod", name)
    reach("setup", emu, name, tmp_path)
    assert end_with(proc, signal.SIGKILL)[0] == -signal.SIGKILL
    wait_for(lambda: not emu.ledger.alive(), 60, "the watchdog ending the pod")
    log = (tmp_path / "pod" / name / "watchdog.log").read_text()
    assert "launch gone" in log
    ended = [e for e in emu.ledger.events if e.event == "terminated"]
    assert ended and all(e.pod_id == emu.ledger.created()[0].pod_id for e in ended)
    _ = time
