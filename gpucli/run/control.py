"""Looking at and ending runs: live status (which keeps the record up to date, and shows the data
preparation read from the run folder's prepare.jsonl), stopping a run and metering its cost, finding
and ending stray pods, pushing more data.

Like the rest of the core, nothing here prints: results are returned, progress goes to callbacks.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.cloud.base import TERMINATE_PENDING, Billed, TerminatePending
from gpucli.cloud.credentials import MissingKeyError
from gpucli.errors import GpucliError, ProviderError, TransferError, UsageError
from gpucli.run import procs
from gpucli.run import records as runs
from gpucli.run.clusterend import end_clusters_of_ended
from gpucli.run.gpuwatch import read_report
from gpucli.run.lifecycle import Notice, NoticeFn
from gpucli.run.monitor import RunStatus, best_val, parse_rows, status_of, stop_trainer
from gpucli.run.multinode import end_nodes, end_rented, end_stray_cluster, stray_clusters
from gpucli.run.nodes import stop_watchdogs
from gpucli.run.overlayrent import stray_overlays
from gpucli.run.owner import orphaned
from gpucli.run.records import RunRecord
from gpucli.run.runend import own_end
from gpucli.run.sshconfig import remove_entry
from gpucli.run.targets import TARGETS, get_target, open_host
from gpucli.run.targets.onstart import RESTARTS

if TYPE_CHECKING:
    from gpucli.run.targets import Host, Stray
    from gpucli.ssh import SyncStats

PREPARE_PROGRESS = "prepare.jsonl"  # in the run folder: gpucli/pod/fetch.py's and trainer/data/progress.py's rows
_PHASES = {"download": "downloading", "hash": "hashing", "start": "starting"}


def _quiet(*_: object) -> None:
    return None


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def recorded_status(record: RunRecord) -> RunStatus:
    """What the record alone says (no host asked), with what an ended cloud run keeps billing."""
    kept = kept_storage(record)
    return RunStatus(state=record.status, cost_usd=record.cost_usd, usd_per_hour=record.price_per_hour_usd,
                     step=record.step, loss=record.loss, max_steps=record.limits.max_steps,
                     best_val_loss=record.best_val_loss, best_val_step=record.best_val_step,
                     kept_usd_per_month=kept[0] if kept else None, kept_note=kept[1] if kept else None)


def kept_storage(record: RunRecord, *, ended: bool = False) -> tuple[float, str] | None:
    """A stopped pod's disk or a kept volume of an ended cloud run, per month (None: nothing kept).
    ``ended``: the run is over though its record still says active (its pod was seen stopped)."""
    if record.active and not ended:
        return None
    target = get_target(record.provider)
    ask = getattr(target, "kept_storage", None)
    launch = record.launch or {}
    raw = launch.get("request")
    request: dict[str, Any] = raw if isinstance(raw, dict) else {}
    pod_kept = bool(record.instance_id) and request.get("on_end") != "terminate" and record.end_reason != "down"
    if ask is None or not (pod_kept or launch.get("volume")):
        return None  # nothing can still bill: no provider call (ls lists every run)
    try:
        return ask(record)
    except GpucliError:
        return None


@dataclass(frozen=True)
class PrepareStatus:
    """The data step of a run as its progress rows show it: fetch.py's (download, hash: ``bytes``,
    ``total_bytes``, ``mb_per_s``) and trainer.prepare's (``kind: prepare``: ``bytes_read``,
    ``bytes_total``, ``tokens``, ``mb_s``, ``eta_s``, ``done``). Its elapsed time runs from the first row
    to the last once it is over, to now while it goes on; its cost is that time at the run's $/h."""

    phase: str  # downloading | hashing | preparing | done | failed
    bytes_read: int | None = None
    bytes_total: int | None = None
    tokens: int | None = None
    mb_per_s: float | None = None
    eta_s: float | None = None
    elapsed_s: float | None = None
    cost_usd: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class LiveStatus(RunStatus):
    """A run's status with its data preparation (None: the run prepares nothing, or has not started to)."""

    prepare: PrepareStatus | None = None
    gpus: Any = None  # gpucli.run.gpuwatch.GpuReport: nvidia-smi on the host, None where not sampled


def _int(value: Any) -> int | None:
    v = _finite(value)
    return None if v is None else int(v)


def summarize_prepare(rows: list[dict[str, Any]], *, price: float | None, training_started: bool,
                      now: float | None = None) -> PrepareStatus | None:
    """The data step from its progress rows; ``training_started``: the trainer has written metrics
    (so the data step is over, whatever its last row says: a reused prepared folder writes no "done")."""
    rows = [r for r in rows if _finite(r.get("time")) is not None]
    if not rows:
        return None
    now = time.time() if now is None else now
    first, last = rows[0], rows[-1]
    started = float(first["time"]) - (_finite(first.get("elapsed_s")) or 0.0)
    prep = next((r for r in reversed(rows) if r.get("kind") == "prepare"), None)
    if last.get("phase") == "failed":
        phase = "failed"
    elif training_started or (prep is last and last.get("done")):
        phase = "done"
    elif last.get("kind") == "prepare":
        phase = "preparing"
    else:
        phase = _PHASES.get(str(last.get("phase")), str(last.get("phase") or "preparing"))
    over = phase in ("done", "failed")
    elapsed = max(0.0, (float(last["time"]) if over else max(now, float(last["time"]))) - started)
    if last.get("kind") == "prepare" or (over and prep is not None):
        row = prep if prep is not None else last
        done_bytes, total = _int(row.get("bytes_read")), _int(row.get("bytes_total"))
        rate, eta = _finite(row.get("mb_s")), _finite(row.get("eta_s"))
    else:  # fetch.py's rows: a download or the content hash of the inputs
        done_bytes, total, rate = _int(last.get("bytes")), _int(last.get("total_bytes")), _finite(last.get("mb_per_s"))
        eta = (total - done_bytes) / (rate * 1e6) if total and done_bytes is not None and rate else None
    return PrepareStatus(
        phase=phase, bytes_read=done_bytes, bytes_total=total,
        tokens=_int(prep.get("tokens")) if prep is not None else None, mb_per_s=rate,
        eta_s=0.0 if over else eta, elapsed_s=elapsed,
        cost_usd=None if price is None else elapsed / 3600 * price,
        error=str(last.get("error")) if phase == "failed" and last.get("error") else None)


def prepare_rows(host: Host, workdir: str) -> list[dict[str, Any]]:
    """Every progress row of the run's data step ([] where it wrote none)."""
    rows: list[dict[str, Any]] = []
    offset, tail = 0, b""
    while True:
        try:
            data, offset2 = host.read_from(f"{workdir}/{PREPARE_PROGRESS}", offset)
        except (TransferError, OSError):
            return rows
        if not data:
            return rows
        got, tail = parse_rows(tail + data)
        rows.extend(got)
        offset = offset2


def with_prepare(st: RunStatus, prepare: PrepareStatus | None) -> LiveStatus:
    return LiveStatus(**{f.name: getattr(st, f.name) for f in fields(RunStatus)}, prepare=prepare)


def live_status(record: RunRecord) -> RunStatus:
    """The run's state as its host shows it now, with its data preparation. A run seen finished or
    failed is recorded so, with the cost metered on the pod (elapsed x price). A run no longer running
    also says what its stopped pod or kept volume bills per month."""
    st = with_billed(_live_status(record), provider_billed(record))
    if st.kept_usd_per_month is None and st.state not in ("running", "starting", "provisioning"):
        kept = kept_storage(record, ended=True)
        if kept is not None:
            st = dataclasses.replace(st, kept_usd_per_month=kept[0], kept_note=kept[1])
    return st


def provider_billed(record: RunRecord) -> Billed | None:
    """What the run's provider says its pod has billed so far (vast: charges with bandwidth), or None."""
    ask = getattr(get_target(record.provider), "billed", None)
    return ask(record) if ask is not None and record.instance_id else None


def billed_cost(cost: float | None, billed: Billed | None) -> float | None:
    """The run's cost with what only the provider knows: the bandwidth it bills per byte is added to the
    metered compute (elapsed x price), and the provider's own total wins when it is higher."""
    if billed is None:
        return cost
    return max(billed.total_usd, (cost or 0.0) + billed.bandwidth_usd)


def _final_bill(record: RunRecord, cost: float | None) -> tuple[float | None, dict[str, Any] | None]:
    """The cost with the pod's bill as the provider reports it (vast: bandwidth), and the launch
    facts with the bandwidth counted, so a second ``down`` never adds it twice."""
    billed = provider_billed(record)
    if billed is None:
        return cost, record.launch
    launch = dict(record.launch or {})
    counted = _finite(launch.get("bandwidth_usd")) or 0.0
    launch["bandwidth_usd"] = billed.bandwidth_usd
    return billed_cost(None if cost is None else cost - counted, billed), launch


def with_billed(st: RunStatus, billed: Billed | None) -> RunStatus:
    if billed is None:
        return st
    return dataclasses.replace(st, cost_usd=billed_cost(st.cost_usd, billed), billed_usd=billed.total_usd,
                               bandwidth_usd=billed.bandwidth_usd)


def _live_status(record: RunRecord) -> RunStatus:
    if record.status == TERMINATE_PENDING:
        return recorded_status(retry_pending_terminate(record))
    if orphaned(record):
        # Its launch died before handing the pod over: `gpucli down --strays` ends the pod.
        return RunStatus(state="stray: launch died", cost_usd=record.cost_until_now(),
                         last_event=f"the launch (pid {(record.launcher or '').partition(':')[0]}) died while "
                                    f"{record.status}; end its pod with `gpucli down --strays`")
    try:
        host = open_host(record, connect_timeout_s=10)
    except GpucliError as exc:
        if not record.active:
            return recorded_status(record)
        # A cloud pod that SSH cannot reach: the run's own end first, then the provider (preempted, exited, gone).
        if (ended := own_end(record)) is not None:
            return ended
        try:
            ps = get_target(record.provider).pod_state(record)
        except GpucliError:
            ps = None
        return RunStatus(state=ps.describe if ps is not None else f"unreachable ({exc})")
    with host:
        st = status_of(host, record)
        prep = summarize_prepare(prepare_rows(host, record.workdir), price=record.price_per_hour_usd,
                                 training_started=st.step is not None or st.last_event is not None)
        restarts = _container_restarts(host, record)
        gpus = read_report(host, record)
    if restarts:
        st = dataclasses.replace(st, restarts=restarts)
    if record.active and (st.state in ("finished", "failed") or (st.state == "stopped" and st.finished_reason)):
        runs.save(record.with_(status=st.state, ended_at=runs.now_iso(), end_reason=st.finished_reason,
                               cost_usd=st.cost_usd, step=st.step, loss=_finite(st.loss), **best_val(st)))
        end_rented(record, on_warn=_quiet)  # its cluster, if it has one: no pod can end it (gpucli/run/clusterend.py)
    elif not record.active and record.cost_usd is None and st.cost_usd is not None:
        runs.save(record.with_(cost_usd=st.cost_usd))
    return dataclasses.replace(with_prepare(st, prep), gpus=gpus)


def _container_restarts(host: Host, record: RunRecord) -> int | None:
    """How many times the instance's container started again (vast: outbid, then resumed by vast),
    from the lines resume.sh appends (gpucli/run/targets/onstart.py); None where there are none."""
    try:
        if not host.exists(f"{record.workdir}/{RESTARTS}"):
            return None
        text = host.read_file(f"{record.workdir}/{RESTARTS}").decode(errors="replace")
    except GpucliError:
        return None
    return sum(1 for line in text.splitlines() if line.strip()) or None


def all_statuses(*, check_all: bool, on_bad: Callable[[str], None] | None = None
                 ) -> list[tuple[RunRecord, RunStatus]]:
    """Every run with its status: live for active runs (every run with ``check_all``). A record that
    cannot be read is skipped and named to ``on_bad``."""
    rows = [(r, live_status(r) if (r.active or check_all) else recorded_status(r))
            for r in (retry_pending_terminate(r) for r in runs.list_runs(on_bad))]
    end_clusters_of_ended(runs.list_runs())  # a rented cluster of a run that is over: no pod can end it
    return rows


def retry_pending_terminate(record: RunRecord) -> RunRecord:
    """A run whose pod's terminate was not confirmed: try it again; saved as stopped once the provider
    says the pod is gone, else returned unchanged (its status keeps saying "terminate pending")."""
    if record.status != TERMINATE_PENDING:
        return record
    try:
        get_target(record.provider).terminate(record)
    except GpucliError as exc:
        saved = record.with_(message=str(exc)[:500])
    else:
        saved = record.with_(status="stopped", message=None)
    runs.save(saved)
    return saved


@dataclass(frozen=True)
class DownResult:
    record: RunRecord  # as saved after the down
    was_running: bool
    ended_pod: bool


def down(run: str | None, *, keep_pod: bool = False, on_step: Callable[[str], None] = _quiet,
         on_notice: NoticeFn = _quiet) -> DownResult:
    """Stop the trainer (SIGTERM: it writes an emergency checkpoint), then end the pod unless
    ``keep_pod``; the record gets the end and the metered cost."""
    record = runs.resolve(run, on_bad=lambda text: on_notice(Notice("warn", text)))
    was_running = False
    if record.nodes:  # the other nodes' watchdogs first: rank 0's stop must not read as a lost node

        stop_watchdogs(record, on_warn=lambda t: on_notice(Notice("warn", t)))
    try:
        with open_host(record, connect_timeout_s=15) as host:
            if record.watchdog_pid:  # it would take the trainer's exit for the end of the run
                if procs.signal(host, record, record.watchdog_pid, record.watchdog_ident, "TERM") == "stale":
                    on_notice(Notice("warn", f"pid {record.watchdog_pid} is no longer the run's watchdog: "
                                             "not signalled"))
            was_running = stop_trainer(host, record, on_event=on_step)
            last = status_of(host, record)  # the step and loss it ended at, for `ls`
            record = record.with_(step=last.step if last.step is not None else record.step,
                                  **(best_val(last) if last.best_val_loss is not None else {}),
                                  loss=_finite(last.loss) if last.loss is not None else record.loss)
    except GpucliError as exc:
        on_notice(Notice("warn", f"could not reach the run's host to stop the trainer cleanly: {exc}"))

    rented = False
    if record.nodes:  # every node of the run ends with it, and a rented cluster with every pod of it
        end_nodes(record, on_warn=lambda t: on_notice(Notice("warn", t)), ranks=[n.rank for n in record.nodes])
        rented = not keep_pod and end_rented(record, on_warn=lambda t: on_notice(Notice("warn", t)))
    try:
        ended_pod = rented or (False if keep_pod else get_target(record.provider).terminate(record))
    except TerminatePending as exc:
        # Never "stopped" on an answer that does not say the pod is gone: the record keeps saying so,
        # `ls` and `status` show it, and the next `down` tries again.
        cost = record.cost_usd if record.cost_usd is not None else record.cost_until_now()
        runs.save(record.with_(status=TERMINATE_PENDING, ended_at=record.ended_at or runs.now_iso(),
                               end_reason=record.end_reason or ("down" if was_running else None), cost_usd=cost,
                               message=exc.message[:500]))
        raise
    if not keep_pod:
        remove_entry(record.name)  # `ssh gpucli-<run>` would reach the next pod on that address
    cost = record.cost_usd if record.cost_usd is not None else record.cost_until_now()
    launch = record.launch
    if not keep_pod:
        cost, launch = _final_bill(record, cost)
    was_pending = record.status == TERMINATE_PENDING
    saved = record.with_(status="stopped" if (record.active or was_pending) else record.status, launch=launch,
                         ended_at=record.ended_at or runs.now_iso(),
                         end_reason=record.end_reason or ("down" if was_running else None), cost_usd=cost)
    runs.save(saved)
    return DownResult(saved, was_running, ended_pod)


def find_strays(on_notice: NoticeFn = _quiet) -> list[Stray]:
    """gpucli-labelled pods that no active run owns, on every cloud target (one without a key is
    reported and skipped)."""
    strays: list[Stray] = []
    unread: list[str] = []
    for target in TARGETS.values():
        if not target.cloud:
            continue
        # A run owns its pod while it is active, unless its launch died before handing the pod over
        # (nothing will start its trainer or end it). A launch still creating its pod owns its label.
        live = [r for r in runs.list_runs() if r.active and r.provider == target.name and not orphaned(r)]
        owned = {r.instance_id for r in live if r.instance_id} | {n.instance_id for r in live for n in r.nodes
                                                                   if n.instance_id}  # a run's other nodes
        labels = {r.label for r in live if r.label and r.status != "running"}
        labels |= {f"{r.label}-node{n.rank}" for r in live if r.label and r.status != "running" for n in r.nodes}
        try:
            strays += [s for s in target.strays(owned) if s.label not in labels]
        except GpucliError as exc:
            on_notice(Notice("warn", f"{target.name}: {exc}"))
            if not isinstance(exc, MissingKeyError):  # no key: no pods of ours can be there
                unread.append(target.name)
    try:  # the clusters of runs over several machines (run/multinode.py)
        strays += stray_clusters(runs.list_runs())
    except GpucliError as exc:
        on_notice(Notice("warn", f"runpod clusters: {exc}"))
    try:  # the overlays of vast.ai runs over several machines (run/overlayrent.py)
        strays += stray_overlays(runs.list_runs())
    except GpucliError as exc:
        on_notice(Notice("warn", f"vast.ai overlays: {exc}"))
        unread.append("vast.ai overlays")
    if unread and not strays:
        # Never "no strays" from a list that could not be read: its pods may be billing.
        raise ProviderError(f"could not read the pod list of {', '.join(unread)}: its strays are unknown",
                            hint="try `gpucli down --strays` again, or check the provider console")
    return strays


def _close_orphan(stray: Stray) -> None:
    """The record of a launch that died owning this pod: failed, with the pod's end in its message."""
    for r in runs.list_runs():
        if r.provider == stray.provider and orphaned(r) and (r.instance_id == stray.instance_id or
                                                               (not r.instance_id and r.label == stray.label)):
            runs.save(r.with_(status="failed", ended_at=runs.now_iso(), cost_usd=r.cost_until_now(),
                              message=f"the launch died before handing the pod over; pod {stray.instance_id} "
                                      "terminated by `gpucli down --strays`"))


def end_strays(strays: Iterable[Stray], on_notice: NoticeFn = _quiet) -> None:
    """Terminate each; a ProviderError at the end names those still running."""
    failed = []
    for s in strays:
        try:
            if s.provider in ("runpod-cluster", "vast-overlay"):
                end_stray_cluster(s.instance_id, s.provider)
            else:
                get_target(s.provider).end_stray(s.instance_id)
        except ProviderError as exc:
            failed.append(s.instance_id)
            on_notice(Notice("error", f"could not terminate {s.provider} {s.instance_id}: {exc}"))
            continue
        on_notice(Notice("info", f"terminated {s.provider} {s.instance_id} ({s.label})"))
        _close_orphan(s)
    if failed:
        raise ProviderError(f"{len(failed)} stray pod(s) still running: {', '.join(failed)}",
                            hint="run `gpucli down --strays` again, or end them in the provider console")


def sync_paths(run: str, paths: Iterable[Path], *, on_synced: Callable[[Path, SyncStats], None] = _quiet
               ) -> None:
    """Push files and folders into the run's ``data/src`` (incremental: unchanged files are skipped)."""
    paths = list(paths)
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
    record = runs.resolve(run)
    with open_host(record) as host:
        for path in paths:
            if path.is_dir():
                stats = host.sync_up(path, f"{record.workdir}/data/src/{path.name}")
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    shutil.copy2(path, Path(tmp) / path.name)
                    stats = host.sync_up(tmp, f"{record.workdir}/data/src")
            on_synced(path, stats)
