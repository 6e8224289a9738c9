"""A pod whose container starts again is never destroyed by its boot guard (issue 41 rules 1 and 6).

The emulators run a container's start command at every start, as the services do (startcmd.py). A pod
that ``--on-end stop`` kept and a user starts to copy its checkpoints stays up for the guard's window,
then the guard stops it (never terminates it: its disk holds the checkpoints), on RunPod and vast alike;
a RunPod pod whose container restarts mid-run (a host-side restart) resumes the run from its volume disk
by itself, as a vast instance does after a pause."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpucli.providers.clients import get_provider
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, launch
from tests.e2e.cloud.test_outbid_resume import checkpoint_steps, rows
from tests.support.cli import cli, wait_for

WINDOW_S = "25"  # the guard's window (baked into the start command at create)


def _stops(emu, pod_id: str) -> list:
    return [e for e in emu.ledger.ended(pod_id) if e.event in ("stopped", "terminated")]


def ended_by_stop(request, capsys, tmp_path, monkeypatch, provider: str, name: str, guard_s: str):
    """A short run launched with ``--on-end stop`` on an emulator that runs the start command at every
    container start (as the services do), waited for until its end stopped the pod: (emulator, record)."""
    emu = emulator_for(request, provider)
    emu.run_start_commands = True
    monkeypatch.setenv("GPUCLI_BOOT_GUARD_S", guard_s)
    code, _, err = launch(capsys, tmp_path, provider, name, "--steps", "12", "--on-end", "stop")
    assert code == 0, err
    record = runs.load(name)
    wait_for(lambda: _stops(emu, record.instance_id) or None, 240, "the run's end stopping the pod", interval=0.3)
    return emu, record


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_a_kept_pod_started_to_be_read_is_stopped_again_never_destroyed(provider, request, capsys, tmp_path,
                                                                        monkeypatch):
    name = f"kept-{provider}"
    emu, record = ended_by_stop(request, capsys, tmp_path, monkeypatch, provider, name, WINDOW_S)
    pod_id, workdir = record.instance_id, Path(record.workdir)
    (first,) = _stops(emu, pod_id)
    assert (first.event, first.by) == ("stopped", "pod-key")
    kept = checkpoint_steps(workdir)
    assert kept

    # A user starts it to copy the checkpoints: the start command runs again (guard, resume.sh).
    get_provider(provider).start(pod_id)  # type: ignore[attr-defined]
    if provider == "runpod":
        wait_for(lambda: get_provider("runpod").get(pod_id).ssh_ready or None, 60, "the pod to start")
    guard_log = emu.pods[pod_id].sshd.root / ".gpucli-boot-guard.log"
    wait_for(lambda: guard_log.exists() and "never terminate" in guard_log.read_text() or None, 60,
             "the guard seeing a restart")
    wait_for(lambda: "left up for copying" in (workdir / "watchdog.log").read_text() or None, 60,
             "resume.sh seeing the run over")
    time.sleep(3)
    assert len(_stops(emu, pod_id)) == 1, "stopped again at once"  # up to be read
    assert not any(r.get("event") == "resumed" for r in rows(workdir))  # the finished run did not start again

    wait_for(lambda: len(_stops(emu, pod_id)) == 2 or None, 180, "the guard stopping the pod after its window")
    assert [(e.event, e.by) for e in _stops(emu, pod_id)] == [("stopped", "pod-key")] * 2
    assert pod_id in emu.ledger.alive() and checkpoint_steps(workdir) == kept
    assert "stopping the pod" in guard_log.read_text()
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)


def test_a_runpod_pod_restarted_mid_run_resumes_by_itself(runpod_emulator, capsys, tmp_path, monkeypatch):
    emu = runpod_emulator
    emu.run_start_commands = True
    monkeypatch.setenv("GPUCLI_BOOT_GUARD_S", WINDOW_S)
    name = "restarted"
    code, _, err = launch(capsys, tmp_path, "runpod", name, "--steps", "200", "--stall-minutes", "30",
                          "--on-end", "stop")
    assert code == 0, err
    record = runs.load(name)
    pod_id, workdir = record.instance_id, Path(record.workdir)
    create = next(b for op, b in emu.calls if op == "createPod")
    assert f"{workdir}/resume.sh" in create["args"] and create["args"].endswith("exec /start.sh'")
    wait_for(lambda: checkpoint_steps(workdir) or None, 180, "a checkpoint on the disk")
    emu.restart_container(pod_id)  # the host restarts the container: the trainer and watchdog die
    held = max(checkpoint_steps(workdir))
    wait_for(lambda: [r for r in rows(workdir) if r.get("event") == "resumed"] or None, 180,
             "the trainer resuming on the same pod")
    resumed = next(r for r in rows(workdir) if r.get("event") == "resumed")
    assert resumed["step"] >= held
    guard_log = emu.pods[pod_id].sshd.root / ".gpucli-boot-guard.log"
    wait_for(lambda: "handed over" in guard_log.read_text().split("never terminate")[-1] or None, 60,
             "the restarted watchdog's hand-over")
    ended = wait_for(lambda: _stops(emu, pod_id) or None, 600, "the resumed run's end stopping the pod")
    assert (ended[0].event, ended[0].by) == ("stopped", "pod-key")
    finished = [r for r in rows(workdir) if r.get("event") == "finished"]
    assert finished and finished[-1]["reason"] == "max_steps"
    assert len((workdir / "restarts.jsonl").read_text().splitlines()) == 1
    assert json.loads((workdir / "watchdog.json").read_text())["state"] in ("ending", "done")  # a stop kills it
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
