"""Spot recovery: a preempted pod's run continues on a new pod from the mirrored checkpoint.

SkyPilot restarts a preempted job from scratch; gpucli continues it: same run, same step, same data
order, one metrics file whose curve joins up.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from gpucli.run.files.harvest import mirror_root, newest_good
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import (
    assert_nothing_running,
    cli,
    emulator_for,
    launch,
    rows_of,
    wait_for,
)


def lose_the_pod(emu, record) -> None:
    """Preemption: the provider stops the pod; its disk (the run folder) goes with it."""
    emu.preempt(record.instance_id)
    time.sleep(0.5)
    shutil.rmtree(os.path.expanduser(record.workdir), ignore_errors=True)


@pytest.mark.parametrize("provider", ["vast"])  # RunPod has no spot pods since 2026 (runpodctl PR #267)
def test_resume_continues_a_preempted_spot_run_from_the_mirror(provider, request, capsys, tmp_path):
    emu = emulator_for(request, provider)
    name = "spot-resume"
    code, _, err = launch(capsys, tmp_path, provider, name, "--spot", "--stall-minutes", "30")
    assert code == 0, err
    first = runs.load(name)

    def mirrored_step():
        code, _, err = cli(capsys, "mirror", name)
        assert code == 0, err
        folder = newest_good(name)
        return folder if folder is not None and int(folder.name.split("_")[1]) >= 10 else None

    folder = wait_for(mirrored_step, 120, "a mirrored checkpoint at step >= 10")
    step = int(folder.name.split("_")[1])
    mirrored = [json.loads(x) for x in (mirror_root(name) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    before = [r for r in mirrored if r.get("kind") == "train" and r["step"] <= step]

    lose_the_pod(emu, first)
    code, out, err = cli(capsys, "status", name, "--json")
    assert code == 0 and json.loads(out)["state"].startswith("preempted")

    # The preempted instance still exists and may hold newer checkpoints: resume never ends it unread
    # (issue 41 point 5); ending it is the user's explicit step.
    code, out, err = cli(capsys, "resume", name)
    assert code == 2 and "still exists" in err and f"gpucli down {name}" in err
    assert cli(capsys, "down", name)[0] == 0
    code, out, err = cli(capsys, "resume", name)
    assert code == 0, err
    second = runs.load(name)
    assert second.instance_id != first.instance_id
    assert second.previous_instances == (first.instance_id,)
    assert f"resuming {name} from mirrored {folder.name}" in err

    def resumed_and_going():
        rows = rows_of(capsys, name)
        resumed = [r for r in rows if r.get("event") == "resumed"]
        after = [r for r in rows if r.get("kind") == "train" and resumed and r["step"] > resumed[-1]["step"]]
        return (rows, resumed) if len(after) >= 3 else None

    rows, resumed = wait_for(resumed_and_going, 120, "training to continue on the new pod")
    assert resumed[-1]["step"] == step
    # One curve: the rows from the first pod are still there, and the new pod's rows follow on.
    steps = [r["step"] for r in rows if r.get("kind") == "train"]
    assert steps[: len(before)] == [r["step"] for r in before]
    assert steps[len(before)] == step + 1
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # no stretch trained twice in the curve

    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
    kinds = [e.event for e in emu.ledger.events if e.pod_id == first.instance_id]
    assert "created" in kinds and "terminated" in kinds


def test_resume_without_a_mirror_refuses_unless_from_scratch(runpod_emulator, capsys, tmp_path):
    emu = runpod_emulator
    name = "no-mirror"
    code, _, err = launch(capsys, tmp_path, "runpod", name)  # a pod RunPod stopped (host gone, $0 balance)
    assert code == 0, err
    record = runs.load(name)
    lose_the_pod(emu, record)
    assert cli(capsys, "down", name)[0] == 0  # the stopped pod ended deliberately (resume never ends it unread)
    code, _, err = cli(capsys, "resume", name)
    assert code == 2 and "no mirrored checkpoint" in err and "--from-scratch" in err
    assert runs.load(name).instance_id == record.instance_id  # nothing rented
    code, _, err = cli(capsys, "resume", name, "--from-scratch")
    assert code == 0, err
    assert runs.load(name).instance_id != record.instance_id
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
    assert not mirror_root(name).joinpath("checkpoints").exists() or newest_good(name) is None


def test_recover_never_rents_after_the_run_finished(runpod_emulator, capsys, tmp_path):
    """The run finishes (max_steps), its watchdog stops the pod (RunPod: EXITED, as a pod RunPod stopped
    is): status says finished, and watch --recover stops watching instead of renting a new pod."""
    emu = runpod_emulator
    name = "done-run"
    code, _, err = launch(capsys, tmp_path, "runpod", name, "--steps", "8")
    assert code == 0, err
    record = runs.load(name)

    def finished_mirrored():
        code, _, err = cli(capsys, "mirror", name)
        assert code == 0, err
        path = mirror_root(name) / "metrics.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        return [r for r in rows if r.get("event") == "finished"] or None

    (finished,) = wait_for(finished_mirrored, 120, "the finished event in the mirror")
    assert finished["reason"] == "max_steps"
    # What the pod's watchdog does once the run is over (it would, a poll later): stop the pod.
    if not emu.ledger.ended(record.instance_id):
        emu.end_pod(record.instance_id, "stopped", "pod-key")
    assert emu.pods[record.instance_id].stopped  # EXITED to the API, like a pod RunPod stopped

    code, out, err = cli(capsys, "status", name, "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["state"] == "finished" and shown["finished_reason"] == "max_steps", shown
    assert runs.load(name).status == "finished" and runs.load(name).end_reason == "max_steps"
    code, out, _ = cli(capsys, "ls")
    assert code == 0 and "finished" in out and "preempted" not in out

    code, _, err = cli(capsys, "watch", name, "--recover", "--poll", "0.1")
    assert code == 0, err
    assert len(emu.ledger.created()) == 1  # nothing rented after the finish
    assert runs.load(name).instance_id == record.instance_id
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)


def test_a_finish_by_signal_is_not_the_runs_own_end(runpod_emulator, capsys, tmp_path):
    """A provider stopping the container sends SIGTERM too: a mirrored ``finished (signal)`` leaves the
    decision to the provider's state (here: preempted)."""
    from gpucli.run.oversee.runend import own_end

    emu = runpod_emulator
    name = "signalled"
    code, _, err = launch(capsys, tmp_path, "runpod", name)
    assert code == 0, err
    record = runs.load(name)
    root = mirror_root(name)
    root.mkdir(parents=True, exist_ok=True)
    (root / "metrics.jsonl").write_text(json.dumps({"kind": "event", "event": "finished", "reason": "signal",
                                                    "step": 3}) + "\n")
    assert own_end(record) is None
    lose_the_pod(emu, record)
    code, out, err = cli(capsys, "status", name, "--json")
    assert code == 0 and json.loads(out)["state"].startswith("preempted")
    # A finished event followed by a resume on a new pod is not an end either.
    (root / "metrics.jsonl").write_text(
        json.dumps({"kind": "event", "event": "finished", "reason": "max_cost", "step": 3}) + "\n"
        + json.dumps({"kind": "event", "event": "resumed", "step": 3}) + "\n")
    assert own_end(record) is None
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
