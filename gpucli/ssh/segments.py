"""The resume records of parallel transfers: which segments of a file are already on the other side.

A file sent over several channels at once is written out of order, so its partial copy is not a
prefix any more and its size says nothing about what is there. Each side keeps a record instead,
written before the first byte moves and updated as segments complete (the record may lag behind the
data, never run ahead of it):

- download: ``LOCAL.partial.json`` gains ``seg`` (segment size) and ``done`` (segment numbers) beside
  the remote path, size and mtime it always held; a record without ``seg`` is the single-channel
  kind, whose partial is a prefix;
- upload: a sidecar next to the remote part, ``.NAME.SIZE.MTIME.ranges.gpucli-part`` (hidden and
  skipped like every part), holding the same fields; a part without a sidecar is the single-channel
  kind.

:class:`DownFile` also keeps the sha256 of a download in order while segments arrive out of order: it
hashes each segment from the local file once every segment before it is in (the bytes are still in
the page cache), so verifying costs no second pass over the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from gpucli.ssh.parallel import Segment, plan_segments
from gpucli.ssh.transfer import PART_SUFFIX

__all__ = ["DownFile", "Sidecar", "parse_record", "record", "sidecar_name"]


def sidecar_name(part_rel: str) -> str:
    """The sidecar of an upload part: a part name itself, so listings and downloads skip it."""
    return part_rel[: -len(PART_SUFFIX)] + ".ranges" + PART_SUFFIX


def parse_record(raw: bytes | str, size: int, mtime: int) -> tuple[int, set[int]] | None:
    """(segment size, done segments) from a record for a file of ``size`` and ``mtime``, or None
    when it belongs to another version or is unreadable (a cut mid-write)."""
    try:
        rec = json.loads(raw)
        if rec.get("size") != size or rec.get("mtime") != mtime:
            return None
        seg = int(rec["seg"])
        done = {int(i) for i in rec["done"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if seg <= 0 or any(i < 0 or i * seg >= max(size, 1) for i in done):
        return None
    return seg, done


class DownFile:
    """One remote file downloaded in segments into ``dest.partial`` (written with ``pwrite`` from
    any thread), with its resume record and an in-order sha256."""

    def __init__(self, rpath: str, dest: Path, size: int, mtime: int, seg: int, *, want_sha: bool) -> None:
        self.rpath, self.dest, self.size, self.mtime = rpath, dest, size, mtime
        self.partial = dest.with_name(dest.name + ".partial")
        self.meta = dest.with_name(dest.name + ".partial.json")
        self.seg = seg
        self.done: set[int] = set()
        self.hasher = hashlib.sha256() if want_sha else None
        self._hashed = 0  # segments hashed, in order
        self.fd = -1
        self.resumed = 0
        self.digest: str | None = None

    def open(self) -> list[Segment]:
        """Pick up a previous partial (a parallel one by its record, a single-channel one by its
        length), write the record, and return the segments still to fetch."""
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        source = {"path": self.rpath, "size": self.size, "mtime": self.mtime}
        done: set[int] = set()
        if self.partial.exists() and self.meta.exists():
            with contextlib.suppress(ValueError, OSError):
                raw = self.meta.read_text()
                rec = json.loads(raw)
                if isinstance(rec, dict) and rec.get("path") == self.rpath:
                    got = parse_record(raw, self.size, self.mtime)
                    if got is not None:
                        self.seg, done = got
                    elif {k: rec.get(k) for k in source} == source and "seg" not in rec:
                        prefix = min(self.partial.stat().st_size, self.size)
                        done = set(range(prefix // self.seg))
        if not done:
            self.partial.unlink(missing_ok=True)  # new, not truncated: see Files.download
        self.fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        self.done = done
        self.resumed = sum(s.end - s.start for s in plan_segments("", self.size, self.seg)
                           if s.index in done)
        self._write_meta()
        return plan_segments(self.rpath, self.size, self.seg, done)

    def _write_meta(self) -> None:
        rec = {"path": self.rpath, "size": self.size, "mtime": self.mtime, "seg": self.seg,
               "done": sorted(self.done)}
        tmp = self.meta.with_name(self.meta.name + ".tmp")
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, self.meta)

    def write(self, data: memoryview, pos: int) -> None:
        while data:
            n = os.pwrite(self.fd, data, pos)
            data, pos = data[n:], pos + n

    def segment_done(self, s: Segment) -> None:
        """Record ``s`` (callers serialise this) and hash what is now contiguous from the start."""
        self.done.add(s.index)
        self._write_meta()
        if self.hasher is not None:
            while self._hashed in self.done:
                start = self._hashed * self.seg
                end = min(self.size, start + self.seg)
                while start < end:
                    block = os.pread(self.fd, min(1 << 20, end - start), start)
                    if not block:
                        raise OSError(f"{self.partial} is shorter than its record says")
                    self.hasher.update(block)
                    start += len(block)
                self._hashed += 1

    @property
    def complete(self) -> bool:
        return len(self.done) >= max(1, -(-self.size // self.seg))

    def finish(self) -> str | None:
        """Close the partial; return its sha256 when asked for (the caller checks it and renames)."""
        self.close()
        return self.hasher.hexdigest() if self.hasher is not None else None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def record(size: int, mtime: int, seg: int, done: Any) -> bytes:
    """The resume record of an upload: what :func:`parse_record` reads back."""
    return json.dumps({"size": size, "mtime": mtime, "seg": seg, "done": sorted(done)}).encode()


class Sidecar:
    """The remote resume record of a parallel upload, written by one background thread that always
    writes the latest state (a slow link coalesces updates instead of stalling the senders)."""

    def __init__(self, write: Any, path: str, size: int, mtime: int, seg: int, done: set[int], *,
                 written: bool = False) -> None:
        self._write = write  # (remote path, bytes) -> None, on a channel no sender uses
        self.path, self.size, self.mtime, self.seg = path, size, mtime, seg
        self.done = set(done)
        self._dirty = threading.Event()
        self._stop = False
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        if not written:  # the caller wrote the first record itself (batched with others)
            self._flush_now()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpucli-sidecar")
        self._thread.start()

    def _payload(self) -> bytes:
        with self._lock:
            done = sorted(self.done)
        return record(self.size, self.mtime, self.seg, done)

    def _flush_now(self) -> None:
        self._write(self.path, self._payload())

    def add(self, index: int) -> None:
        with self._lock:
            self.done.add(index)
        self._dirty.set()

    def _loop(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()
            if self._stop:
                return
            try:
                self._flush_now()
            except BaseException as exc:  # noqa: BLE001  # the record only lags; the data is fine
                self.error = exc
                return

    def close(self) -> None:
        self._stop = True
        self._dirty.set()
        self._thread.join(30)

