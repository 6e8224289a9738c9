"""Acting on runs: stopping a run and metering its cost, finding and ending stray pods, pushing more
data. Reading them is :mod:`gpucli.run.oversee.observe`; what a read finds due, :mod:`gpucli.run.oversee.reconcile`.

Like the rest of the core, nothing here prints: results are returned, progress goes to callbacks.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, ProviderError, UsageError
from gpucli.providers.api import TERMINATE_PENDING, TerminatePending
from gpucli.providers.credentials import MissingKeyError
from gpucli.providers.registry import all_targets, get_target, open_host
from gpucli.providers.vast.overlayrent import OVERLAY_STRAY, stray_overlays
from gpucli.run.files import store
from gpucli.run.host import procs
from gpucli.run.host.nodes import stop_watchdogs
from gpucli.run.host.owner import orphaned
from gpucli.run.oversee import reconcile
from gpucli.run.oversee.observe import billed_cost, provider_billed
from gpucli.run.starting.multinode import (
    CLUSTER_STRAY,
    end_nodes,
    end_rented,
    end_stray_cluster,
    stray_clusters,
)
from gpucli.run.watch.monitor import RunStatus, best_val, status_of, stop_trainer
from gpucli.runs import records as runs
from gpucli.runs.launchinputs import LaunchInputs
from gpucli.runs.notice import Notice, NoticeFn
from gpucli.runs.records import RunRecord
from gpucli.runs.sshconfig import remove_entry

if TYPE_CHECKING:
    from gpucli.providers.registry import Stray
    from gpucli.ssh import SyncStats



def _quiet(*_: object) -> None:
    return None


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def live_status(record: RunRecord) -> RunStatus:
    """The run read and reconciled (see :func:`gpucli.run.oversee.reconcile.status`): kept for library callers."""
    return reconcile.status(record)


def all_statuses(*, check_all: bool, on_bad: Callable[[str], None] | None = None
                 ) -> list[tuple[RunRecord, RunStatus]]:
    """Every run read and reconciled (see :func:`gpucli.run.oversee.reconcile.statuses`)."""
    return reconcile.statuses(check_all=check_all, on_bad=on_bad)


def _final_bill(record: RunRecord, cost: float | None) -> tuple[float | None, LaunchInputs | None]:
    """The cost with the pod's bill as the provider reports it (vast: bandwidth), and the launch
    facts with the bandwidth counted, so a second ``down`` never adds it twice."""
    billed = provider_billed(record)
    if billed is None:
        return cost, record.launch
    counted = _finite(record.inputs.bandwidth_usd) or 0.0
    launch = record.inputs.with_(bandwidth_usd=billed.bandwidth_usd)
    return billed_cost(None if cost is None else cost - counted, billed), launch



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
    # the other nodes' watchdogs first (none on one machine): rank 0's stop must not read as a lost node
    stop_watchdogs(record, on_warn=lambda t: on_notice(Notice("warn", t)))
    try:
        with open_host(record, connect_timeout_s=15) as host:
            if record.watchdog_pid:  # it would take the trainer's exit for the end of the run
                if procs.signal(host, record, record.watchdog_pid, record.watchdog_ident, "TERM") == "stale":
                    on_notice(Notice("warn", f"pid {record.watchdog_pid} is no longer the run's watchdog: "
                                             "not signalled"))
            was_running = stop_trainer(host, record, on_event=on_step)
            store.flush(host, record, on_step)  # a run with --store: its last checkpoint there before the pod ends
            last = status_of(host, record)  # the step and loss it ended at, for `ls`
            record = record.with_(step=last.step if last.step is not None else record.step,
                                  **(best_val(last) if last.best_val_loss is not None else {}),
                                  loss=_finite(last.loss) if last.loss is not None else record.loss)
    except GpucliError as exc:
        on_notice(Notice("warn", f"could not reach the run's host to stop the trainer cleanly: {exc}"))

    # every other node of the run ends with it (none on one machine), and what was rented as one (a
    # cluster, an overlay) with every pod of it; a pod rented on its own is no such thing (False)
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
    for target in all_targets():
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
    try:  # the clusters of runs over several machines (run/starting/multinode.py)
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
            if s.provider in (CLUSTER_STRAY, OVERLAY_STRAY):  # a rented cluster or overlay, not one pod
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
