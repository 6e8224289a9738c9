"""``gpucli logs``: the job's raw console output (``console.log`` in the run's folder: everything the
bundled trainer or your own command printed, not only the metrics gpucli parses).

Read by byte offset in bounded chunks (base64 over the SSH command, so an offset is exact whatever
the bytes are), whole lines only: following resumes at the offset it reached after a dropped
connection, and a file that shrank (replaced) is read again from its start. Every read carries the
pod's clock, which the command shows. ``--since`` keeps the lines from a time on, by the timestamps
the lines carry (the bundled trainer's ``YYYY-MM-DD HH:MM:SS``, ISO 8601, most loggers'); lines
without one go with the line before them.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import re
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import ConnectionFailed, GpucliError, TransferError, UsageError
from gpucli.run.watch.monitor import trainer_alive

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

FILE = "console.log"
CHUNK_BYTES = 1 << 20  # one read
TAIL_BYTES = 64 << 10  # without --since: the end of the log, from a line start
_STAMP = re.compile(rb"^\s*\[?(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,]\d+)?(Z|[+-]\d{2}:?\d{2})?")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")


@dataclass(frozen=True)
class LogChunk:
    lines: tuple[bytes, ...]  # whole lines, without their newline
    offset: int  # where the next read starts
    size: int  # the file's size at this read
    pod_time: float  # the pod's clock at this read (epoch s)
    restarted: bool = False  # the file shrank since the last read: read again from its start


def for_node(record: RunRecord, node: int | None) -> RunRecord:
    """The record of node ``node`` of a run over several machines (rank 0: the run itself)."""
    if not node:
        return record
    for n in record.nodes:
        if n.rank == node:
            return dataclasses.replace(record, workdir=n.workdir, ssh=n.ssh or record.ssh,
                                       instance_id=n.instance_id or record.instance_id, pid=n.pid,
                                       pid_ident=n.pid_ident)
    count = 1 + len(record.nodes)
    raise UsageError(f"run {record.name} has no node {node} (it runs on {count} node{'s' if count > 1 else ''}: "
                     f"0{f'..{count - 1}' if count > 1 else ''})")


def parse_since(text: str, now: float) -> float:
    """``30s``, ``10m``, ``2h``, ``1d`` before ``now`` (the pod's clock), or an ISO 8601 time (UTC
    when it names no zone) -> epoch seconds."""
    t = text.strip()
    m = _DURATION.match(t)
    if m:
        return now - float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {text!r}: expected a duration (30s, 10m, 2h, 1d) or a time "
                         "(2026-01-31T14:00, UTC unless a zone is given)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def line_time(line: bytes) -> float | None:
    """The timestamp a log line starts with (UTC when it names no zone), or None."""
    m = _STAMP.match(line)
    if not m:
        return None
    zone = (m[3] or b"Z").decode()
    try:
        return dt.datetime.fromisoformat(f"{m[1].decode()}T{m[2].decode()}{'+00:00' if zone == 'Z' else zone}").timestamp()
    except ValueError:
        return None


class SinceFilter:
    """Lines from ``since`` on: a line's own timestamp decides, a line without one goes with the line
    before it. Before the first stamped line it waits (the lines are held) for the first stamp."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.keep: bool | None = None
        self.held: list[bytes] = []
        self.stamped = False

    def feed(self, lines: tuple[bytes, ...]) -> list[bytes]:
        out: list[bytes] = []
        for line in lines:
            t = line_time(line)
            if t is not None:
                self.stamped = True
                self.keep = t >= self.since
                if self.held:
                    if self.keep:
                        out.extend(self.held)
                    self.held = []
            if self.keep is None:
                self.held.append(line)
                if len(self.held) > 10_000:  # no stamps at all so far: not held without end
                    self.held = self.held[-10_000:]
            elif self.keep:
                out.append(line)
        return out

    def flush(self) -> list[bytes]:
        """At the end of a read with no stamp seen: the held lines (nothing to filter them by)."""
        held, self.held = self.held, []
        return held


def read_chunk(host: Host, path: str, offset: int, *, max_bytes: int = CHUNK_BYTES) -> LogChunk:
    """Whole lines from ``offset`` on (at most ``max_bytes``), with the file's size and the pod's clock."""
    q = shlex.quote(path)
    script = (f"date +%s.%N 2>/dev/null || date +%s; if [ -f {q} ]; then "
              f"s=$(stat -c %s {q} 2>/dev/null || wc -c < {q}); echo $s; "
              f"tail -c +{int(offset) + 1} {q} 2>/dev/null | head -c {int(max_bytes)} | base64; "
              f"else echo -1; fi")
    res = host.run(script, timeout_s=60, check=False)
    head = res.stdout.split("\n", 2)
    try:
        pod_time = float(head[0].strip().replace("N", "0") or "nan")
        size = int(head[1].strip())
    except (IndexError, ValueError) as exc:
        # no clock and size came back: the session ended under the command (a dropped connection)
        raise ConnectionFailed(f"could not read {path} on the host (exit {res.exit_code}): "
                               f"{(res.stderr or res.stdout).strip()[:200]}") from exc
    if size < 0:
        return LogChunk((), 0, -1, pod_time)
    restarted = size < offset
    if restarted:
        return dataclasses.replace(read_chunk(host, path, 0, max_bytes=max_bytes), restarted=True)
    try:
        data = base64.b64decode("".join(head[2].split()) if len(head) > 2 else "")
    except ValueError as exc:
        raise GpucliError(f"could not read {path} on the host: bad transfer ({exc})") from exc
    cut = data.rfind(b"\n") + 1
    if cut == 0 and len(data) >= max_bytes:
        cut = len(data)  # one line longer than a chunk: shown in pieces
    lines = tuple(data[:cut].splitlines())
    return LogChunk(lines, offset + cut, size, pod_time)


def start_offset(host: Host, path: str, tail_bytes: int = TAIL_BYTES) -> int:
    """Where a read without --since starts: the first line start in the last ``tail_bytes``."""
    first = read_chunk(host, path, 0, max_bytes=1)
    if first.size <= tail_bytes:
        return 0
    probe = read_chunk(host, path, first.size - tail_bytes, max_bytes=tail_bytes)
    skipped = probe.lines[0] if probe.lines else b""
    return first.size - tail_bytes + len(skipped) + 1


def follow(host_factory: Callable[[], Host], record: RunRecord, offset: int, *, poll_s: float = 1.0,
           on_reconnect: Callable[[str], None] | None = None, reconnect_deadline_s: float = 300.0,
           check_every_s: float = 5.0, forever: bool = False, path: str | None = None) -> Iterator[LogChunk]:
    """Chunks from ``offset`` as the log grows; across dropped connections (a fresh host from
    ``host_factory``, the same offset) until ``reconnect_deadline_s`` passes without one. Ends once
    the job's process is gone and the log has nothing more (never, with ``forever``). ``path``: another log of
    the run's folder (a detached exec's, which ends once its status file is there)."""
    if not 0 < poll_s <= 3600:
        raise UsageError(f"--poll must be a number of seconds in (0, 3600], got {poll_s}")
    own = path is not None and path != f"{record.workdir}/{FILE}"
    path = path or f"{record.workdir}/{FILE}"
    host = host_factory()
    down_since: float | None = None
    delay = 0.5
    checked = -float("inf")
    try:
        while True:
            try:
                chunk = read_chunk(host, path, offset)
                offset = chunk.offset
                gone = False
                if not chunk.lines and not forever and time.monotonic() - checked >= check_every_s:
                    checked = time.monotonic()
                    gone = host.exists(path.removesuffix(".out") + ".rc") if own else \
                        trainer_alive(host, record) is False
                down_since, delay = None, 0.5
            except (TransferError, ConnectionFailed, OSError) as exc:
                down_since = down_since or time.monotonic()
                host, delay = reconnect(host, host_factory, exc, down_since, delay, reconnect_deadline_s,
                                        on_reconnect, f" at byte {offset}")
                continue
            yield chunk
            if gone:
                last = read_chunk(host, path, offset)  # what it wrote as it ended
                if last.lines:
                    yield last
                return
            if not chunk.lines:
                time.sleep(poll_s)
    finally:
        host.close()


def reconnect(host: Any, host_factory: Callable[[], Any], exc: BaseException, down_since: float, delay: float,
              deadline_s: float, on_reconnect: Callable[[str], None] | None, where: str = "") -> tuple[Any, float]:
    """One step of a follower's reconnection after ``exc``: re-raised once the connection has been down
    for ``deadline_s``; otherwise said, slept with back-off, and the host opened again. Returns the host
    (a new one, or the old when opening failed: the next read fails again) and the next delay."""
    if time.monotonic() - down_since > deadline_s:
        raise exc
    if on_reconnect:
        on_reconnect(f"connection lost ({exc}); reconnecting{where}")
    time.sleep(delay)
    try:
        host.close()
        host = host_factory()
    except (ConnectionFailed, OSError, TransferError):
        pass
    return host, min(delay * 2, 10.0)
