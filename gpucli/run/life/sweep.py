"""Sweeps: one run per combination of settings, at most N at once, under one budget for them all.

``gpucli sweep --set training.learning_rate=3e-4,1e-3 --set model.n_layer=12,16 --budget 40 --parallel 2``
is four runs, each an ordinary run (``gpucli status``, ``tail``, ``fetch-best`` work on it) named
``<sweep>-1`` ... ``<sweep>-4``. The sweep's record, ``<GPUCLI_HOME>/sweeps/<name>.json``, holds the
combinations, which of them were launched, and each one's dollar cap.

The money rule, which no order of finishing runs can break: a new run's cap is at most the sweep's
budget less what finished runs spent and less what running runs may still spend (their caps, or
what they have cost when that is more), shared among the combinations not yet started. Each cap is
held on the run's own machine (its trainer and watchdog stop at it), so the sum of every run's
spending stays within the sweep's budget even when this machine goes away.

The driver (:func:`drive`) runs in the foreground of ``gpucli sweep`` and starts a run whenever a
slot is free. The runs it started are detached and keep going without it; the runs not yet started
wait until the same command is run again, which continues the sweep (one driver per sweep at a time:
a lock file beside the record).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import json
import math
import os
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucli.errors import GpucliError, NotFoundError, UsageError
from gpucli.run.inputs.launch import LaunchRequest
from gpucli.run.oversee.control import live_status
from gpucli.run.starting.jobs.own import task_from_json, task_to_json
from gpucli.run.watch.monitor import RunStatus
from gpucli.runs import records as runs
from gpucli.runs.task import Task, with_overrides
from gpucli.settings import home, write_private

# A cap below a cent cannot pay for a machine's start; the combination waits for money to come back.
MIN_CAP_USD = 0.01
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_STATES = ("pending", "launching", "launched", "failed", "skipped")


@dataclass(frozen=True)
class Axis:
    """One ``--set KEY=V1,V2,...``: the values a setting takes across the sweep."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class SweepRun:
    index: int  # 1-based: the run is named <sweep>-<index>
    name: str
    settings: tuple[tuple[str, str], ...]  # this combination's (key, value) pairs
    state: str = "pending"  # pending | launching | launched | failed (to launch) | skipped (no budget left)
    cap_usd: float | None = None  # the dollar cap it was launched with (None: no dollar cap)
    error: str | None = None  # why it failed to launch or was skipped


@dataclass(frozen=True)
class Sweep:
    name: str
    axes: tuple[Axis, ...]
    fixed: tuple[str, ...]  # --set KEY=VALUE with one value: the same for every run
    budget_usd: float | None  # the whole sweep's
    run_budget_usd: float | None  # --run-budget: no run's cap above this
    parallel: int
    launch: Mapping[str, Any]  # what a run record keeps as ``launch`` (the request; your code's task)
    runs: tuple[SweepRun, ...]
    created_at: str
    ended: bool = False  # `gpucli sweep down`: no more runs are started

    def with_run(self, run: SweepRun) -> Sweep:
        return dataclasses.replace(self, runs=tuple(run if r.index == run.index else r for r in self.runs))


@dataclass(frozen=True)
class RunView:
    """A combination as it stands now: its run's state, and what it counts against the budget."""

    run: SweepRun
    state: str  # pending | running | finished | failed | stopped | skipped | failed to launch | ...
    status: RunStatus | None
    committed_usd: float  # spent (over), or what it may still spend at its cap (running)
    running: bool = False  # its record is active (or its launch is under way): it holds a slot and its cap


# -- settings -----------------------------------------------------------------------------------------

def split_values(text: str) -> list[str]:
    """``3e-4,1e-3`` -> two values; commas inside brackets or quotes stay (``[a,b]`` is one value)."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def parse_sets(sets: tuple[str, ...] | list[str], *, own: bool = False) -> tuple[tuple[Axis, ...], tuple[str, ...]]:
    """The sweep's axes (a ``--set`` with several values) and its fixed settings (one value). Your own
    code's settings are environment variables (``--set LR=3e-4,1e-3`` is ``$LR`` in your --run)."""
    axes: list[Axis] = []
    fixed: list[str] = []
    for item in sets:
        key, eq, value = item.removeprefix("--").partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE[,VALUE...]")
        if own and not _ENV_NAME.match(key):
            raise UsageError(f"--set {item!r}: your own code gets its settings as environment variables; "
                             f"{key!r} is not a variable name", hint="e.g. --set LR=3e-4,1e-3 and $LR in --run")
        if key.startswith("limits."):  # the trainer's own copy of the caps: the sweep sets each run's
            raise UsageError(f"--set {key}: a sweep sets each run's limits itself",
                             hint="--budget (the whole sweep), --run-budget, --hours, --price")
        if any(a.key == key for a in axes) or any(f.partition("=")[0] == key for f in fixed):
            raise UsageError(f"--set {key} is given twice", hint="list its values once: --set KEY=V1,V2")
        values = split_values(value)
        if any(not v for v in values):
            raise UsageError(f"--set {item!r}: an empty value")
        if len(set(values)) != len(values):
            raise UsageError(f"--set {item!r}: a value is listed twice")
        if len(values) > 1:
            axes.append(Axis(key, tuple(values)))
        else:
            fixed.append(f"{key}={values[0]}")
    return tuple(axes), tuple(fixed)


def with_file_sets(file_sets: tuple[tuple[str, tuple[str, ...]], ...], axes: tuple[Axis, ...],
                   fixed: tuple[str, ...]) -> tuple[tuple[Axis, ...], tuple[str, ...]]:
    """task.yaml's ``sweep:`` under the command line's --set (a key given on both: the command line's)."""
    given = {a.key for a in axes} | {f.partition("=")[0] for f in fixed}
    file_axes = tuple(Axis(k, v) for k, v in file_sets if k not in given and len(v) > 1)
    file_fixed = tuple(f"{k}={v[0]}" for k, v in file_sets if k not in given and len(v) == 1)
    return file_axes + axes, file_fixed + fixed


def combinations(axes: tuple[Axis, ...]) -> list[tuple[tuple[str, str], ...]]:
    """Every combination, the last axis changing fastest (the order the runs are numbered in)."""
    return [tuple(zip([a.key for a in axes], values, strict=True))
            for values in itertools.product(*(a.values for a in axes))]


def settings_line(settings: tuple[tuple[str, str], ...]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings)


# -- the money rule (pure) ------------------------------------------------------------------------------

def next_cap(budget_usd: float | None, run_budget_usd: float | None, committed_usd: float,
             pending: int) -> float | None:
    """The dollar cap of the next run, or None when there is no money for one now (``inf`` when the
    sweep has no budget and no --run-budget: the run has no dollar cap). ``committed_usd``: what the
    finished runs spent and the running ones may still spend; ``pending``: the combinations not yet
    started, this one included. The remaining budget is shared among them, so every combination is
    kept some money, and what a run leaves unspent goes to those started after it."""
    if budget_usd is None:
        return run_budget_usd if run_budget_usd is not None else math.inf
    share = (budget_usd - committed_usd) / max(1, pending)
    cap = share if run_budget_usd is None else min(share, run_budget_usd)
    return cap if cap >= MIN_CAP_USD else None


def launch_inputs(req: LaunchRequest, task: Task | None) -> dict[str, Any]:
    """What the sweep keeps of the launch its runs share: the same as a run record's ``launch``."""
    return {**req.to_json(), **({"own": task_to_json(task)} if task is not None else {})}


def run_request(sweep: Sweep, run: SweepRun, cap_usd: float | None) -> tuple[LaunchRequest, Task | None]:
    """The launch of one combination: the sweep's, named for the run, in its own folder under a given
    --workdir, with its settings (trainer overrides; your code's environment variables, exported in
    its --run so a resume of the run keeps them) and its cap (below the shared launch's own, if any)."""
    req = LaunchRequest.from_json(sweep.launch)
    budget = req.limits.budget_usd
    if cap_usd is not None:
        budget = cap_usd if budget is None else min(budget, cap_usd)
    workdir = f"{req.workdir.rstrip('/')}/{run.name}" if req.workdir else None
    req = dataclasses.replace(req, name=run.name, workdir=workdir, limits=req.limits.with_(budget_usd=budget))
    own = sweep.launch.get("own")
    if own is None:
        return dataclasses.replace(req, extra=(*req.extra, *(f"{k}={v}" for k, v in run.settings))), None
    task = task_from_json(own)
    pairs = [f.partition("=")[::2] for f in sweep.fixed] + list(run.settings)
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in pairs)
    return req, with_overrides(task, run=exports + task.run, name=run.name, budget_usd=budget)


# -- the record -------------------------------------------------------------------------------------------

def sweeps_dir() -> Path:
    d = home() / "sweeps"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _path(name: str) -> Path:
    runs.check_name(name)  # never outside the folder
    return sweeps_dir() / f"{name}.json"


def exists(name: str) -> bool:
    try:
        return _path(name).exists()
    except UsageError:
        return False


def _ended(name: str) -> bool:
    try:
        return bool(json.loads(_path(name).read_text()).get("ended"))
    except (OSError, ValueError, AttributeError):
        return False


def save(sweep: Sweep) -> None:
    """Write the record; an end asked for meanwhile (``sweep down`` in another process) is kept."""
    if not sweep.ended and _ended(sweep.name):
        sweep = dataclasses.replace(sweep, ended=True)
    data = dataclasses.asdict(sweep)
    data["launch"] = dict(sweep.launch)
    write_private(_path(sweep.name), json.dumps(data, indent=2) + "\n")


def load(name: str) -> Sweep:
    path = _path(name)
    if not path.exists():
        known = sorted(p.stem for p in sweeps_dir().glob("*.json"))
        raise NotFoundError(f"no sweep named '{name}'" + (f" (sweeps: {', '.join(known)})" if known else ""),
                            hint="start one with `gpucli sweep --set KEY=V1,V2 ...`")
    try:
        d = json.loads(path.read_text())
        return Sweep(name=str(d["name"]), axes=tuple(Axis(str(a["key"]), tuple(map(str, a["values"])))
                                                     for a in d["axes"]),
                     fixed=tuple(map(str, d["fixed"])), budget_usd=d["budget_usd"],
                     run_budget_usd=d.get("run_budget_usd"), parallel=int(d["parallel"]), launch=dict(d["launch"]),
                     runs=tuple(SweepRun(index=int(r["index"]), name=str(r["name"]),
                                         settings=tuple((str(k), str(v)) for k, v in r["settings"]),
                                         state=str(r["state"]), cap_usd=r.get("cap_usd"), error=r.get("error"))
                                for r in d["runs"]),
                     created_at=str(d["created_at"]), ended=bool(d.get("ended")))
    except (ValueError, KeyError, TypeError) as exc:
        raise runs.BadRecord(f"sweep record {path.name} cannot be read ({type(exc).__name__}: {str(exc)[:120]})",
                             hint="move it away and start the sweep again under another --name") from None


def create_or_continue(name: str, *, axes: tuple[Axis, ...], fixed: tuple[str, ...], budget_usd: float | None,
                       run_budget_usd: float | None, parallel: int, launch: Mapping[str, Any]) -> tuple[Sweep, bool]:
    """The sweep record, new or (the same name, the same settings or none given) the one there is:
    ``(sweep, continued)``. A second ``gpucli sweep`` of a sweep never starts a combination twice."""
    runs.check_name(name)
    if len(name) > 56:
        raise UsageError(f"sweep name '{name}' is too long (at most 56 characters: its runs add -N)")
    if parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {parallel}")
    for label, value in (("--budget", budget_usd), ("--run-budget", run_budget_usd)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{label} must be a positive number, got {value}")
    if exists(name):
        sweep = load(name)
        if axes and (sweep.axes, sweep.fixed) != (axes, fixed):
            raise UsageError(f"sweep {name} exists with other settings ({describe_axes(sweep)})",
                             hint="run it again without --set to continue it, or pick another --name")
        if sweep.ended:
            raise UsageError(f"sweep {name} was ended with `gpucli sweep down`", hint="start a new one with --name")
        for run in sweep.runs:  # a launch refused before it made anything (no offer, a low balance): again
            if run.state == "failed" and not (runs.runs_dir() / f"{run.name}.json").exists():
                sweep = sweep.with_run(dataclasses.replace(run, state="pending", cap_usd=None, error=None))
        save(sweep)
        return sweep, True
    if not axes:
        raise UsageError("a sweep needs a setting with several values", hint="e.g. --set training.learning_rate=3e-4,1e-3")
    combos = combinations(axes)
    taken = [f"{name}-{i}" for i in range(1, len(combos) + 1) if (runs.runs_dir() / f"{name}-{i}.json").exists()]
    if taken:
        raise UsageError(f"runs named {', '.join(taken[:3])} exist already", hint="pick another sweep --name")
    sweep = Sweep(name=name, axes=axes, fixed=fixed, budget_usd=budget_usd, run_budget_usd=run_budget_usd,
                  parallel=parallel, launch=dict(launch), created_at=runs.now_iso(),
                  runs=tuple(SweepRun(i, f"{name}-{i}", c) for i, c in enumerate(combos, start=1)))
    save(sweep)
    return sweep, False


def describe_axes(sweep: Sweep) -> str:
    return "; ".join(f"{a.key}={','.join(a.values)}" for a in sweep.axes)


# -- what each combination is doing -----------------------------------------------------------------------

def view(run: SweepRun, *, live: bool = True, ended_too: bool = False) -> RunView:
    """The combination's state; a launched run's from its host (``live``: a running one; ``ended_too``:
    also one that is over, for its last losses) or from its record."""
    if run.state in ("pending", "skipped"):
        return RunView(run, run.state, None, 0.0)
    if run.state == "failed":  # what its pod billed before the launch ended it, when its record says
        try:
            spent = runs.load(run.name).cost_usd or 0.0
        except (NotFoundError, UsageError):
            spent = 0.0
        return RunView(run, "failed to launch", None, spent)
    try:
        record = runs.load(run.name)
    except NotFoundError:  # a launch that never wrote its record: nothing was started under the name
        if run.state == "launching":  # under way in a driver now, or a driver killed before the record
            return RunView(run, "launching", None, run.cap_usd or 0.0, running=True)
        return RunView(run, "gone", None, 0.0)
    st = live_status(record) if live and (record.active or ended_too) else None
    record = runs.load(run.name) if st is not None and record.active else record  # a finished run is recorded so by live_status
    cost = (st.cost_usd if st is not None else None) or record.cost_usd or record.cost_until_now() or 0.0
    if record.active:
        state = st.state if st is not None else record.status
        held = max(run.cap_usd if run.cap_usd is not None and math.isfinite(run.cap_usd) else 0.0, cost)
        return RunView(run, state, st, held, running=True)
    return RunView(run, record.status, st, record.cost_usd if record.cost_usd is not None else cost)


def views(sweep: Sweep, *, live: bool = True, ended_too: bool = False) -> list[RunView]:
    return [view(r, live=live, ended_too=ended_too) for r in sweep.runs]


def best(rows: list[RunView]) -> str | None:
    """The run with the lowest validation loss (its best, else its latest)."""
    scored = [(v.status.best_val_loss if v.status.best_val_loss is not None else v.status.val_loss, v.run.name)
              for v in rows if v.status is not None]
    scored = [(loss, name) for loss, name in scored if loss is not None and math.isfinite(loss)]
    return min(scored)[1] if scored else None


# -- driving --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def driving(name: str) -> Iterator[None]:
    """Held while this process drives the sweep: a second driver is refused, not run twice."""
    lock = sweeps_dir() / f".{name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(f"sweep {name} is being driven by another gpucli process on this machine",
                             hint=f"`gpucli sweep status {name}` shows it; stop that process to drive it from here") from None
        yield
    finally:
        os.close(fd)


LaunchFn = Callable[[SweepRun, float | None], None]


def step(sweep: Sweep, launch_one: LaunchFn, *, on_event: Callable[[str], None], live: bool = True) -> tuple[Sweep, bool]:
    """One pass: see what runs, start what the slots and the budget allow. ``(sweep, more to do)``."""
    if sweep.ended or _ended(sweep.name):  # `sweep down` is ending the runs: this pass reads none of them
        return dataclasses.replace(sweep, ended=True), False
    rows = views(sweep, live=live)
    died = [v.run for v in rows if v.state == "launching"]
    for run in died:  # this driver holds the lock: a launch with no record died with an earlier driver
        sweep = sweep.with_run(dataclasses.replace(run, state="pending", cap_usd=None))
    rows = views(sweep, live=False) if died else rows
    running = sum(v.running for v in rows)
    committed = sum(v.committed_usd for v in rows)
    pending = [v.run for v in rows if v.run.state == "pending"]
    for run in pending:
        if running >= sweep.parallel:
            break
        if _ended(sweep.name):  # `gpucli sweep down` from another terminal
            return dataclasses.replace(sweep, ended=True), False
        cap = next_cap(sweep.budget_usd, sweep.run_budget_usd, committed, len(pending) - pending.index(run))
        if cap is None:
            if running == 0:  # nothing will give money back: the rest cannot start
                for rest in pending[pending.index(run):]:
                    sweep = sweep.with_run(dataclasses.replace(rest, state="skipped", error="the sweep's budget is spent"))
                    on_event(f"{rest.name}: skipped, the sweep's budget is spent")
                save(sweep)
            break
        cap_usd = None if math.isinf(cap) else round(math.floor(cap * 1e4) / 1e4, 4)  # never rounded up
        sweep = sweep.with_run(dataclasses.replace(run, state="launching", cap_usd=cap_usd))
        save(sweep)  # the cap counts before the run exists: a driver killed mid-launch never spends it twice
        on_event(f"{run.name}: launching {settings_line(run.settings)}"
                 + (f" (cap ${cap_usd:.2f})" if cap_usd is not None else ""))
        try:
            launch_one(run, cap_usd)
        except GpucliError as exc:
            sweep = sweep.with_run(dataclasses.replace(run, state="failed", cap_usd=cap_usd, error=str(exc)))
            save(sweep)
            on_event(f"{run.name}: failed to launch: {exc}")
            continue
        sweep = sweep.with_run(dataclasses.replace(run, state="launched", cap_usd=cap_usd))
        save(sweep)
        running += 1
        committed += cap_usd or 0.0
    after = views(sweep, live=False)
    return sweep, any(v.run.state in ("pending", "launching") or v.running for v in after)


def drive(name: str, launch_one: LaunchFn, *, poll_s: float, on_event: Callable[[str], None],
          sleep: Callable[[float], None] = time.sleep) -> Sweep:
    """Drive the sweep until every combination has run (or was skipped for want of budget, or the
    sweep was ended). Ctrl-C stops starting runs; those started keep going, under their caps."""
    with driving(name):
        while True:
            sweep, more = step(load(name), launch_one, on_event=on_event)
            if not more:
                return sweep
            sleep(poll_s)


def end(name: str, down_run: Callable[[str], Any]) -> list[str]:
    """``gpucli sweep down``: no more runs start, and every running one is ended. The runs ended."""
    sweep = dataclasses.replace(load(name), ended=True)
    save(sweep)  # first: a driver still running starts nothing more
    ended = []
    for run in sweep.runs:
        if run.state in ("launched", "launching"):
            try:
                record = runs.load(run.name)
            except NotFoundError:
                continue
            if record.active:
                down_run(run.name)
                ended.append(run.name)
    for run in sweep.runs:
        if run.state == "pending":
            sweep = sweep.with_run(dataclasses.replace(run, state="skipped", error="the sweep was ended"))
    save(sweep)
    return ended
