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

from gpucli.cli.render import _table, err, error, hours, info, json_out, money, out, si, to_jsonable, warn

__all__ = ["error", "info", "warn"]  # re-exported: commands use this module as their renderer

if TYPE_CHECKING:
    from pathlib import Path

    from gpucli.run.control import DownResult
    from gpucli.run.follow import TailUpdate
    from gpucli.run.launch import ResolvedLaunch
    from gpucli.run.lifecycle import Notice
    from gpucli.run.mirror import MirrorResult
    from gpucli.run.monitor import FetchResult, RunStatus
    from gpucli.run.records import RunRecord
    from gpucli.run.targets import Stray
    from gpucli.ssh import SyncStats


def notice(n: Notice) -> None:
    """A core notice, at its level."""
    {"info": info, "warn": warn, "error": error}[n.level](n.text)


def _where(record: RunRecord) -> str:
    from gpucli.run.targets import get_target

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


def launch_plan(r: ResolvedLaunch, *, json_: bool) -> None:
    data = {
        "run": r.name, "provider": r.provider, "profile": r.profile, "phase": r.phase, "model": r.model.name,
        "gpu": r.gpu_name, "n_gpus": r.n_gpus, "fit": r.fit, "micro_batch": r.micro_batch,
        "grad_accum": r.grad_accum, "batch_note": r.batch_note, "steps": r.steps, "seq_len": r.seq_len, "workdir": r.workdir,
        "price_per_hour_usd": r.price_per_hour_usd, "limits": r.limits, "planned": r.planned,
        "command": r.command, "run_yaml": r.trainer_config, "data": r.data, "disk": _disk_dict(r),
    }
    volume = _planned_volume(r) if r.volume else None
    if volume is not None:
        data["volume"] = volume
    nodes_line = None
    if r.nodes > 1:
        from gpucli.plan.internode import describe, link_for

        link = link_for(r.provider, r.link_gbps)
        nodes_line = describe(r.nodes, r.n_gpus, r.gpu_name, link, r.price_per_hour_usd)
        data["nodes"] = {"count": r.nodes, "gpus_per_node": r.n_gpus, "gpus": r.nodes * r.n_gpus,
                         "link_gbps": link.gbps, "link_source": link.source,
                         "price_per_hour_usd_all_nodes": r.price_per_hour_usd}
    if json_:
        json_out(data)
        return
    import yaml

    o = out()
    o.print(f"[bold]Dry run[/]: nothing was rented or started.\n"
            f"run {r.name} on {r.provider}: {r.n_gpus}x {r.gpu_name} ({r.profile}, phase {r.phase}), "
            f"model {r.model.name}, {r.steps} steps of {r.n_gpus} x {r.micro_batch} x {r.grad_accum} "
            f"sequences of {r.seq_len} tokens ({r.fit})")
    if nodes_line:
        o.print(f"nodes: {nodes_line}", markup=False, highlight=False)
    if r.batch_note:
        o.print(f"batch: {r.batch_note}", markup=False, highlight=False)
    if r.price_per_hour_usd:
        o.print(f"price {money(r.price_per_hour_usd)}/h; limits: steps {r.limits.max_steps}, hours "
                f"{r.limits.max_hours or '-'}, budget {money(r.limits.budget_usd) if r.limits.budget_usd else '-'}, "
                f"stall {r.limits.stall_minutes:g} min")
    if r.planned.hours is not None:
        o.print(f"planned: {si(r.planned.tokens_per_s)} tokens/s, {hours(r.planned.hours)}"
                + (f", {money(r.planned.cost_usd)}" if r.planned.cost_usd is not None else "")
                + f" [dim]({r.planned.source})[/]")
    if volume is not None:
        o.print(_planned_volume_line(volume), markup=False, highlight=False)
    for line in _disk_lines(r):
        o.print(line, markup=False, highlight=False)
    o.print(f"\n[bold]On the pod[/], in {r.workdir}/code:\n  {r.command}", markup=True, soft_wrap=True)
    o.print(f"\n[bold]{r.workdir}/run.yaml[/]:")
    o.print(yaml.safe_dump(to_jsonable(dict(r.trainer_config)), sort_keys=False).rstrip(), markup=False)


def _planned_volume(r: ResolvedLaunch) -> dict[str, Any]:
    from gpucli.cloud.runpod import volume_usd_per_month

    size = r.volume_size_gb
    return {"name": r.volume, "create_size_gb": size,
            "create_usd_per_month": round(volume_usd_per_month(size), 2) if size else None}


def _planned_volume_line(v: dict[str, Any]) -> str:
    if not v["create_size_gb"]:
        return f"network volume {v['name']} at /workspace (it must exist): run folder, checkpoints, prepared data"
    return (f"network volume {v['name']}: attached if your RunPod account has one of that name, else created "
            f"({v['create_size_gb']} GB in the data centre of the chosen GPU, ${v['create_usd_per_month']:.2f}/month "
            f"at RunPod's published price); kept after the run (it holds the data) until you delete it")


def _disk_dict(r: ResolvedLaunch) -> dict[str, Any] | None:
    d = r.disk
    if d is None:
        return None
    c = d.checkpoints
    return {"weights_gb": c.weights_gb, "optimizer_gb": c.optimizer_gb, "per_rank_optimizer_gb": c.per_rank_optimizer_gb,
            "checkpoint_gb": c.checkpoint_gb, "keep_last": d.keep_last, "checkpoints_at_once": c.at_once,
            "checkpoints_gb": c.disk_gb, "data_gb": d.data_gb, "headroom_gb": d.headroom_gb, "need_gb": d.need_gb,
            "have_gb": d.have_gb, "where": d.where, "fits": d.fits}


def _disk_lines(r: ResolvedLaunch) -> list[str]:
    """The dry run's checkpoint and disk lines: what one checkpoint is, how many the keep-policy holds,
    and the disk that needs against the disk there is."""
    d = r.disk
    if d is None:
        return []
    c = d.checkpoints

    def size(gb: float) -> str:
        return f"{gb * 1000:.1f} MB" if gb < 1 else f"{gb:.1f} GB"

    per_rank = (f", {size(c.per_rank_optimizer_gb)} optimizer per rank" if r.n_gpus > 1 else "")
    data = "data size unknown before the launch" if d.data_gb is None else f"{size(d.data_gb)} data"
    if d.have_gb is None:
        verdict = (f"{d.where}: its size is checked at launch" if r.volume else
                   f"{d.where}: free space is not known before the launch; the trainer checks it before each "
                   "checkpoint")
    else:
        verdict = f"{d.where}: {'fits' if d.fits else 'does NOT fit'}"
    return [f"checkpoints: {size(c.checkpoint_gb)} each (weights {size(c.weights_gb)} + optimizer "
            f"{size(c.optimizer_gb)}{per_rank}); keep_last {d.keep_last} + the best + the one being written = "
            f"{c.at_once} at once = {size(c.disk_gb)}",
            f"disk: {size(c.disk_gb)} checkpoints + {data} + {size(d.headroom_gb)} headroom = "
            f"{size(d.need_gb)}; {verdict}" + (f" ({size(d.have_gb)})" if d.have_gb is not None and r.provider == "local" else "")]


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
            "planned": to_jsonable(record.planned)}


def run_status(record: RunRecord, st: RunStatus, *, json_: bool) -> None:
    if json_:
        json_out(_status_dict(record, st))
        return
    t = _table(f"run {record.name}", show_header=False)
    t.add_column("what", style="dim")
    t.add_column("value")
    rows = [
        ("state", st.state + (f" ({st.finished_reason})" if st.finished_reason else "")),
        ("where", f"{record.provider}" + (f" {record.instance_id}" if record.instance_id else "")
         + (f" {record.ssh.user}@{record.ssh.host}:{record.ssh.port}" if record.ssh else "")),
        ("setup", f"{record.n_gpus}x {record.gpu or 'CPU'}, {record.profile}/{record.phase}, model {record.model}"),
        ("step", f"{st.step if st.step is not None else '-'} / {st.max_steps or '-'}"),
        ("loss", f"{st.loss:.4f}" if st.loss is not None else "-"),
        ("val loss", (f"{st.val_loss:.4f}" if st.val_loss is not None else "-")
         + (f" (best {st.best_val_loss:.4f})" if st.best_val_loss is not None else "")),
        ("tokens/s", si(st.tok_per_s) + (f"  MFU {st.mfu:.1%}" if st.mfu else "")),
        ("elapsed", duration(st.elapsed_s)),
        ("ETA", duration(st.eta_s)),
        ("cost so far", money(st.cost_usd) if st.cost_usd is not None else "-"),
        ("$ per hour", money(st.usd_per_hour) if st.usd_per_hour is not None else "-"),
        ("projected total", money(st.projected_cost_usd) if st.projected_cost_usd is not None else "-"),
    ]
    prep = getattr(st, "prepare", None)
    if prep is not None:
        rows.insert(3, ("data prep", _prepare_line(prep)))
    if record.planned.tokens_per_s:
        rows.append(("plan vs actual", f"planned {si(record.planned.tokens_per_s)} tok/s, "
                     f"{hours(record.planned.hours)}"
                     + (f", {money(record.planned.cost_usd)}" if record.planned.cost_usd is not None else "")
                     + (f"; measured {si(st.tok_per_s)} tok/s" if st.tok_per_s else "")))
    for k, v in rows:
        t.add_row(k, v)
    out().print(t)
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
    for col in ("run", "provider", "state", "setup", "step", "loss", "created", "cost"):
        t.add_column(col)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    day_total = 0.0
    for r, s in statuses:
        cost = s.cost_usd
        if cost is not None and r.created_at.startswith(today):
            day_total += cost
        t.add_row(r.name, r.provider, s.state, f"{r.n_gpus}x {r.gpu or 'CPU'} {r.model}",
                  str(s.step) if s.step is not None else "-", f"{s.loss:.3f}" if s.loss is not None else "-",
                  r.created_at.replace("T", " ")[:16], money(cost) if cost is not None else "-")
    out().print(t)
    out().print(f"today's runs: {money(day_total)}")


def _row_line(row: dict[str, Any]) -> str | None:
    kind = row.get("kind")
    if kind == "train":
        parts = [f"step {row.get('step')}", f"loss {row.get('loss', float('nan')):.4f}"]
        if row.get("ppl") is not None:
            parts.append(f"ppl {row['ppl']:.1f}")
        if row.get("lr") is not None:
            parts.append(f"lr {row['lr']:.2e}")
        if row.get("tok_per_s") is not None:
            parts.append(f"{si(row['tok_per_s'])} tok/s")
        if row.get("mfu"):
            parts.append(f"MFU {row['mfu']:.1%}")
        if row.get("cost_usd") is not None:
            parts.append(money(row["cost_usd"]))
        return "  ".join(parts)
    if kind == "val":
        return f"[cyan]val[/] step {row.get('step')}  val_loss {row.get('val_loss', float('nan')):.4f}"
    if kind == "event":
        fields = {k: v for k, v in row.items() if k not in ("kind", "event", "time")}
        style = "red" if row.get("event") in ("error", "ppl_spike") else "yellow"
        return f"[{style}]event[/] {row.get('event')} {json.dumps(fields, default=str)[:200]}"
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


def tail_end(record: RunRecord, rows: list[dict[str, Any]], st: RunStatus) -> str:
    """How a run ended, in one line (the failure's own words where the trainer wrote them)."""
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
    console.print(f"[red]{line}[/]" if st.state == "failed" else line, highlight=False)
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
            from gpucli.run.monitor import summarize

            o.print(_loss_line(record, rows, summarize(record, rows, alive=True)), highlight=False)
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

    from gpucli.run.monitor import summarize

    o = out()
    activity: str | None = "connecting"

    def footer() -> Text:
        if activity:
            return Text(f"{record.name}: {activity}")
        return Text(_loss_line(record, rows, summarize(record, rows, alive=True)))

    with Live(footer(), console=o, refresh_per_second=2, transient=True) as live:
        for update in stream:
            for row in update.rows:
                rows.append(row)
                line = _row_line(row)
                if line:
                    live.console.print(line, highlight=False)
            activity, end = update.activity, update.end or end
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
                  "bytes": result.bytes})
        return
    c = result.checkpoint
    out().print(f"fetched [bold]{c.name}[/] (step {c.step}, val loss "
                f"{f'{c.val_loss:.4f}' if c.val_loss is not None else '-'}) to {result.dest}: "
                f"{', '.join(result.files)} ({result.bytes / 1e6:.1f} MB, sha256 verified)")


def downed(result: DownResult) -> None:
    from gpucli.run.targets import get_target

    record = result.record
    what = ["trainer stopped (emergency checkpoint written)" if result.was_running else "trainer was not running"]
    if result.ended_pod:
        # With no pod id recorded (a create whose answer was lost), the pods were found by the run's label.
        what.append(f"pod {record.instance_id} terminated" if record.instance_id
                    else f"pods labelled {record.label or 'gpucli-' + record.name} terminated")
    elif get_target(record.provider).cloud:
        what.append("pod left running (--keep-pod)")
    volume = (record.launch or {}).get("volume")
    if isinstance(volume, dict):
        what.append(f"network volume {volume.get('name')} ({volume.get('id')}) kept: it holds the data and "
                    "checkpoints, and RunPod bills it monthly until you delete it")
    out().print(f"{record.name}: " + "; ".join(what))


def mirrored(record: RunRecord, result: MirrorResult) -> None:
    from gpucli.run.mirror import mirror_root

    info(f"{record.name}: mirror in {mirror_root(record.name)}: "
         + (f"new {result.checkpoint}" if result.checkpoint else
            f"up to date (step {result.step})" if result.step is not None else "no checkpoint yet")
         + f", {result.metrics_rows} metrics rows")


def synced(path: Path, stats: SyncStats) -> None:
    info(f"{path}: {stats.files_sent} sent, {stats.files_skipped} unchanged "
         f"({stats.bytes_sent / 1e6:.1f} MB in {stats.seconds:.1f} s)")


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
