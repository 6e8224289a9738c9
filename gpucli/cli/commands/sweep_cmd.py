"""``gpucli sweep``: one run per combination of --set values, at most --parallel at once, under one --budget.

The sweep takes every option of ``gpucli launch`` (it resolves them with launch's own code: see
``run_cmds.RESOLVED``), and ``sweep status`` / ``sweep down`` act on a sweep by name.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import typing
from pathlib import Path
from typing import Any

import typer

from gpucli.cli.commands import run_cmds

sweep_app = typer.Typer(help="Start one run per combination of --set values (launch's options apply to each), at "
                        "most --parallel at once, under one --budget. This command drives the sweep: keep it "
                        "running (the runs it started go on without it); run it again to continue, `gpucli sweep "
                        "status NAME` to see it, `gpucli sweep down NAME` (or `gpucli down NAME`) to end it.",
                        rich_markup_mode=None, invoke_without_command=True)

# launch's options a sweep does not take: the task file is --task (a positional argument would read
# `status` as a file), the budget, name and --set mean the sweep's, a sweep's runs are detached (no
# mirroring watch), and --json is the sweep's own.
_NOT_TAKEN = {"task_file", "budget", "name", "set_", "mirror_checkpoints", "recover", "json_", "dry_run"}


def _sweep(ctx: typer.Context, **options: Any) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from gpucli.cli import render_runs as render
    from gpucli.cli import render_sweep
    from gpucli.errors import UsageError
    from gpucli.plan.catalog import load_catalog
    from gpucli.providers.registry import get_target
    from gpucli.run.life import lifecycle
    from gpucli.run.life import sweep as sweeps

    task_file: Path | None = options.pop("task")
    budget, run_budget, parallel = options.pop("budget"), options.pop("run_budget"), options.pop("parallel")
    name, sets, poll = options.pop("name"), list(options.pop("set_")), options.pop("poll")
    dry_run, json_ = options.pop("dry_run"), options.pop("json_")
    if poll <= 0:
        raise UsageError(f"--poll must be a positive number of seconds, got {poll}")
    own = task_file is not None or options["code"] is not None or options["run_cmd"] is not None
    axes, fixed = sweeps.parse_sets(sets, own=own)
    got: list[Any] = []
    token = run_cmds.RESOLVED.set(lambda req, task: got.append((req, task)))
    try:  # launch's own resolution of the options (task.yaml, your config, the defaults): nothing starts
        run_cmds.launch(task_file=task_file, budget=None, name=None,  # type: ignore[arg-type]  # None: no file
                        set_=[] if own else list(fixed),
                        mirror_checkpoints=False, recover=False, json_=False, dry_run=False, **options)
    finally:
        run_cmds.RESOLVED.reset(token)
    req, task = got[0]
    if task is not None and task.sweep:  # task.yaml's sweep: block, under the command line's --set
        axes, fixed = sweeps.with_file_sets(task.sweep, axes, fixed)
    on = options.get("on")
    if on is not None and parallel != 1:  # one machine: its trials one after another
        raise UsageError(f"--on {on}: the sweep's runs take turns on that machine; --parallel must be 1")
    if budget is None and get_target(req.provider).cloud:
        raise UsageError("a sweep on a cloud provider needs --budget (the dollars of all its runs together)")
    inputs = sweeps.launch_inputs(req, task)
    if on is not None:  # nothing rented: each run on that machine, at its price (its time is what the budget buys)
        inputs["on_machine"] = on
    if name is None:  # the same command line names the same sweep, so running it again continues it
        key = json.dumps([inputs, [[a.key, a.values] for a in axes], fixed, budget, run_budget], sort_keys=True,
                         default=str)
        name = f"sweep-{hashlib.sha256(key.encode()).hexdigest()[:8]}"
    catalog = load_catalog()
    if dry_run:
        if not axes:
            raise UsageError("a sweep needs a setting with several values", hint="e.g. --set training.learning_rate=3e-4,1e-3")
        draft = sweeps.Sweep(name=name, axes=axes, fixed=fixed, budget_usd=budget, run_budget_usd=run_budget,
                             parallel=parallel, launch=inputs, created_at="",
                             runs=tuple(sweeps.SweepRun(i, f"{name}-{i}", c)
                                        for i, c in enumerate(sweeps.combinations(axes), start=1)))
        plans = [(run, lifecycle.plan(catalog, *sweeps.run_request(draft, run, None))[0]) for run in draft.runs]
        render_sweep.planned(draft, plans, json_=json_)
        return
    sweep, continued = sweeps.create_or_continue(name, axes=axes, fixed=fixed, budget_usd=budget,
                                                 run_budget_usd=run_budget, parallel=parallel, launch=inputs)
    render.info(f"{'continuing' if continued else 'starting'} sweep {sweep.name}: {len(sweep.runs)} runs "
                f"({sweeps.describe_axes(sweep)}), at most {sweep.parallel} at once"
                + (f", ${sweep.budget_usd:g} in all" if sweep.budget_usd is not None else ""))
    for run in sweep.runs:  # every combination checked before anything is rented
        if run.state == "pending":
            lifecycle.plan(catalog, *sweeps.run_request(sweep, run, None))

    def launch_one(run: Any, cap_usd: float | None) -> None:
        req, task = sweeps.run_request(sweep, run, cap_usd)
        if sweep.launch.get("on_machine"):
            from gpucli.run.life import warm

            machine = warm.machine(str(sweep.launch["on_machine"]))
            prepared = warm.prepare_on(catalog, req, machine, task=task)
            with render.status_line() as step:  # the last run's processes may take a moment to exit
                warm.launch_on(prepared, machine, on_step=step, on_notice=render.notice, wait_free_s=120)
            return
        prepared = lifecycle.prepare(catalog, req, task=task)
        with render.status_line() as step:
            lifecycle.launch(prepared, on_step=step, on_notice=render.notice)

    done = sweeps.drive(sweep.name, launch_one, poll_s=poll, on_event=render.info)
    render_sweep.status(done, sweeps.views(done, ended_too=True), json_=json_)


def _signature() -> inspect.Signature:
    """launch's options (types resolved, for typer), less those a sweep does not take, and the sweep's."""
    hints = typing.get_type_hints(run_cmds.launch)
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    params += [p.replace(annotation=hints[p.name], kind=inspect.Parameter.KEYWORD_ONLY)
               for p in inspect.signature(run_cmds.launch).parameters.values() if p.name not in _NOT_TAKEN]
    own = {
        "task": (Path | None, typer.Option(None, "--task", metavar="TASK.yaml", help="Your own code's task file "
                                           "(as `gpucli launch TASK.yaml`); its sweep: block (NAME: [values]) "
                                           "is a --set of each.")),
        "set_": (list[str], typer.Option([], "--set", help="KEY=V1,V2,...: one run per combination of the values "
                                         "(a single value is the same for every run). Bundled trainer: its "
                                         "overrides, e.g. training.learning_rate=3e-4,1e-3; your own code: "
                                         "environment variables, e.g. LR=3e-4,1e-3 read as $LR.")),
        "budget": (float | None, typer.Option(None, "--budget", help="Dollars for the whole sweep (required on "
                                              "cloud providers): what is left, shared among the runs not yet "
                                              "started, is each new run's cap, held on its machine.")),
        "run_budget": (float | None, typer.Option(None, "--run-budget", help="No run's cap above this many "
                                                  "dollars.")),
        "parallel": (int, typer.Option(1, "--parallel", "-P", help="At most this many runs at once.")),
        "name": (str | None, typer.Option(None, "--name", help="The sweep's name (its runs are NAME-1, NAME-2, "
                                          "...); default: one derived from the options, so running the same "
                                          "command again continues the sweep.")),
        "poll": (float, typer.Option(30.0, "--poll", help="Seconds between checks of the running runs.")),
        "dry_run": (bool, typer.Option(False, "--dry-run", help="Print each run's plan, and do nothing.")),
        "json_": (bool, typer.Option(False, "--json", help="Print JSON.")),
    }
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=t)
               for k, (t, d) in own.items()]
    return inspect.Signature(params)


_sweep.__signature__ = _signature()  # type: ignore[attr-defined]
_sweep.__annotations__ = {p.name: p.annotation for p in _sweep.__signature__.parameters.values()}  # type: ignore[attr-defined]
sweep_app.callback(invoke_without_command=True)(_sweep)


@sweep_app.command("status")
def status(name: str = typer.Argument(..., help="The sweep's name."),
           json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """One table of the sweep's runs: settings, state, step, loss, val loss, $, ETA; the best marked."""
    from gpucli.cli import render_sweep
    from gpucli.run.life import sweep as sweeps

    sweep = sweeps.load(name)
    render_sweep.status(sweep, sweeps.views(sweep, ended_too=True), json_=json_)


@sweep_app.command("down")
def down(name: str = typer.Argument(..., help="The sweep's name."),
         json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """End the sweep: no more runs start, and every running one is stopped (as `gpucli down`)."""
    from gpucli.cli import render_runs as render
    from gpucli.cli import render_sweep
    from gpucli.run.life import sweep as sweeps
    from gpucli.run.oversee import control

    ended = sweeps.end(name, lambda run: control.down(run, on_step=render.info, on_notice=render.notice))
    render_sweep.ended(name, ended, json_=json_)


def register(app: typer.Typer) -> None:
    app.add_typer(sweep_app, name="sweep")
