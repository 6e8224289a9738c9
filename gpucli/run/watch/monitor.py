"""Reading a run from its host: metrics rows, live status, whether its process lives, stopping it.

Everything here works through the host interface shared by ``LocalHost`` and ``Remote``; the
trainer's files are the contract (metrics.jsonl rows, status.json), read without torch; the
checkpoints are :mod:`gpucli.run.files.checkpoints` and :mod:`gpucli.run.files.harvest`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, TransferError
from gpucli.pod.slowrun import slow_words
from gpucli.run.host import procs, untrusted
from gpucli.runs.records import RunRecord, parse_iso
from trainer.spec.metricsrow import MetricsRow, as_rows

if TYPE_CHECKING:
    from gpucli.providers.registry import Host


def parse_rows(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """Complete JSON lines of ``data`` and the incomplete tail to keep for next time."""
    *lines, tail = data.split(b"\n")
    rows = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if len(line) > MAX_ROW_BYTES:
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a torn write (or a pod's malformed or too deeply nested line) is skipped, never fatal
        row = untrusted.clean_row(row)  # wrong types from the pod are dropped here, not crashed on later
        if row is not None:
            rows.append(row)
    if len(tail) > MAX_ROW_BYTES:  # a "line" that never ends is not a row: not kept in memory
        tail = b""
    return rows, tail


def read_all_rows(host: Host, workdir: str) -> list[dict[str, Any]]:
    """The run's metrics rows, streamed and bounded: at most what the file held when the read started (a
    file that keeps growing cannot keep the command reading), its last :data:`MAX_ROWS_BYTES`, and of
    each kind of row (train, val, event, ...) the newest :data:`MAX_ROWS_PER_KIND`, in file order. A pod
    whose metrics never end costs a bounded read and bounded memory, whatever it writes."""
    path = f"{workdir}/metrics.jsonl"
    end = _size(host, path)
    if end is None:
        return []
    kept: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
    seq = 0
    offset, tail = max(0, end - MAX_ROWS_BYTES), b""
    first = offset > 0  # started mid-line: the first piece is not a row
    while offset < end:
        data, offset2 = host.read_from(path, offset, min(8 << 20, end - offset))
        if not data or offset2 <= offset:
            break
        got, tail = parse_rows(tail + data)
        if first and got:
            got, first = got[1:], False
        for row in got:
            kind = str(row.get("kind"))[:32]
            if kind not in kept and len(kept) >= MAX_KINDS:
                continue  # a pod inventing kinds by the thousand: the first ones are kept
            kept.setdefault(kind, deque(maxlen=MAX_ROWS_PER_KIND)).append((seq, row))
            seq += 1
        offset = offset2
    return [row for _, row in heapq.merge(*kept.values(), key=lambda pair: pair[0])]


def read_metrics(host: Host, workdir: str) -> list[MetricsRow]:
    """The run's metrics rows, typed (:func:`read_all_rows`, bounded the same way)."""
    return as_rows(read_all_rows(host, workdir))


#: A metrics line longer than this is not one of the trainer's rows (they are a few hundred bytes).
MAX_ROW_BYTES = 1 << 20
#: The most of metrics.jsonl read at once (its end): ~200k rows of a few hundred bytes, far more than a
#: status needs. With the per-kind cap below, what a command holds stays bounded whatever a pod writes.
MAX_ROWS_BYTES = 64 << 20
#: The newest rows of each kind kept (train rows every step of a long run; val rows and events are few).
MAX_ROWS_PER_KIND = 50_000
MAX_KINDS = 16
#: The most of a small pod-written file (status.json, the restarts list) read.
SMALL_FILE_BYTES = 64 << 10
#: The most of console.log read for its last lines.
LOG_TAIL_BYTES = 256 << 10


def _size(host: Host, path: str) -> int | None:
    """The size of the host's regular file ``path`` now, None when there is none (or it is not a file)."""
    stat = getattr(host, "stat", None)
    if stat is None:  # a host without stat: read_from's own bound
        return 1 << 62
    try:
        st = stat(path)
    except TransferError:
        return None
    return None if st is None or getattr(st, "is_dir", False) else int(st.size)


@dataclass(frozen=True)
class RunStatus:
    state: str  # running | finished | failed | stopped | starting | unknown
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    best_val_step: int | None = None  # the step of the lowest validation (the trainer's ``best`` checkpoint)
    tok_per_s: float | None = None
    mfu: float | None = None
    elapsed_s: float | None = None
    cost_usd: float | None = None  # metered on the pod (elapsed x price), else from our clock
    usd_per_hour: float | None = None
    projected_cost_usd: float | None = None
    eta_s: float | None = None
    finished_reason: str | None = None
    story: str | None = None  # the user's own command's end in one line (jobrun.py): "failed (exit 1: ...)"
    process_alive: bool | None = None
    last_event: str | None = None
    log_tail: tuple[str, ...] = field(default_factory=tuple)
    kept_usd_per_month: float | None = None  # a stopped pod's disk or a kept volume, billing monthly
    kept_note: str | None = None  # what is kept and how to end it
    restarts: int | None = None  # container starts after the first (vast: outbid, then resumed in place)
    billed_usd: float | None = None  # what the provider says the pod has billed so far (vast: its charges)
    bandwidth_usd: float | None = None  # of which data moved in and out (vast bills it per byte)
    contract_note: str | None = None  # the rental's end and a price increase asked, not accepted (vast)
    slow: str | None = None  # "slow: 41 % of plan (...)" (gpucli/pod/slowrun.py); None: not slow or no plan
    ended_by: str | None = None  # the path that ended the pod, from its watchdog.json (gpucli/runs/endedby.py)


#: The trainer's ``finished`` reasons that are a cap of the run's (``trainer/train.py``, ``stop_reason``);
#: the own-code runner writes ``stopped by cap: ...`` or ``stopped by you`` (``gpucli/pod/jobrun.py``).
CAP_REASONS = ("max_hours", "max_cost")
#: The watchdog's own ends that leave the run stopped (gpucli/pod/gpuidle.py, slowrun.py), read from
#: ``watchdog.json`` when the trainer's own reason is only the signal it got.
WATCHDOG_ENDS = ("idle: ", "slow: ")


def end_state(reason: str) -> str:
    """``stopped`` for an end a cap or a person made, else ``finished``: a run cut short by its cap did
    not finish its training."""
    return "stopped" if reason in CAP_REASONS or reason.startswith(WATCHDOG_ENDS + ("stopped ",)) else "finished"


def summarize(record: RunRecord, rows: Iterable[dict[str, Any] | MetricsRow], *, alive: bool | None,
              now: dt.datetime | None = None, log_tail: tuple[str, ...] = (), phase: str | None = None) -> RunStatus:
    """The run's state from its rows; ``phase``: the own-code runner's (``setup``/``run`` in its
    status.json), so that a job installing or loading says so before its first metric."""
    typed = as_rows(rows)
    train = [r for r in typed if r.kind == "train"]
    vals = [r for r in typed if r.kind == "val"]
    events = [r for r in typed if r.kind == "event"]
    ends = [i for i, e in enumerate(events) if e.event == "finished"]
    starts = [i for i, e in enumerate(events) if e.event in ("started", "resumed")]
    finished = events[ends[-1]] if ends else None
    if finished is not None and ((starts and starts[-1] > ends[-1]) or (finished.reason == "signal" and alive)):
        finished = None  # an earlier machine's end before a resume, or a signalled trainer still saving and exiting
    last = train[-1] if train else None
    step = last.step if last else None
    max_steps = record.limits.max_steps
    price = record.price_per_hour_usd
    now = now or dt.datetime.now(dt.timezone.utc)
    started = parse_iso(record.started_at)
    wall_s = (now - started).total_seconds() if started else None
    elapsed = last.elapsed_s if last else None
    if elapsed is None:
        elapsed = wall_s
    cost = last.cost_usd if last and last.cost_usd is not None else (
        None if price is None or wall_s is None else wall_s / 3600 * price)
    eta = None
    if step and max_steps and elapsed and step < max_steps and not finished:
        eta = (max_steps - step) * (elapsed / step)
    projected = None
    if price is not None and elapsed is not None:
        projected = (elapsed + (eta or 0)) / 3600 * price
        if eta is None and not finished and record.active and max_steps is None:
            # a job with no known step count (the user's own code) runs until it ends or a cap stops it
            caps = [c for c in (record.limits.budget_usd,
                                record.limits.max_hours * price if record.limits.max_hours else None) if c]
            projected = max(projected, min(caps)) if caps else None
    failed_reason = finished.reason or "" if finished is not None else ""
    if finished is not None and (finished.get("state") == "failed"
                                 or failed_reason.startswith(("failed", "setup failed"))):
        state = "failed"  # the user's own command (gpucli/pod/jobrun.py) exited non-zero
        if not log_tail and isinstance(finished.get("log_tail"), list):
            log_tail = tuple(str(x) for x in finished.get("log_tail"))
    elif finished is not None:
        state = end_state(failed_reason)
    elif record.status in ("stopped", "failed", "finished"):
        state = record.status
    elif alive is False:
        state = "failed" if not finished else "finished"
    elif alive:
        state = "running" if train or phase == "run" else "setting up" if phase == "setup" else "starting"
    else:
        state = record.status
    # nanochat logs bits per byte, not a loss: shown in the loss's place where no row has a loss
    val_of = (lambda v: v.val_loss) if any(v.val_loss is not None for v in vals) else (lambda v: v.val_bpb)
    scored = [v for v in vals if val_of(v) is not None]
    best_row = min(scored, key=val_of, default=None)
    best = val_of(best_row) if best_row else None
    if step is None and vals:
        step = vals[-1].step
    return RunStatus(
        state=state, step=step, max_steps=max_steps, loss=last.loss if last else None,
        val_loss=val_of(vals[-1]) if vals else None, best_val_loss=best,
        best_val_step=best_row.step if best_row else None,
        tok_per_s=last.tok_per_s if last else None, mfu=last.mfu if last else None,
        elapsed_s=elapsed, cost_usd=cost, usd_per_hour=price, projected_cost_usd=projected, eta_s=eta,
        finished_reason=finished.reason if finished else None, process_alive=alive,
        story=str(finished.get("story")) if finished and isinstance(finished.get("story"), str) else None,
        last_event=events[-1].event if events else None, log_tail=log_tail,
        slow=None if record.inputs.own is not None else slow_words([r.to_json() for r in typed],
                                                                     record.planned.tokens_per_s,
                                                                     record.limits.slow_below))


def read_head(host: Host, path: str, limit: int = SMALL_FILE_BYTES) -> bytes:
    """The first ``limit`` bytes of a small file the pod writes (status.json, restarts): a pod that
    makes it huge costs a bounded read."""
    data, _ = host.read_from(path, 0, limit)
    return data


def best_val(st: RunStatus) -> dict[str, Any]:
    """The best validation the status knows, as the run record keeps it for `ls`."""
    loss = st.best_val_loss
    ok = isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss)
    step = st.best_val_step
    return {"best_val_loss": float(loss) if ok else None,  # type: ignore[arg-type]
            "best_val_step": step if ok and isinstance(step, int) and step >= 0 else None}


def log_tail(host: Host, workdir: str, lines: int = 15) -> tuple[str, ...]:
    """The end of the trainer's console output (stdout and stderr: tracebacks land here; the
    trainer's own train.log holds its log lines only)."""
    path = f"{workdir}/console.log"
    size = _size(host, path)
    if not size:
        return ()
    start = max(0, size - LOG_TAIL_BYTES)  # only its end is read, however large the log is
    try:
        data, _ = host.read_from(path, start, min(size, LOG_TAIL_BYTES))
    except (TransferError, OSError):
        return ()
    text = data.decode(errors="replace").replace("\x00", "").splitlines()
    return tuple(line[-2000:] for line in text[-lines:])  # a line's end: where a traceback's exception is


def trainer_alive(host: Host, record: RunRecord) -> bool | None:
    """Whether the run's trainer is alive (None: it never started); a pid that another process has
    taken since is not alive."""
    return procs.alive(host, record, record.pid, record.pid_ident) if record.pid else None


def status_of(host: Host, record: RunRecord) -> RunStatus:
    rows = read_all_rows(host, record.workdir)
    alive = trainer_alive(host, record)
    tail = log_tail(host, record.workdir) if alive is False else ()
    phase = None
    if alive and record.inputs.own is not None and not any(r.get("kind") == "train" for r in rows):
        try:
            phase = json.loads(read_head(host, f"{record.workdir}/status.json")).get("phase")
        except (GpucliError, OSError, ValueError, AttributeError):
            phase = None
    st = summarize(record, rows, alive=alive, log_tail=tail, phase=phase)
    if alive is False and st.finished_reason in (None, "signal"):
        ended = watchdog_end(host, record)  # idle GPUs, a slow run replaced: the watchdog's words, not "signal"
        if ended is not None:
            st = dataclasses.replace(st, state="stopped", finished_reason=ended)
    return st


def replaces_slow(record: RunRecord, st: RunStatus) -> bool:
    """The run's pod ended its slow run for another (``--replace-slow``): a watcher continues it on a new
    pod (:func:`gpucli.run.life.lifecycle.watch`); the run is not over."""
    return bool(record.limits.replace_slow and record.instance_id and st.state == "stopped"
                and (st.finished_reason or "").startswith("slow: "))


def watchdog_end(host: Host, record: RunRecord) -> str | None:
    """The watchdog's verdict when it ended the run for idle GPUs or slowness (``watchdog.json``), else None."""
    try:
        verdict = json.loads(read_head(host, f"{record.workdir}/watchdog.json")).get("verdict")
    except (GpucliError, OSError, ValueError, AttributeError):
        return None
    return verdict if isinstance(verdict, str) and verdict.startswith(WATCHDOG_ENDS) else None


def stop_trainer(host: Host, record: RunRecord, *, timeout_s: float = 120.0,
                 on_event: Callable[[str], None] = lambda m: None) -> bool:
    """SIGTERM the trainer's process group (it writes its emergency checkpoint), wait for it to
    exit, then SIGKILL if it outlives ``timeout_s``. Returns whether it had been running.

    The recorded pid is the detached shell that started the trainer; on SIGTERM that shell dies at
    once while python (or torchrun and its workers) keeps running to write the emergency checkpoint.
    Waiting for the pid alone would let ``down`` terminate the pod in the middle of that write, so
    :func:`trainer_alive` asks about the whole process group."""
    if not record.pid or not trainer_alive(host, record):
        return False
    own = record.inputs.own is not None
    if own:  # the job's runner tells this apart from a cap or a provider's SIGTERM (its end story)
        try:
            host.write_file(f"{record.workdir}/stop_reason", b"by you\n", mode=0o644)
        except (GpucliError, OSError):
            pass
    on_event(f"sending SIGTERM to the {'job' if own else 'trainer'} (pid {record.pid})"
             + ("" if own else "; it writes an emergency checkpoint"))
    if procs.signal(host, record, record.pid, record.pid_ident, "TERM") != "sent":
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not trainer_alive(host, record):  # the whole group (procs.alive), not the shell that led it
            return True
        time.sleep(0.5)
    on_event(f"trainer still alive after {timeout_s:.0f} s; sending SIGKILL")
    procs.signal(host, record, record.pid, record.pid_ident, "KILL")
    return True
