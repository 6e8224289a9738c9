"""An outbid vast spot instance resumes its run by itself: no gpucli process takes part.

vast pauses an outbid interruptible instance and starts its container again when priority returns
(guides/instances/choosing/instance-types.mdx); the emulator kills every process of the instance on
the pause and runs its onstart again on the resume. gpucli's onstart runs the run's resume.sh, which
starts the trainer (``--resume auto``: the newest checkpoint on the instance's disk) and the watchdog.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, launch
from tests.support.cli import cli, wait_for

STEPS = 200


def rows(workdir: Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def checkpoint_steps(workdir: Path) -> list[int]:
    return sorted(json.loads((d / "meta.json").read_text())["step"] for d in (workdir / "checkpoints").glob("step_*")
                  if (d / "meta.json").exists())


def test_outbid_twice_resumes_from_disk_and_ends_itself(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    emu.run_onstart = True
    name = "outbid"
    # Enough steps that the trainer resumed after the first pause is still going when the test pauses it
    # again (on an idle machine the tiny model does a step in ~20 ms: 60 steps were over before the poll)
    code, _, err = launch(capsys, tmp_path, "vast", name, "--spot", "--steps", str(STEPS), "--stall-minutes", "30")
    assert code == 0, err
    record = runs.load(name)
    pod_id, workdir = record.instance_id, Path(record.workdir)
    body = emu.create_bodies[-1][1]
    assert f"{workdir}/resume.sh" in body["onstart"]  # set at create: runs at every container start
    assert (workdir / "resume.sh").exists() and (workdir / "job.sh").exists()

    resumed_at = []
    for _ in range(2):
        floor = max(checkpoint_steps(workdir) or [0])
        wait_for(lambda f=floor: max(checkpoint_steps(workdir) or [0]) > f, 180, "a new checkpoint on the disk")
        emu.outbid(pod_id)  # paused: the trainer and the watchdog die with the container
        held = max(checkpoint_steps(workdir))
        time.sleep(0.5)
        emu.resume(pod_id)  # priority returns: the container starts again and runs its onstart
        resumed_at.append(held)

        def going_on(h=held):
            after = [r for r in rows(workdir) if r.get("event") == "resumed" and r.get("step") == h]
            return after or None

        wait_for(going_on, 180, f"the trainer resuming from step {held} on the same instance")
        code, out, err = cli(capsys, "status", name, "--json")  # status counts the pauses and resumes
        assert code == 0 and json.loads(out)["restarts"] == len(resumed_at), out

    # The run finishes; its watchdog (started by resume.sh) stops the instance with the instance key.
    ended = wait_for(lambda: [e for e in emu.ledger.ended(pod_id) if e.event == "stopped"], 600,
                     "the instance to stop itself")
    assert ended[0].by == "pod-key"
    all_rows = rows(workdir)
    finished = [r for r in all_rows if r.get("event") == "finished"]
    assert finished and finished[-1]["reason"] == "max_steps"
    # One loss curve: after each resume the steps go on from the checkpoint it resumed from.
    train = [r["step"] for r in all_rows if r.get("kind") == "train"]
    assert max(train) == STEPS
    for held in resumed_at:
        idx = next(i for i, r in enumerate(all_rows) if r.get("event") == "resumed" and r.get("step") == held)
        nxt = next(r["step"] for r in all_rows[idx:] if r.get("kind") == "train")
        assert nxt == held + 1
    restarts = (workdir / "restarts.jsonl").read_text().splitlines()
    assert len(restarts) == 2  # one line per container start after the first
    assert [e.event for e in emu.ledger.events if e.pod_id == pod_id].count("resumed") == 2

    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)


def test_a_resumed_instance_whose_run_is_over_is_stopped_not_destroyed(request, capsys, tmp_path, monkeypatch):
    """A container that starts again after its run is over resumes nothing; its boot guard (in the same
    onstart) stops it after its window, never terminates it, even with ``--on-end terminate``: the disk
    holds the run (issue 41 rule 1)."""
    emu = emulator_for(request, "vast")
    emu.run_onstart = True
    monkeypatch.setenv("GPUCLI_BOOT_GUARD_S", "3")  # the window the onstart's guard gets at create
    name = "over"
    code, _, err = launch(capsys, tmp_path, "vast", name, "--spot", "--steps", "6", "--on-end", "terminate")
    assert code == 0, err
    record = runs.load(name)
    pod_id, workdir = record.instance_id, Path(record.workdir)
    status = workdir / "status.json"
    wait_for(lambda: status.exists() and '"finished"' in status.read_text() or None, 180, "the run's end")
    # outbid before its watchdog ended it (a race vast can win): the instance comes back with nothing to do
    raced = pod_id in emu.pods and not emu.pods[pod_id].stopped
    if raced:
        emu.outbid(pod_id)
        emu.resume(pod_id)
    wait_for(lambda: [e for e in emu.ledger.ended(pod_id) if e.event in ("stopped", "terminated")
                      and e.by == "pod-key"] or None, 120, "the instance to end itself")
    events = [e.event for e in emu.ledger.events if e.pod_id == pod_id]
    if raced and "terminated" not in events[:events.index("resumed")]:  # the watchdog had not ended it
        wait_for(lambda: [e for e in emu.ledger.events[len(events) - 1:] if e.pod_id == pod_id
                          and e.event == "stopped" and e.by == "pod-key"] or None, 120, "the guard's stop")
        after = [e.event for e in emu.ledger.events if e.pod_id == pod_id]
        assert "terminated" not in after[after.index("resumed"):]  # stopped, never terminated
        assert "left up for copying" in (workdir / "watchdog.log").read_text()
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
