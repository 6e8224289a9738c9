"""A sweep on RunPod and vast.ai (their emulators; each pod a real sshd running the real trainer): one pod
per combination, at most two at once, each run's cap from the sweep's budget (the run that finished
early leaves its unspent money to the one started after it), and `gpucli sweep down` ends the pods that
are running and starts no more. The driver is a process of its own, as in a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucli.run.life import sweep as sweeps
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import TINY, assert_nothing_running, emulator_for
from tests.support.cli import cli, wait_for

ROOT = Path(__file__).resolve().parents[3]
SMALL = [a for a in TINY if a not in ("--steps", "400")]


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_cloud_sweep_parallel_budget_and_down(provider, request, capsys, tmp_path):
    emu = emulator_for(request, provider)
    name = f"sw-{provider}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(
        [sys.executable, "-m", "gpucli", "sweep", "--provider", provider, "--profile", "rtx4090", "--name", name,
         "--workdir", str(tmp_path / "pod"), "--python", sys.executable, "--ready-timeout", "30", "--poll", "1",
         *SMALL, "--set", "training.max_steps=8,3000,3001", "--parallel", "2", "--budget", "0.9"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def third_running():
            path = runs.runs_dir() / f"{name}-3.json"
            return path.exists() and runs.load(f"{name}-3").status == "running"

        wait_for(third_running, 400, "the third run (after the first finished)")
        first, second = runs.load(f"{name}-1"), runs.load(f"{name}-2")
        assert first.status == "finished" and second.status == "running"
        sweep = sweeps.load(name)
        caps = [r.cap_usd for r in sweep.runs]
        # $0.90 for three: the first two get a third each; the third gets what is left after the first
        # one's spending and the second one's cap, more than a third since the first stopped early.
        assert caps[:2] == [0.3, 0.3]
        assert first.cost_usd is not None and first.cost_usd < 0.3
        assert caps[2] == pytest.approx(0.9 - first.cost_usd - 0.3, abs=0.001) and caps[2] > 0.3
        for i, cap in enumerate(caps, start=1):
            assert runs.load(f"{name}-{i}").limits.budget_usd <= cap + 1e-9
        # One pod per combination, labelled with its run, and never more than two alive at once.
        created = emu.ledger.created()
        assert sorted(p.label for p in created) == [f"gpucli-{name}-{i}" for i in (1, 2, 3)]
        assert first.ended_at is not None and first.ended_at <= runs.load(f"{name}-3").created_at

        code, out, err = cli(capsys, "sweep", "down", name, "--json")
        assert code == 0, err
        assert sorted(json.loads(out)["runs_ended"]) == [f"{name}-2", f"{name}-3"]
        driver.wait(timeout=120)
        assert driver.returncode == 0, driver.stderr.read() if driver.stderr else ""
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    code, out, err = cli(capsys, "down", f"{name}-1")  # the finished run's stopped pod (it keeps its disk)
    assert code == 0, err
    assert all(runs.load(f"{name}-{i}").status in ("stopped", "finished") for i in (1, 2, 3))
    total = sum(runs.load(f"{name}-{i}").cost_usd or 0.0 for i in (1, 2, 3))
    assert total <= 0.9
    assert_nothing_running(emu)
