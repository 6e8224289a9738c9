"""``gpucli down`` while a launch waits for its pod's SSH (issue 41 point 11): the launch notices and
ends everything it made; it never goes on to the next offer and leaves a pod billing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import TINY, assert_nothing_running, emulator_for
from tests.support.cli import cli, wait_for
from tests.support.emulators import PodBehaviour


def test_down_during_the_ssh_wait_ends_every_pod_the_launch_made(request, capsys, tmp_path):
    emu = emulator_for(request, "runpod")
    emu.behaviours.extend([PodBehaviour(stuck=True)] * 3)  # SSH never comes on any offer
    name = "downwait"
    launch = subprocess.Popen(
        [sys.executable, "-m", "gpucli", "launch", "--provider", "runpod", "--profile", "rtx4090", "--phase", "fast",
         "--name", name, "--workdir", str(tmp_path / "pod" / name), "--python", sys.executable,
         "--ready-timeout", "300", *TINY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        wait_for(lambda: (lambda r: r if r is not None and r.instance_id else None)(
            runs.load(name) if (runs.runs_dir() / f"{name}.json").exists() else None), 120, "the pod id recorded")
        time.sleep(0.5)
        code, out, err = cli(capsys, "down", name)
        assert code == 0, err
        _, launch_err = launch.communicate(timeout=180)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode != 0
    assert "ended (gpucli down) while its pod was starting" in launch_err and "Traceback" not in launch_err
    assert len(emu.ledger.created()) == 1  # no next offer was tried
    assert_nothing_running(emu)
    assert runs.load(name).status in ("stopped", "failed")
