"""Sweeps on this machine with the real trainer: every combination runs with its settings, never more
than --parallel at once, the sweep's budget holds when the runs cost different amounts (their caps are
enforced by their own watchdogs), running the same command again continues, and `down` of the sweep
ends every run. The driver runs as `gpucli sweep` does in a terminal: a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from gpucli.providers.registry import open_host
from gpucli.run.life import sweep as sweeps
from gpucli.runs import records as runs
from tests.support.cli import FAST_TRAINER, cli, wait_for

ROOT = Path(__file__).resolve().parents[3]
FAST = [a for a in FAST_TRAINER if a not in ("--steps", "400")] + ["--set", "data.max_bytes=200000"]


def driver(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gpucli", "sweep", "--profile", "cpu", "--poll", "1", *FAST, *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout_s: float = 540) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]
    return out, err


def most_at_once(names: list[str]) -> int:
    """The most runs alive at one moment, from their records (started, and ended when seen ended)."""
    spans = []
    for name in names:
        r = runs.load(name)
        spans.append((runs.parse_iso(r.created_at), runs.parse_iso(r.ended_at)))
    return max(sum(1 for s, e in spans if s <= t and (e is None or t < e)) for t, _ in spans)


def test_sweep_runs_every_combination_two_at_a_time_and_continues(capsys):
    args = ["--name", "grid", "--set", "training.learning_rate=0.0003,0.001", "--set", "model.n_layers=1,2",
            "--steps", "6", "--parallel", "2", "--price", "0.36", "--budget", "0.05"]
    out, err = finish(driver(*args))
    assert "sweep grid: 4 runs" in out
    names = [f"grid-{i}" for i in range(1, 5)]
    seen = set()
    for name in names:
        record = runs.load(name)
        assert record.status == "finished", (name, record.status, record.end_reason)
        cfg = yaml.safe_load((Path(os.path.expanduser(record.workdir)) / "run.yaml").read_text())
        seen.add((cfg["training"]["learning_rate"], cfg["model"]["n_layers"]))
        assert record.limits.budget_usd is not None and record.limits.budget_usd <= 0.05
    assert seen == {(0.0003, 1), (0.0003, 2), (0.001, 1), (0.001, 2)}
    assert most_at_once(names) <= 2
    # The first two runs shared the budget with the two not yet started: $0.05 / 4 each.
    sweep = sweeps.load("grid")
    assert [r.cap_usd for r in sweep.runs[:2]] == [0.0125, 0.0125]
    assert sum(runs.load(n).cost_usd or 0 for n in names) <= 0.05

    code, out, err = cli(capsys, "sweep", "status", "grid", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert [r["run"] for r in status["runs"]] == names and status["best"] in names
    assert sum(r["best"] for r in status["runs"]) == 1
    assert all(r["state"] == "finished" and r["step"] == 6 for r in status["runs"])
    code, out, err = cli(capsys, "sweep", "status", "grid")
    assert code == 0 and "* " + status["best"] in out and "val loss" in out

    # The same command again continues the sweep: nothing is left to start, and no run is started twice.
    finish(driver(*args))
    assert sorted(p.stem for p in runs.runs_dir().glob("grid-*.json")) == names


def test_the_sweep_budget_holds_when_runs_cost_different_amounts():
    """$0.001 a second and $0.12 for four runs that would train far longer: each run's cap is what is
    left, shared among the runs not started; each trainer stops itself at its cap (its cost metered on
    the host), the depths make the runs cost different amounts, and the whole sweep stays within $0.12."""
    finish(driver("--name", "tight", "--set", "model.n_layers=1,2", "--set", "training.learning_rate=0.001,0.002",
                  "--steps", "20000", "--parallel", "2", "--price", "3.6", "--budget", "0.12"))
    sweep = sweeps.load("tight")
    launched = [r for r in sweep.runs if r.state == "launched"]
    costs = [runs.load(r.name).cost_usd or 0.0 for r in launched]
    caps = [r.cap_usd for r in launched]
    assert len(launched) >= 3 and all(r.state in ("launched", "skipped") for r in sweep.runs), sweep.runs
    assert caps[:2] == [0.03, 0.03]  # $0.12 shared by four; later runs also get what earlier ones left
    assert all(c is not None for c in caps) and sum(caps) <= 0.12 + 1e-9 + sum(
        cap - cost for cap, cost in zip(caps[:2], costs[:2], strict=True)), (caps, costs)
    # A trainer checks its cost at each step: it may pass its cap by one step's worth.
    assert all(cost <= cap + 0.002 for cost, cap in zip(costs, caps, strict=True)), (costs, caps)
    assert sum(costs) <= 0.12 + 0.002 * len(costs), (costs, caps)
    assert len({round(c, 3) for c in costs}) > 1  # the runs did cost different amounts


def test_down_of_the_sweep_ends_every_run_and_starts_no_more(capsys):
    proc = driver("--name", "long", "--set", "training.learning_rate=0.001,0.002,0.003", "--steps", "400",
                  "--parallel", "2")
    try:
        def two_training():
            active = [n for n in ("long-1", "long-2") if (runs.runs_dir() / f"{n}.json").exists()]
            return len(active) == 2 and all(runs.load(n).status == "running" for n in active)

        wait_for(two_training, 240, "two runs of the sweep")
        code, out, err = cli(capsys, "down", "long", "--json")
        assert code == 0, err
        assert sorted(json.loads(out)["runs_ended"]) == ["long-1", "long-2"]
        proc.wait(timeout=120)  # the driver sees the end and stops
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    for name in ("long-1", "long-2"):
        record = runs.load(name)
        # stopped; or failed, when the signal came while the trainer was still preparing its data
        assert record.status in ("stopped", "failed"), (name, record.status)
        with open_host(record) as host:
            assert not host.is_running(record.pid)
    assert not (runs.runs_dir() / "long-3.json").exists()
    sweep = sweeps.load("long")
    assert sweep.ended and sweep.runs[2].state == "skipped"
    code, out, err = cli(capsys, "sweep", "--name", "long", "--profile", "cpu")
    assert code != 0 and "was ended" in err


def test_a_sweep_over_ssh_puts_each_run_in_its_own_folder_on_the_host(capsys, tmp_path, sshd, client_key):
    code, out, err = cli(capsys, "sweep", "--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}",
                         "--identity", str(client_key[0]), "--python", sys.executable, "--workdir",
                         str(tmp_path / "host"), "--profile", "cpu", "--name", "viassh", "--poll", "1", *FAST,
                         "--set", "training.learning_rate=0.0005,0.002", "--steps", "5", "--parallel", "2", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert [r["state"] for r in status["runs"]] == ["finished", "finished"] and status["best"] in ("viassh-1", "viassh-2")
    for i, lr in ((1, 0.0005), (2, 0.002)):
        record = runs.load(f"viassh-{i}")
        assert record.provider == "ssh" and record.workdir == str(tmp_path / "host" / f"viassh-{i}")
        cfg = yaml.safe_load((tmp_path / "host" / f"viassh-{i}" / "run.yaml").read_text())
        assert cfg["training"]["learning_rate"] == lr
