"""``gpucli sweep --on RUN``: the sweep's runs take turns on the machine a run has (this one, and a real
sshd), nothing rented: each run in its own folder beside RUN's, one after another, at the machine's price,
each under its share of the sweep's budget; --parallel above 1 is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from gpucli.runs import records as runs
from gpucli.runs.machines import machine_root
from tests.e2e.lifecycle.test_sweep import FAST, finish, most_at_once
from tests.e2e.warm.test_launch_on import _ended, where  # noqa: F401 - the machines, local and ssh
from tests.support.cli import cli, wait_for

ROOT = Path(__file__).resolve().parents[3]


def driver(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gpucli", "sweep", "--poll", "1", *FAST, *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_sweep_takes_turns_on_a_warm_machine(capsys, tmp_path, where):  # noqa: F811
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "base", "--price", "0.36", *where, *FAST,
                         "--steps", "3")
    assert code == 0, err
    wait_for(lambda: _ended(capsys, "base"), 240, "the base run to end")
    base = runs.load("base")

    out, err = finish(driver("--on", "base", "--name", "turns", "--set", "training.learning_rate=0.0003,0.001",
                             "--steps", "4", "--budget", "0.05"))
    assert "sweep turns: 2 runs" in out
    names = ["turns-1", "turns-2"]
    lrs = set()
    for name in names:
        r = runs.load(name)
        assert r.status == "finished", (name, r.status, r.end_reason)
        assert r.provider == base.provider and machine_root(r) == "base"  # nothing rented: the base's machine
        assert Path(r.workdir).parent == Path(base.workdir).parent
        assert r.limits.price_per_hour_usd == 0.36  # the machine's price: its time is what the budget buys
        assert r.limits.budget_usd is not None and r.limits.budget_usd <= 0.05
        if base.ssh is not None:
            assert r.ssh.port == base.ssh.port
        lrs.add(yaml.safe_load((Path(r.workdir) / "run.yaml").read_text())["training"]["learning_rate"])
    assert lrs == {0.0003, 0.001}
    assert most_at_once(names) == 1  # one after another
    # the money rule: what the runs spent of the machine's time stays within the sweep's budget (a finished
    # run's unspent cap goes back to the next one's share)
    spent = [runs.load(n).cost_usd for n in names]
    assert all(c is not None and c > 0 for c in spent) and sum(spent) <= 0.05 + 1e-9

    proc = driver("--on", "base", "--name", "wide", "--set", "training.learning_rate=0.0003,0.001", "--parallel", "2")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "--parallel must be 1" in err and "Traceback" not in err
