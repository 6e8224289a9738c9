"""Sweeps without machines: the settings, the combinations, and the money rule driven through real run
records whose runs finish in any order at any cost (the runs themselves: tests/e2e/lifecycle/test_sweep.py
and tests/e2e/cloud/test_sweep_cloud.py)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from gpucli.errors import UsageError
from gpucli.run.inputs.launch import LaunchRequest
from gpucli.run.life import sweep as sweeps
from gpucli.runs import records as runs
from gpucli.runs.limits import Limits
from gpucli.runs.records import RunRecord


def test_values_split_at_top_level_commas_only():
    assert sweeps.split_values("3e-4,1e-3") == ["3e-4", "1e-3"]
    assert sweeps.split_values("[a,b],[c]") == ["[a,b]", "[c]"]
    assert sweeps.split_values("'x,y',z") == ["'x,y'", "z"]
    assert sweeps.split_values("[]") == ["[]"]


def test_axes_and_fixed_settings():
    axes, fixed = sweeps.parse_sets(["training.learning_rate=0.0003,0.001", "model.n_layers=12,16",
                                     "training.eval_prompts=[]"])
    assert axes == (sweeps.Axis("training.learning_rate", ("0.0003", "0.001")), sweeps.Axis("model.n_layers", ("12", "16")))
    assert fixed == ("training.eval_prompts=[]",)
    combos = sweeps.combinations(axes)
    assert len(combos) == 4 and len(set(combos)) == 4
    assert combos[0] == (("training.learning_rate", "0.0003"), ("model.n_layers", "12"))
    assert combos[1] == (("training.learning_rate", "0.0003"), ("model.n_layers", "16"))


@pytest.mark.parametrize("bad, words", [("lr", "KEY=VALUE"), ("a=1,,2", "empty"), ("a=1,1", "twice"),
                                        ("1LR=1,2", "variable name")])
def test_bad_settings_are_one_line(bad, words):
    with pytest.raises(UsageError, match=words):
        sweeps.parse_sets([bad], own=True)
    with pytest.raises(UsageError, match="twice"):
        sweeps.parse_sets(["a=1,2", "a=3"])
    # the trainer's copy of the caps would override each run's cap (and with it the sweep's budget)
    with pytest.raises(UsageError, match="limits itself"):
        sweeps.parse_sets(["limits.budget_usd=1000"])


def test_cap_is_the_remaining_budget_shared_among_the_runs_not_started():
    assert sweeps.next_cap(10.0, None, 0.0, 4) == 2.5
    assert sweeps.next_cap(10.0, None, 7.0, 2) == 1.5
    assert sweeps.next_cap(10.0, 1.0, 0.0, 2) == 1.0  # --run-budget
    assert sweeps.next_cap(10.0, None, 10.0, 1) is None  # nothing left
    assert sweeps.next_cap(None, None, 5.0, 3) == math.inf  # no budget: no dollar cap
    assert sweeps.next_cap(None, 2.0, 5.0, 3) == 2.0


def _request() -> dict:
    return LaunchRequest(profile="cpu", provider="local", extra=("--training.tcf=false",),
                         limits=Limits(max_steps=5, price_per_hour_usd=3.6)).to_json()


def _sweep(budget: float | None, parallel: int, values: int = 5, **kw) -> sweeps.Sweep:
    axes = (sweeps.Axis("training.learning_rate", tuple(str(0.001 * (i + 1)) for i in range(values))),)
    sweep, continued = sweeps.create_or_continue("sw", axes=axes, fixed=("training.log_interval=1",),
                                                 budget_usd=budget, run_budget_usd=kw.get("run_budget"),
                                                 parallel=parallel, launch=_request())
    assert not continued
    return sweep


def _record(name: str, status: str, cost: float | None) -> RunRecord:
    return RunRecord(name=name, provider="local", created_at=runs.now_iso(), profile="cpu", phase="fast",
                     model="tiny", n_gpus=1, gpu=None, workdir=f"/nowhere/{name}", status=status, cost_usd=cost,
                     limits=Limits(price_per_hour_usd=None))


def test_each_run_gets_its_settings_name_folder_and_cap():
    sweep = _sweep(4.0, 2)
    sweep = dataclasses.replace(sweep, launch={**sweep.launch, "request": {**sweep.launch["request"], "workdir": "/w"}})
    req, task = sweeps.run_request(sweep, sweep.runs[2], 0.8)
    assert task is None and req.name == "sw-3" and req.workdir == "/w/sw-3"
    assert req.limits.budget_usd == 0.8 and req.limits.max_steps == 5
    assert req.extra[-1] == "training.learning_rate=0.003"


def test_own_code_settings_are_exported_in_its_command(tmp_path):
    from gpucli.runs.task import Task

    axes, fixed = sweeps.parse_sets(["LR=0.1,0.2", "MODE=fast"], own=True)
    inputs = sweeps.launch_inputs(LaunchRequest(profile="cpu"), Task(run="python train.py", code=tmp_path))
    sweep, _ = sweeps.create_or_continue("own", axes=axes, fixed=fixed, budget_usd=None, run_budget_usd=None,
                                         parallel=1, launch=inputs)
    _, task = sweeps.run_request(sweep, sweep.runs[1], None)
    assert task is not None and task.run == "export MODE=fast; export LR=0.2; python train.py" and task.name == "own-2"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(costs=hs.lists(hs.floats(0.0, 3.0), min_size=5, max_size=5), parallel=hs.integers(1, 4),
       order=hs.permutations(range(5)), budget=hs.floats(0.5, 8.0))
def test_no_order_of_finishing_runs_spends_more_than_the_budget(tmp_path_factory, monkeypatch, costs, parallel,
                                                                order, budget):
    """Runs that cost different amounts (never more than their caps, which the trainer and watchdog hold)
    finish in any order: at every moment the finished runs' spending and the running runs' caps stay
    within the sweep's budget, at most --parallel run at once, and every combination is run or skipped."""
    monkeypatch.setenv("GPUCLI_HOME", str(tmp_path_factory.mktemp("home")))
    sweep = _sweep(budget, parallel)
    caps: dict[str, float] = {}

    def launch_one(run, cap):
        caps[run.name] = cap
        runs.save(_record(run.name, "running", None))

    finishing = [f"sw-{i + 1}" for i in order]
    for _ in range(30):
        sweep, more = sweeps.step(sweep, launch_one, on_event=lambda _: None, live=False)
        rows = sweeps.views(sweep, live=False)
        assert sum(v.running for v in rows) <= parallel
        assert sum(v.committed_usd for v in rows) <= budget + 1e-9
        if not more:
            break
        # the next run in `order` that is running finishes, having spent some of its cap
        name = next(n for n in finishing if any(v.run.name == n and v.running for v in rows))
        finishing.remove(name)
        runs.save(_record(name, "finished", min(caps[name], costs[int(name.split("-")[1]) - 1])))
    else:
        raise AssertionError("the sweep never ended")
    rows = sweeps.views(sweep, live=False)
    assert {v.state for v in rows} <= {"finished", "skipped"}
    spent = sum(v.committed_usd for v in rows)
    assert spent <= budget + 1e-9
    assert all(c <= budget for c in caps.values())


def test_the_same_sweep_twice_continues_and_a_second_driver_is_refused():
    _sweep(2.0, 1)
    again, continued = sweeps.create_or_continue("sw", axes=(), fixed=(), budget_usd=None, run_budget_usd=None,
                                                 parallel=1, launch={})
    assert continued and len(again.runs) == 5 and again.budget_usd == 2.0
    with pytest.raises(UsageError, match="other settings"):
        sweeps.create_or_continue("sw", axes=(sweeps.Axis("x", ("1", "2")),), fixed=(), budget_usd=2.0,
                                  run_budget_usd=None, parallel=1, launch={})
    with sweeps.driving("sw"), pytest.raises(UsageError, match="another gpucli process"), sweeps.driving("sw"):
        pass


def test_a_launch_that_died_before_its_record_is_tried_again_and_a_failed_one_is_said():
    sweep = _sweep(1.0, 2, values=3)
    sweeps.save(sweep.with_run(dataclasses.replace(sweep.runs[0], state="launching", cap_usd=0.3)))
    launched = []

    def launch_one(run, cap):
        launched.append(run.name)
        if run.name == "sw-2":
            raise UsageError("no offer matches")
        runs.save(_record(run.name, "running", None))

    sweep, more = sweeps.step(sweeps.load("sw"), launch_one, on_event=lambda _: None, live=False)
    assert launched == ["sw-1", "sw-2", "sw-3"] and more
    assert [r.state for r in sweep.runs] == ["launched", "failed", "launched"]
    assert sweep.runs[1].error == "no offer matches"
    record = json.loads((sweeps.sweeps_dir() / "sw.json").read_text())
    assert record["runs"][1]["state"] == "failed"
    # Running the sweep again tries a launch that was refused before it made anything.
    again, _ = sweeps.create_or_continue("sw", axes=(), fixed=(), budget_usd=None, run_budget_usd=None,
                                         parallel=2, launch={})
    assert [r.state for r in again.runs] == ["launched", "pending", "launched"] and again.runs[1].error is None


def test_down_of_the_sweep_stops_its_runs_and_starts_no_more():
    sweep = _sweep(1.0, 1, values=3)
    sweep, _ = sweeps.step(sweep, lambda run, cap: runs.save(_record(run.name, "running", None)),
                           on_event=lambda _: None, live=False)
    downed = []

    def down(name):
        downed.append(name)
        runs.save(runs.load(name).with_(status="stopped", cost_usd=0.01))

    assert sweeps.end("sw", down) == ["sw-1"] and downed == ["sw-1"]
    after = sweeps.load("sw")
    assert after.ended and [r.state for r in after.runs] == ["launched", "skipped", "skipped"]
    # a driver that still holds the old record starts nothing and keeps the end
    sweep2, more = sweeps.step(sweep, lambda run, cap: pytest.fail("launched after down"), on_event=lambda _: None,
                               live=False)
    assert not more
    sweeps.save(sweep2)
    assert sweeps.load("sw").ended


def test_a_task_files_sweep_block_is_a_set_of_each_under_the_command_line(tmp_path):
    from gpucli.runs.task import TaskError, load_task

    task_file = tmp_path / "task.yaml"
    task_file.write_text("run: python train.py\nsweep:\n  LR: [0.0003, 0.001]\n  DEPTH: [12, 16]\n  MODE: fast\n")
    task = load_task(task_file)
    assert task.sweep == (("LR", ("0.0003", "0.001")), ("DEPTH", ("12", "16")), ("MODE", ("fast",)))
    axes, fixed = sweeps.with_file_sets(task.sweep, *sweeps.parse_sets(["DEPTH=4,8,12"], own=True))
    assert axes == (sweeps.Axis("LR", ("0.0003", "0.001")), sweeps.Axis("DEPTH", ("4", "8", "12")))
    assert fixed == ("MODE=fast",)
    task_file.write_text("run: x\nsweep:\n  GPUCLI_X: [1, 2]\n")
    with pytest.raises(TaskError, match="sweep.GPUCLI_X"):
        load_task(task_file)
    task_file.write_text("run: x\nsweep: [1, 2]\n")
    with pytest.raises(TaskError, match="sweep: expected a mapping"):
        load_task(task_file)
