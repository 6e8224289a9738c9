"""File operations of :class:`gpucli.ssh.Remote` over its SFTP session: small files written
atomically, reads and tails of logs, one-round-trip listings, and resumable downloads of files and
checkpoint folders. The bytes move through the pipelined paths of :mod:`gpucli.ssh.sftp`.

A download goes to ``LOCAL.partial`` (with ``LOCAL.partial.json`` naming the remote size and mtime it
belongs to) and continues from there after a cut. Many small downloads in one process run faster
after :func:`gpucli.ssh.tune_heap_for_downloads` (a process-wide choice the command makes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import shlex
import stat as st
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import TransferError
from gpucli.ssh.batch import Batch
from gpucli.ssh.connection import POOL_WINDOW_BYTES, norm
from gpucli.ssh.parallel import (
    MAX_CHANNELS,
    SEGMENT_BYTES,
    channels_for,
    is_long,
)
from gpucli.ssh.pulls import ParallelDownloads, emit
from gpucli.ssh.segments import DownFile
from gpucli.ssh.sftp import read_range
from gpucli.ssh.target import DownloadStats, RemoteStat, SyncStats
from gpucli.ssh.transfer import (
    ProgressFn,
    RemoteFile,
    TransferProgress,
    is_part,
    manifest_command,
    parse_manifest,
    sha256_file,
)

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)


class Files(ParallelDownloads):
    """Files on the remote host: small-file reads and writes, listings, tails and downloads."""

    def write_env_file(self, remote_path: str, env: Mapping[str, str]) -> None:
        """Write ``KEY='value'`` lines, mode 0600, for :meth:`start_detached` to source. The values
        travel inside the SFTP stream only, never on a command line."""
        lines = []
        for key, value in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"not an environment variable name: {key!r}")
            lines.append(f"{key}={shlex.quote(value)}\n")
        self.write_file(remote_path, "".join(lines).encode(), mode=0o600)

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` atomically: a temp file in the same folder, chmod *before* any byte is
        written (secrets never sit in a world-readable file), then rename over the target."""
        path = norm(remote_path)
        tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.gpucli-tmp")
        with self._io(f"writing {path}"):
            sftp = self._sftp_client()
            with sftp.open(tmp, "wb") as fh:
                sftp.chmod(tmp, mode)
                fh.set_pipelined(True)
                fh.MAX_REQUEST_SIZE = self._max_write
                fh.write(data)
            sftp.posix_rename(tmp, path)

    def read_file(self, remote_path: str) -> bytes:
        path = norm(remote_path)
        with self._io(f"reading {path}"):
            sftp = self._sftp_client()
            size = sftp.stat(path).st_size or 0
            parts: list[bytes] = []
            read_range(sftp, path, 0, size, lambda b: parts.append(bytes(b)),
                       max_read=self._max_read)
            return b"".join(parts)

    def stat(self, remote_path: str) -> RemoteStat | None:
        """None when the path does not exist."""
        path = norm(remote_path)
        with self._io(f"stat {path}"):
            try:
                a = self._sftp_client().stat(path)
            except FileNotFoundError:
                return None
        mode = a.st_mode or 0
        return RemoteStat(a.st_size or 0, int(a.st_mtime or 0), st.S_IMODE(mode), st.S_ISDIR(mode))

    def exists(self, remote_path: str) -> bool:
        return self.stat(remote_path) is not None

    def read_from(self, remote_path: str, offset: int, max_bytes: int = 8 << 20) -> tuple[bytes, int]:
        """Bytes of ``remote_path`` from ``offset`` (at most ``max_bytes``) and the offset after them.

        A file shorter than ``offset`` was truncated or replaced: reading restarts at 0. A missing
        file reads as empty, so a tail can start before the trainer created it.
        """
        path = norm(remote_path)
        with self._io(f"reading {path}"):
            sftp = self._sftp_client()
            try:
                size = sftp.stat(path).st_size or 0
            except FileNotFoundError:
                return b"", offset
            if size < offset:
                offset = 0
            if size == offset:
                return b"", offset
            want = min(size - offset, max_bytes)
            parts: list[bytes] = []
            read_range(sftp, path, offset, want, lambda b: parts.append(bytes(b)),
                       max_read=self._max_read)
            data = b"".join(parts)
        return data, offset + len(data)

    def follow(self, remote_path: str, *, offset: int = 0, poll_s: float = 0.5,
               stop: Callable[[], bool] | None = None) -> Iterator[bytes]:
        """Yield complete lines (with their newline) appended to ``remote_path``, polling every
        ``poll_s`` while nothing new arrives, until ``stop()`` is true (forever when None).

        The caller knows the offset reached: the start ``offset`` plus the lengths of the lines
        yielded; on a dropped connection it can resume with ``follow(path, offset=that)``. A
        partial last line is held back until its newline arrives.
        """
        pending = b""
        pos = offset
        while True:
            data, new = self.read_from(remote_path, pos)
            if new < pos or (not data and new != pos):  # truncated: start over
                pending = b""
            pos = new
            if data:
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line + b"\n"
                continue
            if stop is not None and stop():
                return
            time.sleep(poll_s)

    def list_files(self, remote_dir: str) -> dict[str, RemoteFile]:
        """Every file under ``remote_dir`` (relative path -> size, mtime) in one round trip."""
        d = norm(remote_dir)
        code, out, err = self._exec(manifest_command(d), timeout_s=120)
        if code == 0:
            return parse_manifest(out)
        if code != 3:
            raise TransferError(f"listing {d} on {self.target} failed: {err.decode(errors='replace')}")
        return self._sftp_walk(d)

    def _sftp_walk(self, root: str) -> dict[str, RemoteFile]:
        files: dict[str, RemoteFile] = {}
        sftp = self._sftp_client()
        stack = [""]
        while stack:
            rel = stack.pop()
            for a in sftp.listdir_attr(posixpath.join(root, rel) if rel else root):
                r = posixpath.join(rel, a.filename) if rel else a.filename
                if st.S_ISDIR(a.st_mode or 0):
                    stack.append(r)
                elif st.S_ISREG(a.st_mode or 0):
                    files[r] = RemoteFile(r, a.st_size or 0, int(a.st_mtime or 0))
        return files

    # -- sync up -------------------------------------------------------------------------------

    def download(self, remote_path: str, local_path: str | os.PathLike[str], *,
                 sha256: str | None = None, progress: ProgressFn | None = None,
                 channels: int | None = None) -> DownloadStats:
        """Copy one remote file to ``local_path``: pipelined reads (bounded requests in flight) into
        ``local_path.partial`` (continued from where a cut left it), sha256 checked when given,
        then renamed into place with the remote mtime. On a mismatch the old copy stays and
        TransferError is raised. A local copy with the remote size and mtime (and hash, when
        given) is kept as is.

        On a long link the file comes over several SFTP channels at once, in segments
        (``channels``: how many; by default sized from the measured RTT, see
        :mod:`gpucli.ssh.parallel`); the partial then resumes segment by segment.
        """
        started = time.monotonic()
        rpath = norm(remote_path)
        dest = Path(local_path)
        partial = dest.with_name(dest.name + ".partial")
        meta = dest.with_name(dest.name + ".partial.json")
        with self._io(f"downloading {rpath}"):
            sftp = self._sftp_client()
            try:
                a = sftp.stat(rpath)
            except FileNotFoundError as exc:
                raise TransferError(f"{rpath} does not exist on {self.target}") from exc
            size, mtime = a.st_size or 0, int(a.st_mtime or 0)
            if dest.exists():
                st = dest.stat()
                if st.st_size == size and int(st.st_mtime) == mtime:
                    digest = _file_sha256(dest) if sha256 else None
                    if sha256 is None or digest == sha256.lower():
                        emit(progress, size, size, 1, 1, rpath)
                        return DownloadStats(size, 0, 0, time.monotonic() - started, digest, True)
            n = channels if channels is not None else channels_for(self.measure_rtt(), POOL_WINDOW_BYTES, size)
            if n > 1 or _segment_record(meta):
                return self._download_segments(rpath, dest, size, mtime, sha256, progress, max(1, n), started)
            dest.parent.mkdir(parents=True, exist_ok=True)
            source = {"path": rpath, "size": size, "mtime": mtime}
            offset = 0
            if partial.exists() and meta.exists():
                with contextlib.suppress(ValueError, OSError):
                    if json.loads(meta.read_text()) == source and partial.stat().st_size <= size:
                        offset = partial.stat().st_size
            if not offset:
                meta.write_text(json.dumps(source))
            hasher = hashlib.sha256() if sha256 else None
            if hasher and offset:
                with open(partial, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        hasher.update(block)
            if not offset:
                # A new file, not one truncated to 0: ext4 flushes a file truncated to 0 when it is
                # closed (auto_da_alloc), which cost ~0.4 s of the command per GiB here.
                partial.unlink(missing_ok=True)
            with open(partial, "r+b" if offset else "wb") as out:
                if offset:
                    out.seek(offset)
                    out.truncate()
                pos = self._readv_into(sftp, rpath, out, offset, size, hasher, progress)
            if pos != size:
                raise TransferError(f"{rpath} changed size while downloading ({pos} of {size} bytes)",
                                    hint="run the same command again")
        digest = hasher.hexdigest() if hasher else None
        if sha256 and digest != sha256.lower():
            partial.unlink(missing_ok=True)
            meta.unlink(missing_ok=True)
            if offset:
                # The first bytes came from a cut download's .partial on this machine: the mismatch
                # says nothing about the remote file until a copy made from byte 0 mismatches too.
                log.warning("%s: the local partial copy (%d bytes from an earlier download) was bad; "
                            "downloading it again from the start", dest, offset)
                return self.download(remote_path, local_path, sha256=sha256, progress=progress)
            raise TransferError(f"{rpath}: sha256 mismatch (got {digest}, expected {sha256})",
                                hint=f"the previous {dest.name} was left untouched; the remote file "
                                     f"may be corrupt or still being written")
        os.utime(partial, (mtime, mtime))
        os.replace(partial, dest)
        meta.unlink(missing_ok=True)
        return DownloadStats(size, size - offset, offset, time.monotonic() - started, digest)

    def _readv_into(self, sftp: paramiko.SFTPClient, rpath: str, out: Any, offset: int, size: int,
                    hasher: Any, progress: ProgressFn | None) -> int:
        pos = offset
        last = [time.monotonic()]

        def sink(data: memoryview) -> None:
            nonlocal pos
            out.write(data)
            if hasher is not None:
                hasher.update(data)
            pos += len(data)
            now = time.monotonic()
            if now - last[0] > 0.1 or pos == size:
                last[0] = now
                emit(progress, pos, size, 0, 1, rpath)

        read_range(sftp, rpath, offset, size - offset, sink, max_read=self._max_read)
        return pos

    def download_tree(self, remote_dir: str, local_dir: str | os.PathLike[str], *,
                      progress: ProgressFn | None = None, channels: int | None = None) -> SyncStats:
        """Mirror ``remote_dir`` into ``local_dir`` file by file (a checkpoint folder: few, big
        files), skipping files whose size and mtime already match; each file resumes on its own.
        On a long link several files (and segments of big ones) come over parallel channels."""
        started = time.monotonic()
        rdir = norm(remote_dir).rstrip("/") or "/"
        root = Path(local_dir)
        with self._io(f"downloading {rdir}"):
            remote = {k: v for k, v in self.list_files(rdir).items() if not is_part(k)}
        todo = []
        for rel, r in sorted(remote.items()):
            p = root / rel
            if p.exists():
                st = p.stat()
                if st.st_size == r.size and int(st.st_mtime) == r.mtime:
                    continue
            todo.append(r)
        total = sum(r.size for r in todo)
        n = channels if channels is not None else self._tree_channels(todo, total)
        if n > 1 and todo:
            with self._io(f"downloading {rdir}"):
                self._download_tree_segments(rdir, root, todo, total, progress, n)
            return SyncStats(len(remote), len(todo), len(remote) - len(todo),
                             sum(r.size for r in remote.values()), total, 0, time.monotonic() - started)
        base = 0
        for i, r in enumerate(todo):
            def sub(p: TransferProgress, base: int = base, i: int = i, rel: str = r.rel) -> None:
                emit(progress, base + p.bytes_done, total, i, len(todo), rel)

            self.download(posixpath.join(rdir, r.rel), root / r.rel,
                          progress=sub if progress else None)
            base += r.size
        return SyncStats(len(remote), len(todo), len(remote) - len(todo), sum(r.size for r in remote.values()),
                         total, 0, time.monotonic() - started)

    def download_files(self, items: Sequence[tuple[str, str | os.PathLike[str], str | None]], *,
                       progress: ProgressFn | None = None, channels: int | None = None) -> list[DownloadStats]:
        """:meth:`download` for several files (remote path, local path, sha256 or None), e.g. a
        checkpoint's weights and optimizer shards. On a long link they come over parallel channels
        (one bar for all of them); otherwise one after another. Each file resumes and is verified
        on its own; the first failure is raised after the files in flight stopped."""
        started = time.monotonic()
        todo = [(norm(r), Path(loc), sha) for r, loc, sha in items]
        if len({r for r, _, _ in todo}) != len(todo):
            raise ValueError("download_files: a remote path is listed twice")
        with self._io("measuring the round trip"):
            rtt = self.measure_rtt()
        n = channels if channels is not None else (min(MAX_CHANNELS, len(todo)) if is_long(rtt) else 1)
        if n <= 1 or len(todo) <= 1:
            return self._download_each(todo, progress, channels)
        stats: dict[str, DownloadStats] = {}
        files: list[DownFile] = []
        with self._io("downloading files"):
            self.prefetch_pool(lambda _rtt: n)  # the channels open while the files are looked at
            sftp = self._sftp_client()
            looked = Batch(sftp)
            for rpath, _, _ in todo:
                looked.stat(rpath)
            for (rpath, dest, sha), got in zip(todo, looked.run(), strict=True):
                if isinstance(got.error, FileNotFoundError):
                    raise TransferError(f"{rpath} does not exist on {self.target}") from got.error
                if got.error is not None:
                    raise got.error
                a = got.attrs
                size, mtime = a.st_size or 0, int(a.st_mtime or 0)
                if dest.exists() and dest.stat().st_size == size and int(dest.stat().st_mtime) == mtime:
                    digest = _file_sha256(dest) if sha else None
                    if sha is None or digest == sha.lower():
                        stats[rpath] = DownloadStats(size, 0, 0, 0.0, digest, True)
                        continue
                files.append(DownFile(rpath, dest, size, mtime, SEGMENT_BYTES, want_sha=bool(sha)))
            want = {rpath: sha for rpath, _, sha in todo}
            labels = {f.rpath: f.rpath for f in files}
            self._download_many(files, sum(f.size for f in files), progress, n, labels, want)
        took = time.monotonic() - started
        for f in files:
            stats[f.rpath] = DownloadStats(f.size, f.size - f.resumed, f.resumed, took, f.digest)
        return [stats[r] for r, _, _ in todo]

    def _download_each(self, todo: list[tuple[str, Path, str | None]], progress: ProgressFn | None,
                       channels: int | None) -> list[DownloadStats]:
        """One file after another, reported as one transfer over all of them."""
        out: list[DownloadStats] = []
        sizes: dict[str, int] = {}
        done_before = 0
        for i, (rpath, loc, sha) in enumerate(todo):
            def one(p: TransferProgress, base: int = done_before, i: int = i, rpath: str = rpath) -> None:
                sizes[rpath] = p.bytes_total
                emit(progress, base + p.bytes_done, sum(sizes.values()), i + int(p.bytes_done >= p.bytes_total),
                     len(todo), rpath)

            st = self.download(rpath, loc, sha256=sha, progress=one if progress is not None else None,
                               channels=channels)
            sizes[rpath] = st.bytes_total
            done_before += st.bytes_total
            out.append(st)
        return out

def _segment_record(meta: Path) -> bool:
    """Whether ``meta`` is the record of a download made in segments (its partial is no prefix)."""
    try:
        return "seg" in json.loads(meta.read_text())
    except (OSError, ValueError, TypeError):
        return False


def _file_sha256(path: Path) -> str:
    return sha256_file(path)
