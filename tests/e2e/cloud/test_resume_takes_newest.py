"""Resume never destroys the newest checkpoint (issue 41 point 5), against the RunPod emulator.

A pod stopped by its cap or a stall keeps its disk, and on it checkpoints newer than the mirror:
"retained until Pod deleted", and DELETE destroys it (runpod/docs pods/pricing.mdx L47; openapi
deletePod). ``gpucli resume`` copies the old pod's newest checkpoint home (sha256-verified) before it
ends the pod; a pod that exists but cannot be read is never ended by the resume.
"""

from __future__ import annotations

import json
import os
import signal

from gpucli.run.files.harvest import newest_good
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, cli, emulator_for, launch, wait_for


def _step(folder) -> int:
    return int(folder.name.split("_")[1])


def test_resume_takes_the_old_pods_newest_checkpoint_before_ending_it(request, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "3600")  # the pod stays up after its trainer stops
    emu = emulator_for(request, "runpod")
    name = "newest"
    code, _, err = launch(capsys, tmp_path, "runpod", name, "--stall-minutes", "30")
    assert code == 0, err
    first = runs.load(name)
    def mirrored():
        assert cli(capsys, "mirror", name)[0] == 0
        return newest_good(name)

    wait_for(mirrored, 150, "a first mirrored checkpoint")
    early = _step(newest_good(name))

    def pod_checkpoint_past_mirror():
        code, out, _ = cli(capsys, "status", name, "--json")
        return code == 0 and (json.loads(out).get("step") or 0) >= early + 12

    wait_for(pod_checkpoint_past_mirror, 150, "checkpoints on the pod newer than the mirror")
    os.killpg(first.pid, signal.SIGKILL)  # the trainer is gone; its pod, with its disk, is not
    code, out, err = cli(capsys, "resume", name)
    assert code == 0, err
    assert "the old pod's newest checkpoint (step" in err
    taken = _step(newest_good(name))
    assert taken > early  # the pod's newest came home: the resume continues from it, not from the old mirror
    assert f"from mirrored step_{taken:06d}" in err or f"from mirrored {newest_good(name).name}" in err
    events = [e.event for e in emu.ledger.events if e.pod_id == first.instance_id]
    assert events[-1] == "terminated"  # ended, after the copy
    assert cli(capsys, "down", name)[0] == 0
    assert_nothing_running(emu)


def test_resume_never_ends_a_pod_it_cannot_read(request, capsys, tmp_path):
    emu = emulator_for(request, "runpod")
    name = "keptpod"
    code, _, err = launch(capsys, tmp_path, "runpod", name)
    assert code == 0, err
    first = runs.load(name)
    emu.end_pod(first.instance_id, "stopped", "watchdog")  # stopped by its cap: disk kept, SSH gone
    code, out, err = cli(capsys, "resume", name)
    assert code == 2
    assert "still exists" in err and "ends it only after copying" in err and "Traceback" not in err
    assert emu.ledger.ended(first.instance_id)[-1].event == "stopped"  # not terminated
    assert runs.load(name).instance_id == first.instance_id and len(emu.ledger.created()) == 1
    assert cli(capsys, "down", name)[0] == 0  # the deliberate way to end it
    assert_nothing_running(emu)
