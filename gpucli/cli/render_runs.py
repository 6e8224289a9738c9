"""The presentation layer for runs (launch, status, ls, tail, fetch-best, down): part of render.

Split from render.py only to keep each file readable; like render.py it is the only kind of module
that prints. Data to stdout, progress and status to stderr.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from gpucli.cli.render import _table, err, error, hours, info, json_out, money, out, si, to_jsonable, warn

__all__ = ["error", "info", "warn"]  # re-exported: commands use this module as their renderer

from gpucli.runs.endedby import ended_by_words
from gpucli.runs.machines import counted_in_machine, is_box, machine_root, shared

if TYPE_CHECKING:
    from pathlib import Path

    from gpucli.providers.registry import Stray
    from gpucli.run.files.harvest import FetchResult, MirrorResult
    from gpucli.run.oversee.control import DownResult
    from gpucli.run.watch.follow import TailUpdate
    from gpucli.run.watch.monitor import RunStatus
    from gpucli.runs.notice import Notice
    from gpucli.runs.records import RunRecord
    from gpucli.ssh import SyncStats


def notice(n: Notice) -> None:
    """A core notice, at its level."""
    {"info": info, "warn": warn, "error": error}[n.level](n.text)


def _where(record: RunRecord) -> str:
    from gpucli.providers.registry import get_target

    if record.ssh is not None:
        return f"{record.ssh.user}@{record.ssh.host}:{record.ssh.port}"
    return get_target(record.provider).describe


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@contextlib.contextmanager
def status_line() -> Iterator[Any]:
    """A callback that shows each launch step on stderr (one line per step, timed)."""
    started = time.monotonic()

    def step(message: str) -> None:
        err().print(f"[dim]{time.monotonic() - started:6.1f}s[/] {message}", highlight=False, markup=True)

    yield step


def launched(record: RunRecord, *, json_: bool) -> None:
    if json_:
        json_out(record)
        return
    out().print(f"[green]started[/] run [bold]{record.name}[/] on {_where(record)} (pid {record.pid})\n"
                f"  gpucli tail {record.name}        live metrics\n"
                f"  gpucli status {record.name}      state and cost\n"
                f"  gpucli fetch-best {record.name}  download the best checkpoint\n"
                f"  gpucli down {record.name}        stop it")


def _status_dict(record: RunRecord, st: RunStatus) -> dict[str, Any]:
    return {"run": record.name, "provider": record.provider, "record_status": record.status, **to_jsonable(st),
            "instance_id": record.instance_id, "created_at": record.created_at,
            "planned": to_jsonable(record.planned), "machine": machine_root(record),
            "preflight": record.preflight.to_json() if record.preflight is not None else None}


def run_status(record: RunRecord, st: RunStatus, *, json_: bool) -> None:
    if json_:
        json_out(_status_dict(record, st))
        return
    t = _table(f"run {record.name}", show_header=False)
    t.add_column("what", style="dim")
    t.add_column("value")
    rows = [
        ("state", state_words(st)),
        ("where", f"{record.provider}" + (f" {record.instance_id}" if record.instance_id else "")
         + (f" {record.ssh.user}@{record.ssh.host}:{record.ssh.port}" if record.ssh else "")),
        ("setup", f"{record.n_gpus}x {record.gpu or 'CPU'}, {record.profile}/{record.phase}, model {record.model}"),
        ("step", f"{st.step if st.step is not None else '-'} / {st.max_steps or '-'}"),
        ("loss", f"{st.loss:.4f}" if st.loss is not None else "-"),
        ("val loss", (f"{st.val_loss:.4f}" if st.val_loss is not None else "-")
         + (f" (best {st.best_val_loss:.4f}" + (f" at step {st.best_val_step})" if st.best_val_step is not None
                                                  else ")") if st.best_val_loss is not None else "")),
        ("tokens/s", si(st.tok_per_s) + (f"  MFU {st.mfu:.1%}" if st.mfu else "")),
        ("elapsed", duration(st.elapsed_s)),
        ("ETA", duration(st.eta_s)),
        ("cost so far", money(st.cost_usd) if st.cost_usd is not None else "-"),
        ("$ per hour", money(st.usd_per_hour) if st.usd_per_hour is not None else "-"),
        ("projected total", money(st.projected_cost_usd) if st.projected_cost_usd is not None else "-"),
    ]
    if st.billed_usd is not None:
        rows.append(("billed by " + record.provider, money(st.billed_usd)
                     + (f" (bandwidth {money(st.bandwidth_usd)})" if st.bandwidth_usd else "")))
    if st.contract_note:
        rows.append(("rental", st.contract_note))
    if st.restarts:
        rows.append(("preemptions", f"{st.restarts} (the instance was paused and started again; the run "
                                    "resumed from its newest checkpoint on the instance)"))
    if st.kept_note:
        rows.append(("still billing", f"{money(st.kept_usd_per_month)}/month: {st.kept_note}"))
    ended_by = st.ended_by or record.ended_by
    if ended_by is not None:  # the path that ended the pod, as its watchdog wrote it (gpucli/runs/endedby.py)
        rows.append(("ended by", ended_by_words(ended_by) or ended_by))
    if record.status == "terminate pending" and record.message:
        rows.append(("terminate", f"pending: {record.message}"))
    prep = getattr(st, "prepare", None)
    if prep is not None:
        rows.insert(3, ("data prep", _prepare_line(prep)))
    if record.planned.tokens_per_s:
        rows.append(("plan vs actual", f"planned {si(record.planned.tokens_per_s)} tok/s, "
                     f"{hours(record.planned.hours)}"
                     + (f", {money(record.planned.cost_usd)}" if record.planned.cost_usd is not None else "")
                     + (f"; measured {si(st.tok_per_s)} tok/s" if st.tok_per_s else "")))
    if st.slow:
        rows.append(("slow", f"[yellow]{escape(st.slow)}[/]"))
    if record.preflight is not None:  # the machine as checked before the run was detached
        rows.append(("preflight", escape(record.preflight.line)))
    for k, v in rows:
        t.add_row(k, v)
    out().print(t)
    from gpucli.cli.render_gpu import print_gpus

    print_gpus(getattr(st, "gpus", None))
    if st.log_tail:
        out().print("[dim]last lines of train.log:[/]")
        for line in st.log_tail:
            out().print("  " + line, markup=False, highlight=False)


def _prepare_line(p: Any) -> str:
    """A PrepareStatus in one line: phase, bytes, tokens, rate, ETA, its time and cost so far."""
    parts = [p.phase + (f" ({p.error})" if p.error else "")]
    if p.bytes_read is not None:
        total = f"/{p.bytes_total / 1e6:,.1f}" if p.bytes_total else ""
        parts.append(f"{p.bytes_read / 1e6:,.1f}{total} MB read")
    if p.tokens is not None:
        parts.append(f"{p.tokens:,} tokens written")
    if p.mb_per_s is not None:
        parts.append(f"{p.mb_per_s:,.1f} MB/s")
    if p.phase not in ("done", "failed") and p.eta_s is not None:
        parts.append(f"ETA {duration(p.eta_s)}")
    spent = duration(p.elapsed_s) + (f", {money(p.cost_usd)}" if p.cost_usd is not None else "")
    parts.append(("took " if p.phase in ("done", "failed") else "") + spent + ("" if p.phase in ("done", "failed")
                                                                              else " so far"))
    return ", ".join(parts)


def runs_table(statuses: list[tuple[RunRecord, RunStatus]], *, json_: bool) -> None:
    if json_:
        json_out([_status_dict(r, s) for r, s in statuses])
        return
    if not statuses:
        info("no runs yet; start one with `gpucli launch --provider local --profile cpu --phase fast`")
        return
    t = _table("runs")
    for col in ("run", "provider", "state", "setup", "step", "loss", "best val", "created", "cost"):
        t.add_column(col)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    day_total = 0.0
    records = [r for r, _ in statuses]
    boxes = {r.name for r in records if is_box(r)}
    for r, s in statuses:
        cost = s.cost_usd
        if cost is not None and r.created_at.startswith(today) and not counted_in_machine(r, boxes):
            day_total += cost  # a run on a box is a share of the box's bill, counted there
        state = s.state + (f" (+{money(s.kept_usd_per_month)}/mo)" if s.kept_usd_per_month else "")
        t.add_row(r.name, r.provider, state, f"{r.n_gpus}x {r.gpu or 'CPU'} {r.model}",
                  str(s.step) if s.step is not None else "-", f"{s.loss:.3f}" if s.loss is not None else "-",
                  f"{s.best_val_loss:.3f} @{s.best_val_step}" if s.best_val_loss is not None else "-",
                  r.created_at.replace("T", " ")[:16], money(cost) if cost is not None else "-")
    out().print(t)
    costs = {r.name: s.cost_usd for r, s in statuses}
    for m in shared(records):  # one bill per machine, whatever ran on it
        bill = costs.get(m.root)
        out().print(f"one machine ({'box ' if m.box else ''}{m.root}): {', '.join(m.runs)}; "
                    f"{money(bill) if bill is not None else 'no price'} for the machine, counted once")
    out().print(f"today's runs: {money(day_total)}")


def _row_line(row: dict[str, Any]) -> str | None:
    """A metrics row in one markup line; the pod's values checked (a step that is a string, an infinite
    loss, markup or escapes in an event) and shown as plain text."""
    from gpucli.cli.sanitize import plain
    from gpucli.run.host.untrusted import finite_number as num

    if not isinstance(row, dict):
        return None
    kind = row.get("kind")
    step = plain(str(row.get("step"))[:40])
    if kind == "train":
        loss = num(row.get("loss"))
        parts = [f"step {step}", f"loss {loss if loss is not None else float('nan'):.4f}"]
        ppl, lr, tok, mfu, cost = (num(row.get(k)) for k in ("ppl", "lr", "tok_per_s", "mfu", "cost_usd"))
        if ppl is not None:
            parts.append(f"ppl {ppl:.1f}")
        if lr is not None:
            parts.append(f"lr {lr:.2e}")
        if tok is not None:
            parts.append(f"{si(tok)} tok/s")
        if mfu:
            parts.append(f"MFU {mfu:.1%}")
        if cost is not None:
            parts.append(money(cost))
        return "  ".join(parts)
    if kind == "val":
        val = num(row.get("val_loss"))
        return f"[cyan]val[/] step {step}  val_loss {val if val is not None else float('nan'):.4f}"
    if kind == "event":
        fields = {k: v for k, v in row.items() if k not in ("kind", "event", "time")}
        style = "red" if row.get("event") in ("error", "ppl_spike") else "yellow"
        return (f"[{style}]event[/] {plain(str(row.get('event'))[:80])} "
                f"{plain(json.dumps(fields, default=str)[:200])}")
    return None


def _sparkline(values: list[float], width: int = 40) -> str:
    if not values:
        return ""
    blocks = "▁▂▃▄▅▆▇█"
    vals = values[-width:]
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(blocks[min(7, int((v - lo) / span * 7))] for v in vals)


def _loss_line(record: RunRecord, rows: list[dict[str, Any]], st: RunStatus) -> str:
    losses = [r["loss"] for r in rows if r.get("kind") == "train" and isinstance(r.get("loss"), (int, float))]
    return (f"{record.name}: step {st.step or 0}/{st.max_steps or '?'}  loss {_sparkline(losses)}  "
            f"ETA {duration(st.eta_s)}  {money(st.cost_usd) if st.cost_usd is not None else ''}").rstrip()


def _run_error(rows: list[dict[str, Any]]) -> str | None:
    """The trainer's own words for its failure: its last ``error`` event."""
    errors = [r for r in rows if r.get("kind") == "event" and r.get("event") == "error" and r.get("error")]
    return str(errors[-1]["error"])[:300] if errors else None


def state_words(st: RunStatus) -> str:
    """``finished (exit 0)``, ``failed (exit 1: KeyError: 'x')``, ``stopped by cap: max_hours 0.01 h at 36 s``:
    the own-code runner's one line where it wrote one, else the state and its reason."""
    return st.story or st.state + (f" ({st.finished_reason})" if st.finished_reason else "")


def tail_end(record: RunRecord, rows: list[dict[str, Any]], st: RunStatus) -> str:
    """How a run ended, in one line (the failure's own words where the trainer wrote them)."""
    if st.story:
        return f"run {record.name} {st.story}" + (f", last step {st.step}" if st.step is not None else
                                                  ", before any metrics")
    at = f" at step {st.step}" if st.step is not None else " before its first step"
    if st.state == "failed":
        # Its error row, else the console's last line (an import error or a traceback's exception).
        last = next((ln.strip() for ln in reversed(st.log_tail) if ln.strip()), None)
        why = _run_error(rows) or last or record.message or st.finished_reason or "the trainer exited"
        return f"run {record.name} failed{at}: {why}"
    return f"run {record.name} {st.state}{at}" + (f" ({st.finished_reason})" if st.finished_reason else "")


def _print_end(record: RunRecord, rows: list[dict[str, Any]], st: RunStatus, *, json_: bool,
               failure: bool = True) -> str | None:
    """The end of a run: its console's last lines (where a failure's traceback is), then how it ended
    (a failure's line only with ``failure``: else it is returned, for the command's error). Status
    goes to stderr when stdout carries JSON rows."""
    console = err() if json_ else out()
    if st.log_tail and st.state != "finished":
        console.print("[dim]last lines of console.log:[/]")
        for line in st.log_tail:
            console.print("  " + line, markup=False, highlight=False)
    line = tail_end(record, rows, st)
    if st.state == "failed" and not failure:
        return line
    from gpucli.cli.sanitize import plain

    console.print(f"[red]{plain(line)}[/]" if st.state == "failed" else plain(line), highlight=False)
    return None


def tail_once(record: RunRecord, update: TailUpdate, *, json_: bool) -> None:
    """Every row so far (the last 30 as text), what the run does before its first step, its end."""
    rows = list(update.rows)
    if json_:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
        sys.stdout.flush()
    else:
        o = out()
        for row in rows[-30:]:
            line = _row_line(row)
            if line:
                o.print(line, highlight=False)
        if update.activity and update.end is None:
            o.print(f"{record.name}: {update.activity}", markup=False, highlight=False)
        elif update.end is None:
            from gpucli.run.watch.monitor import summarize

            o.print(_loss_line(record, rows, summarize(record, rows, alive=True)), highlight=False)
        from gpucli.cli.render_gpu import print_gpus

        print_gpus(getattr(update, "gpus", None))
    if update.end is not None:
        _print_end(record, rows, update.end, json_=json_)


def tail_live(record: RunRecord, stream: Iterator[TailUpdate], *, json_: bool) -> str | None:
    """Rows as they come (JSON lines with --json), with a live footer: before the first step what the
    run is doing (preparing data, loading, compiling), then sparkline, ETA, $ so far; at the end the
    console's last lines. Returns the failure in one line when the run failed (the command's error)."""
    rows: list[dict[str, Any]] = []
    end: RunStatus | None = None
    if json_:
        for update in stream:
            for row in update.rows:
                sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()
            rows.extend(update.rows)
            end = update.end or end
        return _print_end(record, rows, end, json_=True, failure=False) if end is not None else None
    from rich.live import Live
    from rich.text import Text

    from gpucli.run.watch.monitor import summarize

    o = out()
    activity: str | None = "connecting"

    from gpucli.cli.render_gpu import summary as gpu_summary

    gpus: Any = None

    def footer() -> Text:
        g = gpu_summary(gpus)
        warning = getattr(gpus, "idle_warning", None)
        extra = (f"\n{g}" if g else "") + (f"\n{warning}" if warning else "")
        if activity:
            return Text(f"{record.name}: {activity}{extra}")
        st = summarize(record, rows, alive=True)
        return Text(_loss_line(record, rows, st) + (f"\n{st.slow}" if st.slow else "") + extra)

    with Live(footer(), console=o, refresh_per_second=2, transient=True) as live:
        for update in stream:
            for row in update.rows:
                rows.append(row)
                line = _row_line(row)
                if line:
                    live.console.print(line, highlight=False)
            activity, end = update.activity, update.end or end
            gpus = getattr(update, "gpus", None) or gpus
            live.update(footer())
    if end is None or rows:
        o.print(footer())
    return _print_end(record, rows, end, json_=False, failure=False) if end is not None else None


@contextlib.contextmanager
def transfer_progress(label: str) -> Iterator[Any]:
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=err(), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(p: Any) -> None:
            bar.update(task, completed=p.bytes_done, total=p.bytes_total or None,
                       description=f"{label} {p.path or ''}"[:60])

        yield update


def fetched(result: FetchResult, *, json_: bool) -> None:
    if json_:
        json_out({"checkpoint": result.checkpoint.name, "step": result.checkpoint.step,
                  "val_loss": result.checkpoint.val_loss, "dest": str(result.dest), "files": list(result.files),
                  "bytes": result.bytes, "reason": result.checkpoint.meta.get("reason")})
        return
    c = result.checkpoint
    out().print(f"fetched [bold]{c.name}[/] (step {c.step}, val loss "
                f"{f'{c.val_loss:.4f}' if c.val_loss is not None else '-'}) to {result.dest}: "
                f"{', '.join(result.files)} ({result.bytes / 1e6:.1f} MB, sha256 verified)")


def downed(result: DownResult) -> None:
    from gpucli.providers.registry import get_target

    record = result.record
    own = record.inputs.own is not None
    what = [("job stopped" if own else "trainer stopped (emergency checkpoint written)") if result.was_running
            else f"{'job' if own else 'trainer'} was not running"]
    if result.ended_pod:
        # With no pod id recorded (a create whose answer was lost), the pods were found by the run's label.
        what.append(f"pod {record.instance_id} terminated" if record.instance_id
                    else f"pods labelled {record.label or 'gpucli-' + record.name} terminated")
    elif get_target(record.provider).cloud:
        what.append("pod left running (--keep-pod)")
    volume = record.inputs.volume
    if volume is not None:
        what.append(f"network volume {volume.name} ({volume.id}) kept: it holds the data and "
                    "checkpoints, and RunPod bills it monthly until you delete it")
    out().print(f"{record.name}: " + "; ".join(what))


def mirrored(record: RunRecord, result: MirrorResult) -> None:
    from gpucli.run.files.harvest import mirror_root

    info(f"{record.name}: mirror in {mirror_root(record.name)}: "
         + (f"new {result.checkpoint}" if result.checkpoint else
            f"up to date (step {result.step})" if result.step is not None else "no checkpoint yet")
         + f", {result.metrics_rows} metrics rows")


def synced(path: Path, stats: SyncStats) -> None:
    info(f"{path}: {stats.files_sent} sent, {stats.files_skipped} unchanged "
         f"({stats.bytes_sent / 1e6:.1f} MB in {stats.seconds:.1f} s)")
    if stats.links_left_out:
        from gpucli.run.inputs.datasources import links_line

        warn(links_line(stats.links_left_out, "sync"))


def strays(instances: list[Stray]) -> None:
    if not instances:
        info("no stray gpucli pods")
        return
    t = _table("gpucli-labelled pods that no active run owns")
    for col in ("provider", "id", "label", "state", "$/h"):
        t.add_column(col)
    for i in instances:
        t.add_row(i.provider, i.instance_id, i.label or "-", i.state,
                  money(i.price_per_hour_usd) if i.price_per_hour_usd is not None else "-")
    out().print(t)


def confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        warn(f"{question} (not asked: no terminal; pass --yes)")
        return False
    return err().input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def remote_watch(st: Any, *, json_: bool) -> None:
    """``watch RUN --status`` / ``--stop``: the watcher on the other machine (gpucli.run.oversee.remotewatch)."""
    w = st.state
    if json_:
        json_out({"run": w.run, "on": w.on, "pid": w.pid, "folder": w.folder, "started_at": w.started_at,
                  "running": st.running, "run_status": st.record_status, "log_tail": list(st.log_tail)})
        return
    info(f"watcher of {w.run} on {w.on} (pid {w.pid}, started {w.started_at}): "
         + ("running" if st.running else "not running")
         + (f"; the run there: {st.record_status}" if st.record_status else ""))
    for line in st.log_tail:
        out().print(f"  {escape(line)}", soft_wrap=True)
