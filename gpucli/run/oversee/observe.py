"""Reading runs: what a run's record and its host show now (state, step, cost, data preparation, GPU
use, what a stopped pod still bills), and what that makes due. Nothing here saves a record, ends a pod
or deletes a cluster: `status` and `ls` hand what is due to :mod:`gpucli.run.oversee.reconcile`, one explicit
step, so a reader of this module never has to wonder what a read changed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, TransferError
from gpucli.providers.api import TERMINATE_PENDING, Billed
from gpucli.providers.onstart import RESTARTS
from gpucli.providers.registry import get_target, open_host
from gpucli.run.files.harvest import mirror_root
from gpucli.run.host.owner import orphaned
from gpucli.run.oversee.runend import mirrored_ended_by, own_end_record, status_of_own_end
from gpucli.run.watch.gpuwatch import read_report
from gpucli.run.watch.monitor import RunStatus, best_val, parse_rows, read_head, replaces_slow, status_of
from gpucli.runs import records as runs
from gpucli.runs.endedby import ended_by_in
from gpucli.runs.records import RunRecord

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

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
                     kept_usd_per_month=kept[0] if kept else None, kept_note=kept[1] if kept else None,
                     ended_by=record.ended_by)


def kept_storage(record: RunRecord, *, ended: bool = False) -> tuple[float, str] | None:
    """A stopped pod's disk or a kept volume of an ended cloud run, per month (None: nothing kept).
    ``ended``: the run is over though its record still says active (its pod was seen stopped)."""
    if record.active and not ended:
        return None
    target = get_target(record.provider)
    ask = target.kept_storage if target.cloud else None  # nothing rented: nothing kept
    launch = record.inputs
    pod_kept = bool(record.instance_id) and launch.requested.get("on_end") != "terminate" and record.end_reason != "down"
    if ask is None or not (pod_kept or launch.volume is not None):
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
    gpus: Any = None  # gpucli.run.watch.gpuwatch.GpuReport: nvidia-smi on the host, None where not sampled


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


@dataclass(frozen=True)
class Due:
    """What reading a run found due, for :func:`gpucli.run.oversee.reconcile.apply` to do: reading never acts."""

    record: RunRecord  # the record as read
    save: RunRecord | None = None  # the record as it is now (seen finished or failed; its cost now known)
    end_rented: bool = False  # its rented cluster: the run is over, and no pod of it can end it


@dataclass(frozen=True)
class Observed:
    status: RunStatus
    due: Due | None = None


def observe(record: RunRecord) -> Observed:
    """The run's state as its host shows it now, with its data preparation, and what that makes due (a
    run seen finished or failed is to be recorded so, with the cost metered on the pod). A run no longer
    running also says what its stopped pod or kept volume bills per month. Nothing is saved or ended."""
    seen = _observe(record)
    st = with_billed(seen.status, provider_billed(record))
    ask = get_target(record.provider).contract_note  # vast: the rental's end and price changes
    if ask is not None and record.active and record.instance_id:
        st = dataclasses.replace(st, contract_note=ask(record, now_epoch_s=time.time()))
    if st.kept_usd_per_month is None and st.state not in ("running", "starting", "provisioning"):
        kept = kept_storage(record, ended=True)
        if kept is not None:
            st = dataclasses.replace(st, kept_usd_per_month=kept[0], kept_note=kept[1])
    return Observed(st, seen.due)


def provider_billed(record: RunRecord) -> Billed | None:
    """What the run's provider says its pod has billed so far (vast: charges with bandwidth), or None."""
    ask = get_target(record.provider).billed
    return ask(record) if ask is not None and record.instance_id else None


def billed_cost(cost: float | None, billed: Billed | None) -> float | None:
    """The run's cost with what only the provider knows: the bandwidth it bills per byte is added to the
    metered compute (elapsed x price), and the provider's own total wins when it is higher."""
    if billed is None:
        return cost
    return max(billed.total_usd, (cost or 0.0) + billed.bandwidth_usd)


def with_billed(st: RunStatus, billed: Billed | None) -> RunStatus:
    if billed is None:
        return st
    return dataclasses.replace(st, cost_usd=billed_cost(st.cost_usd, billed), billed_usd=billed.total_usd,
                               bandwidth_usd=billed.bandwidth_usd)


def _observe(record: RunRecord) -> Observed:
    if record.status == TERMINATE_PENDING:  # reconcile.pending_terminates() has tried it again already
        return Observed(recorded_status(record))
    if orphaned(record):
        # Its launch died before handing the pod over: `gpucli down --strays` ends the pod.
        return Observed(RunStatus(
            state="stray: launch died", cost_usd=record.cost_until_now(),
            last_event=f"the launch (pid {(record.launcher or '').partition(':')[0]}) died while "
                       f"{record.status}; end its pod with `gpucli down --strays`"))
    try:
        host = open_host(record, connect_timeout_s=10)
    except GpucliError as exc:
        if not record.active:  # the pod gone or stopped: which path ended it, from the mirrored watchdog.json
            mirrored = mirrored_ended_by(mirror_root(record.name))
            if mirrored is not None and mirrored != record.ended_by:
                record = record.with_(ended_by=mirrored)
                return Observed(recorded_status(record), Due(record, save=record))
            return Observed(recorded_status(record))
        # A cloud pod that SSH cannot reach: the run's own end first, then the provider (preempted, exited, gone).
        if (ended := own_end_record(record)) is not None:
            return Observed(status_of_own_end(ended), Due(record, save=ended))
        try:
            ps = get_target(record.provider).pod_state(record)
        except GpucliError:
            ps = None
        return Observed(RunStatus(state=ps.describe if ps is not None else f"unreachable ({one_line(str(exc))})"))
    with host:
        st = status_of(host, record)
        ended_by = ended_by_in(read_or_none(host, f"{record.workdir}/watchdog.json"))
        prep = summarize_prepare(prepare_rows(host, record.workdir), price=record.price_per_hour_usd,
                                 training_started=st.step is not None or st.last_event is not None)
        restarts = _container_restarts(host, record)
        gpus = read_report(host, record)
    if restarts:
        st = dataclasses.replace(st, restarts=restarts)
    ended_by = ended_by or record.ended_by
    st = dataclasses.replace(st, ended_by=ended_by)
    due = None
    if record.active and not replaces_slow(record, st) and (st.state in ("finished", "failed")
                                                           or (st.state == "stopped" and st.finished_reason)):
        # its cluster, if it has one, is to be ended too: no pod can end it (gpucli/providers/clusterend.py)
        due = Due(record, save=record.with_(status=st.state, ended_at=runs.now_iso(), end_reason=st.finished_reason,
                                            cost_usd=st.cost_usd, step=st.step, loss=_finite(st.loss),
                                            ended_by=ended_by, **best_val(st)),
                  end_rented=True)
    elif not record.active and (record.cost_usd is None and st.cost_usd is not None or ended_by != record.ended_by):
        due = Due(record, save=record.with_(cost_usd=record.cost_usd if record.cost_usd is not None else st.cost_usd,
                                            ended_by=ended_by))
    return Observed(dataclasses.replace(with_prepare(st, prep), gpus=gpus), due)


def read_or_none(host: Host, path: str) -> bytes | None:
    """A small file of the run folder, or None when it is not there (or cannot be read now)."""
    try:
        return read_head(host, path)
    except (GpucliError, OSError):
        return None


def _container_restarts(host: Host, record: RunRecord) -> int | None:
    """How many times the instance's container started again (vast: outbid, then resumed by vast),
    from the lines resume.sh appends (gpucli/providers/onstart.py); None where there are none."""
    try:
        if not host.exists(f"{record.workdir}/{RESTARTS}"):
            return None
        text = read_head(host, f"{record.workdir}/{RESTARTS}").decode(errors="replace")
    except GpucliError:
        return None
    return sum(1 for line in text.splitlines() if line.strip()) or None


def one_line(text: str, limit: int = 300) -> str:
    """A failure as one line for a table cell: its first line (a library's traceback or a pod's text
    never spreads over the status), shortened."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return first if len(first) <= limit else first[: limit - 3] + "..."
