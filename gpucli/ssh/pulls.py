"""Downloads over several SFTP channels at once: one big file in segments, a folder's or a
checkpoint's files side by side (see :mod:`gpucli.ssh.parallel` for why a long link needs them).
:class:`gpucli.ssh.files.Files` builds on this; the resume records are :mod:`gpucli.ssh.segments`.
"""

from __future__ import annotations

import os
import posixpath
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucli.errors import TransferError
from gpucli.ssh.connection import POOL_INFLIGHT_BYTES, POOL_WINDOW_BYTES, Connection
from gpucli.ssh.parallel import (
    MAX_CHANNELS,
    SEGMENT_BYTES,
    Ramp,
    Segment,
    Serial,
    channels_for,
    is_long,
    run_segments,
)
from gpucli.ssh.segments import DownFile
from gpucli.ssh.sftp import read_range
from gpucli.ssh.target import DownloadStats
from gpucli.ssh.transfer import ProgressFn, RemoteFile, TransferProgress


def emit(progress: ProgressFn | None, *args: Any) -> None:
    if progress is not None:
        progress(TransferProgress(*args))


class ParallelDownloads(Connection):
    """The segment and many-file download paths of :class:`gpucli.ssh.files.Files`."""

    def _tree_channels(self, todo: list[RemoteFile], total: int) -> int:
        """Files cost round trips of their own (open, read, close), so a long link gets a channel
        per file up to the cap, and more when the bytes need them."""
        if not todo:
            return 1
        with self._io("measuring the round trip"):
            rtt = self.measure_rtt()
        by_bytes = channels_for(rtt, POOL_WINDOW_BYTES, total)
        by_files = min(MAX_CHANNELS, len(todo)) if is_long(rtt) else 1
        return max(by_bytes, by_files)

    def _fetch(self, files: list[DownFile], items: list[Segment], n: int,
               on_bytes: Callable[[int, DownFile], None], on_file: Callable[[DownFile], None]) -> None:
        """Fetch ``items`` (segments of ``files``, opened) over ``n`` pooled SFTP channels, adding
        channels while they are all window-bound; ``on_file`` runs once a file is complete."""
        by_key = {f.rpath: f for f in files}
        active = list(self._sftp_pool(n))
        ramp = Ramp(self.rtt_s or 0.0, POOL_WINDOW_BYTES, MAX_CHANNELS)

        def work(client: Any, s: Segment) -> None:
            f = by_key[s.key]
            pos = s.start

            def sink(data: memoryview) -> None:
                nonlocal pos
                f.write(data, pos)
                pos += len(data)
                ramp.add(len(data))
                on_bytes(len(data), f)

            read_range(client, f.rpath, s.start, s.end - s.start, sink, max_read=self._max_read,
                       inflight_bytes=POOL_INFLIGHT_BYTES)
            if pos != s.end:
                raise TransferError(f"{f.rpath} changed size while downloading ({pos} of {f.size} bytes)",
                                    hint="run the same command again")

        def on_done(s: Segment) -> None:
            f = by_key[s.key]
            f.segment_done(s)
            if f.complete:
                on_file(f)

        def more() -> Any | None:
            if channels_grow and ramp.more(len(active)):
                active.append(self._sftp_pool(len(active) + 1)[-1])
                return active[-1]
            return None

        channels_grow = n > 1
        run_segments(items, active, work, on_done=on_done, more_client=more)

    def _download_segments(self, rpath: str, dest: Path, size: int, mtime: int, sha256: str | None,
                           progress: ProgressFn | None, n: int, started: float) -> DownloadStats:
        f = DownFile(rpath, dest, size, mtime, SEGMENT_BYTES, want_sha=bool(sha256))
        digest: list[str | None] = [None]
        try:
            items = f.open()
            done = [f.resumed]
            emit(progress, f.resumed, size, 0, 1, rpath)
            last = [time.monotonic()]

            def on_bytes(k: int, _f: DownFile) -> None:
                done[0] += k
                now = time.monotonic()
                if now - last[0] > 0.1 or done[0] == size:
                    last[0] = now
                    emit(progress, done[0], size, 0, 1, rpath)

            def on_file(_f: DownFile) -> None:
                digest[0] = f.finish()

            self._fetch([f], items, n, Serial(on_bytes), on_file)
        finally:
            f.close()
        if sha256 and digest[0] != sha256.lower():
            f.partial.unlink(missing_ok=True)
            f.meta.unlink(missing_ok=True)
            raise TransferError(f"{rpath}: sha256 mismatch (got {digest[0]}, expected {sha256})",
                                hint=f"the previous {dest.name} was left untouched; the remote file "
                                     f"may be corrupt or still being written")
        os.utime(f.partial, (mtime, mtime))
        os.replace(f.partial, dest)
        f.meta.unlink(missing_ok=True)
        return DownloadStats(size, size - f.resumed, f.resumed, time.monotonic() - started, digest[0])

    def _download_tree_segments(self, rdir: str, root: Path, todo: list[RemoteFile], total: int,
                                progress: ProgressFn | None, n: int) -> None:
        files = [DownFile(posixpath.join(rdir, r.rel), root / r.rel, r.size, r.mtime, SEGMENT_BYTES,
                          want_sha=False) for r in todo]
        labels = {f.rpath: r.rel for f, r in zip(files, todo, strict=True)}
        self._download_many(files, total, progress, n, labels, {})

    def _download_many(self, files: list[DownFile], total: int, progress: ProgressFn | None, n: int,
                       labels: dict[str, str], want: dict[str, str | None]) -> None:
        """Fetch ``files`` over ``n`` channels, one progress bar for all; each file is checked
        against ``want[rpath]`` (a sha256) when given and renamed into place when complete."""
        state = {"bytes": 0, "files": 0}
        last = [time.monotonic()]
        try:
            items: list[Segment] = []
            for f in files:
                items += f.open()
                state["bytes"] += f.resumed

            def on_bytes(k: int, f: DownFile) -> None:
                state["bytes"] += k
                now = time.monotonic()
                if now - last[0] > 0.1:
                    last[0] = now
                    emit(progress, state["bytes"], total, state["files"], len(files), labels[f.rpath])

            def on_file(f: DownFile) -> None:
                f.digest = f.finish()
                expected = want.get(f.rpath)
                if expected and f.digest != expected.lower():
                    f.partial.unlink(missing_ok=True)
                    f.meta.unlink(missing_ok=True)
                    raise TransferError(f"{f.rpath}: sha256 mismatch (got {f.digest}, expected {expected})",
                                        hint=f"the previous {f.dest.name} was left untouched; the remote "
                                             f"file may be corrupt or still being written")
                os.utime(f.partial, (f.mtime, f.mtime))
                os.replace(f.partial, f.dest)
                f.meta.unlink(missing_ok=True)
                state["files"] += 1
                emit(progress, state["bytes"], total, state["files"], len(files), labels[f.rpath])

            self._fetch(files, items, n, Serial(on_bytes), on_file)
        finally:
            for f in files:
                f.close()

