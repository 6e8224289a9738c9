"""Following a run as ``gpucli tail`` shows it: its metrics rows as they come, what it is doing before
its first training step, and its end, a failure included.

Before the first step a run is preparing data (the progress rows trainer/data/progress.py appends to the
run folder's prepare.jsonl), loading or compiling (the last line of its train.log, else of its
console); a run whose trainer died without a ``finished`` event ends the follow with the console's
last lines instead of waiting forever for rows that never come.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import ConnectionFailed, GpucliError, TransferError, UsageError
from gpucli.run.watch.gpuwatch import GpuReport, read_report
from gpucli.run.watch.logs import reconnect
from gpucli.run.watch.monitor import (
    LOG_TAIL_BYTES,
    RunStatus,
    _size,
    log_tail,
    parse_rows,
    summarize,
    trainer_alive,
)
from gpucli.runs import records
from trainer.spec.metricsrow import as_rows

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

PREPARE_PROGRESS = "prepare.jsonl"  # in the run folder: data preparation's progress rows
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
FIRST_STEP = "running the first step (on a GPU the first steps compile the model)"
STARTING = "starting (loading Python and torch)"


@dataclass(frozen=True)
class TailUpdate:
    """One read of a run: its new metrics rows; until its first training step, what it is doing
    (``activity``); once it is over, its final status (``end``, with the console's last lines)."""

    rows: tuple[dict[str, Any], ...] = ()
    activity: str | None = None
    end: RunStatus | None = None
    gpus: GpuReport | None = None  # read now and then (None: not read this time)


GPU_EVERY_S = 15.0  # how often following reads the host's GPU samples


def prepare_line(row: dict[str, Any]) -> str | None:
    """A preparation progress row (trainer/data/progress.py) in words."""
    done, total = row.get("bytes_read"), row.get("bytes_total")
    if not isinstance(done, (int, float)) or not isinstance(total, (int, float)):
        return None
    text = f"preparing data: {done / 1e6:,.1f}/{total / 1e6:,.1f} MB read"
    if isinstance(row.get("tokens"), int):
        text += f", {row['tokens']:,} tokens"
    eta = row.get("eta_s")
    if isinstance(eta, (int, float)) and not row.get("done"):
        text += f", ETA {eta:.0f}s"
    return text


class _Files:
    """The run's other files, each read on from where the last read stopped, whole lines only."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.offsets: dict[str, int] = {}
        self.last: dict[str, str] = {}

    def last_line(self, host: Host, name: str, *, progress: bool = False) -> str | None:
        # Only the end of a log matters, and only what it held when this read began: a huge or endlessly
        # growing file is neither read whole nor followed forever here.
        end = _size(host, f"{self.workdir}/{name}")
        if end is None:
            return self.last.get(name)
        offset = self.offsets.get(name, max(0, end - LOG_TAIL_BYTES))
        if end < offset:  # truncated or replaced
            offset = max(0, end - LOG_TAIL_BYTES)
        while offset < end:
            try:
                data, _ = host.read_from(f"{self.workdir}/{name}", offset, end - offset)
            except (TransferError, OSError):
                break  # not written (yet)
            cut = data.rfind(b"\n") + 1  # a half-written line is read again next time
            if cut == 0:
                break
            if progress:
                rows, _ = parse_rows(data[:cut])
                line = next((t for r in reversed(rows) if (t := prepare_line(r))), None)
            else:
                # a line as a terminal shows it: the last carriage-return segment, without colours
                text = _ANSI.sub("", data[:cut].decode(errors="replace"))
                line = next((seg.strip()[:200] for ln in reversed(text.split("\n"))
                             if (seg := ln.rstrip("\r").rsplit("\r", 1)[-1]).strip()), None)
            if line:
                self.last[name] = line
            offset += cut
        self.offsets[name] = offset
        return self.last.get(name)

    def activity(self, host: Host, rows: list[dict[str, Any]]) -> str | None:
        typed = as_rows(rows)
        if any(r.kind == "train" for r in typed):
            return None
        started = next((r for r in typed if r.kind == "event" and r.event == "started"), None)
        if started is not None:
            if "command" in started.extra:  # the user's own command (jobrun.py): its own last words, no compiling
                return self.last_line(host, "train.log") or "running (no metrics yet)"
            return FIRST_STEP
        prep = self.last_line(host, PREPARE_PROGRESS, progress=True)
        log = self.last_line(host, "train.log")
        if prep and (log is None or log.startswith("prepare")):
            return prep
        return log or self.last_line(host, "console.log") or STARTING


def _read_rows(host: Host, workdir: str, offset: int, tail: bytes) -> tuple[list[dict[str, Any]], int, bytes]:
    """Every metrics row after ``offset`` (``tail``: the incomplete line before it), the new offset and tail."""
    rows: list[dict[str, Any]] = []
    end = _size(host, f"{workdir}/metrics.jsonl")  # what is there now: the next poll reads the rest
    if end is not None and end < offset:  # truncated or replaced: read again from its start
        offset, tail = 0, b""
    while end is not None and offset < end:
        data, offset2 = host.read_from(f"{workdir}/metrics.jsonl", offset, min(8 << 20, end - offset))
        if not data:
            return rows, offset, tail
        got, tail = parse_rows(tail + data)
        rows.extend(got)
        offset = offset2
    return rows, offset, tail


def _finished(rows: list[dict[str, Any]]) -> bool:
    return any(r.kind == "event" and r.event == "finished" for r in as_rows(rows))


_OVER = ("failed", "stopped", "finished")


def _gone(host: Host, record: RunRecord) -> bool | None:
    """True: the trainer was started and is gone; False: it lives; None: not started yet (the launch
    is still provisioning). A record that ended before its trainer started counts as gone."""
    alive = trainer_alive(host, record)
    if alive is None:
        return True if record.status in _OVER else None
    return not alive


def _activity(files: _Files, host: Host, record: RunRecord, rows: list[dict[str, Any]]) -> str | None:
    if record.pid is None and record.status not in _OVER:
        return f"{record.status}: the launch has not started the trainer yet"
    return files.activity(host, rows)


def _end(host: Host, record: RunRecord, rows: list[dict[str, Any]], gone: bool) -> RunStatus:
    return summarize(record, rows, alive=False if gone else None,
                     log_tail=log_tail(host, record.workdir) if gone else ())


def _reloaded(record: RunRecord) -> RunRecord:
    """The record as the launch (another process) has written it since."""
    try:
        return records.load(record.name)
    except GpucliError:
        return record


def snapshot(host: Host, record: RunRecord) -> TailUpdate:
    """The run as it is now: every row so far, what it is doing before its first step, and its end
    when it is over (finished, or its trainer gone)."""
    rows, offset, tail = _read_rows(host, record.workdir, 0, b"")
    activity = _activity(_Files(record.workdir), host, record, rows)
    if _finished(rows):
        return TailUpdate(tuple(rows), activity, _end(host, record, rows, gone=False))
    if _gone(host, record):
        rows += _read_rows(host, record.workdir, offset, tail)[0]  # what it wrote as it died
        return TailUpdate(tuple(rows), activity, _end(host, record, rows, gone=True))

    return TailUpdate(tuple(rows), activity, gpus=read_report(host, record))


def follow_run(host_factory: Callable[[], Host], record: RunRecord, *, poll_s: float = 1.0,
               on_reconnect: Callable[[str], None] | None = None, reconnect_deadline_s: float = 300.0,
               check_every_s: float = 5.0) -> Iterator[TailUpdate]:
    """Follow a run until it is over: its new rows as they are written, what it is doing until its
    first step, and a last update whose ``end`` is its final status.

    It ends at the trainer's ``finished`` event, and also when the trainer's process is gone without
    one (a crash, an import error, a kill). Whether the process lives is checked when no row came, at
    most every ``check_every_s``. A dropped connection is reconnected with backoff (``host_factory``
    makes a fresh one) until ``reconnect_deadline_s`` passes without success."""
    if not 0 < poll_s <= 3600:  # also refuses NaN; checked here, before anything is followed
        raise UsageError(f"--poll must be a number of seconds in (0, 3600], got {poll_s}")
    return _follow(host_factory, record, poll_s, on_reconnect, reconnect_deadline_s, check_every_s)


def _follow(host_factory: Callable[[], Host], record: RunRecord, poll_s: float,
            on_reconnect: Callable[[str], None] | None, reconnect_deadline_s: float,
            check_every_s: float) -> Iterator[TailUpdate]:
    workdir = record.workdir
    files = _Files(workdir)
    seen: list[dict[str, Any]] = []
    offset, tail = 0, b""
    host = host_factory()
    down_since: float | None = None
    delay = 0.5
    checked = -float("inf")
    gpu_read = -float("inf")
    try:
        while True:
            end = None
            try:
                rows, offset, tail = _read_rows(host, workdir, offset, tail)
                seen.extend(rows)
                if _finished(rows):
                    end = _end(host, record, seen, gone=False)
                elif not rows and time.monotonic() - checked >= check_every_s:
                    checked = time.monotonic()
                    if record.pid is None:
                        record = _reloaded(record)
                    if _gone(host, record):
                        more, offset, tail = _read_rows(host, workdir, offset, tail)  # its last words
                        rows, seen = rows + more, seen + more
                        end = _end(host, record, seen, gone=True)
                activity = _activity(files, host, record, seen)
                gpus = None
                if time.monotonic() - gpu_read >= GPU_EVERY_S:
                    gpu_read, gpus = time.monotonic(), read_report(host, record)
                down_since, delay = None, 0.5
            except (TransferError, ConnectionFailed, OSError) as exc:
                down_since = down_since or time.monotonic()
                host, delay = reconnect(host, host_factory, exc, down_since, delay, reconnect_deadline_s,
                                        on_reconnect)
                continue
            yield TailUpdate(tuple(rows), activity, end, gpus)
            if end is not None:
                return
            if not rows:
                time.sleep(poll_s)
    finally:
        host.close()
