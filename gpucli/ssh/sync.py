"""Tree sync of :class:`gpucli.ssh.Remote`: make a remote folder hold a local one, like ``rsync -a``.

How it is fast (measured in ``shared/reference/ssh-transfer.md`` and BENCHMARKS.md): one exec channel
prints a ``find -printf`` manifest and then becomes ``tar -x``, so an unchanged tree costs one round
trip and many small files travel as one tar stream (no per-file round trips); big files go over the
pipelined SFTP writes of :mod:`gpucli.ssh.sftp`. A handful of big files needs no shell at all.

Resumability: a big file is uploaded to ``.NAME.SIZE.MTIME.gpucli-part`` beside its target and renamed
when complete; the next run continues a partial from its length after checking its last MiB against
the local file. Small files are re-sent whole; a file cut mid-tar has the wrong size or mtime and is
sent again. Remote needs: a POSIX ``sh``, ``tar``; GNU ``find`` (``-printf``) for the fast manifest
(an SFTP walk is used otherwise); ``sha256sum`` only when a same-size big file has a different mtime.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import select
import shlex
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import TransferError
from gpucli.ssh.batch import Batch, finish_parts, makedirs, put_small
from gpucli.ssh.connection import IO_TIMEOUT_S, norm
from gpucli.ssh.files import Files, emit
from gpucli.ssh.parallel import (
    MAX_CHANNELS,
    Ramp,
    Segment,
    Serial,
    channels_for,
    plan_segments,
    run_segments,
)
from gpucli.ssh.segments import Sidecar, parse_record, record, sidecar_name
from gpucli.ssh.sftp import SegmentWriter, read_range, write_from
from gpucli.ssh.target import SyncStats
from gpucli.ssh.transfer import (
    DEFAULT_EXCLUDES,
    PART_SUFFIX,
    CountingWriter,
    LocalFile,
    ProgressFn,
    RemoteFile,
    load_ignore,
    parse_manifest,
    part_name,
    parts_of,
    sha256_file,
    walk_local,
    write_tar,
)
from gpucli.ssh.wire import send_all

if TYPE_CHECKING:
    import paramiko

# Files below this go into the tar stream; above it over SFTP (resumable, and tar would gain nothing).
SMALL_FILE_BYTES = 4 << 20
RESUME_CHECK_BYTES = 1 << 20
# The end of the manifest part of a sync channel: printf's spelling and the bytes it produces.
_MANIFEST_END_FMT = r"\0--gpucli-manifest-end--\n"
_MANIFEST_END = b"\0--gpucli-manifest-end--\n"
_NO_PRINTF = "--gpucli-no-printf--"
_SFTP_ONLY_MAX_FILES = 32  # a sync of at most this many big files needs no shell at all
# Small files per extra tar channel on a long link: fewer bytes than this do not pay for a shell.
_TAR_GROUP_BYTES = 4 << 20
# One work item of a parallel upload. A channel writes its segments back to back (no round trip
# between them, see SegmentWriter), so they can be small: the last ones then end together on every
# channel instead of one 32 MiB segment finishing alone on a window-bound channel (measured at
# 100 ms, 256 MiB: 32 MiB segments averaged 32 MB/s on a 40 MB/s link). A resume redoes at most the
# segments in flight, and the record lists one number per segment (~2,000 for a 17 GB checkpoint).
SEGMENT_BYTES = 8 << 20


class Sync(Files):
    """Tree sync up: manifests, one tar stream for small files, resumable SFTP for big ones (a
    remote listing falls back to the SFTP walk of :class:`Files`)."""

    def sync_up(self, local_dir: str | os.PathLike[str], remote_dir: str, *,
                excludes: Sequence[str] = DEFAULT_EXCLUDES, progress: ProgressFn | None = None,
                small_file_bytes: int = SMALL_FILE_BYTES, channels: int | None = None) -> SyncStats:
        """Make ``remote_dir`` hold every non-excluded file of ``local_dir`` (extra remote files are
        left alone, like ``rsync -a`` without ``--delete``).

        A file is skipped when size and whole-second mtime match; a big file with the same size but
        another mtime is hashed on both sides and only its mtime fixed when equal. Small files go
        as one tar stream, big ones over pipelined SFTP to a resumable temp name. Running it again
        after a cut finishes the job; mtimes are preserved so the next run is a no-op.

        On a long link sshd's 2 MiB channel window caps each channel at 2 MiB per round trip, so
        the small files go as several tar streams on their own channels and the big files in
        segments over several SFTP channels (``channels``: how many; by default sized from the
        measured RTT, see :mod:`gpucli.ssh.parallel`).
        """
        started = time.monotonic()
        root = Path(local_dir)
        if not root.is_dir():
            raise TransferError(f"{root} is not a folder")
        rdir = norm(remote_dir).rstrip("/") or "/"
        rules = load_ignore(root, excludes)
        with self._io(f"syncing to {rdir}"):
            # One exec channel does both halves: it prints the manifest, then becomes `tar -x` and
            # waits for the stream. A login shell can cost a lot to start (pyenv or conda init in
            # .bashrc: 0.35 s here), so a sync starts exactly one, as rsync does, and starts it
            # before the local walk so the two overlap. A few big files (checkpoints, shards) need
            # no shell at all: SFTP lists and writes them.
            chan = None if _few_top_files(root) else self._start_sync_channel(rdir)
            try:
                links: list[str] = []
                local = walk_local(root, rules, links)
                sftp_only = bool(local) and len(local) <= _SFTP_ONLY_MAX_FILES and all(
                    f.size >= small_file_bytes for f in local)
                if sftp_only:
                    if channels is None:  # the segment channels open while the listing and parts are made
                        big_total = sum(f.size for f in local)
                        self.prefetch_pool(lambda rtt: channels_for(rtt, self.server_window, big_total,
                                                                   unit_bytes=SEGMENT_BYTES))
                    if chan is not None:
                        chan.close()
                    chan, remote = None, self._sftp_manifest(rdir, {posixpath.dirname(f.rel) for f in local})
                else:
                    chan = chan or self._start_sync_channel(rdir)
                    remote = self._read_sync_manifest(chan, rdir)
                small: list[LocalFile] = []
                big: list[LocalFile] = []
                doubt: list[LocalFile] = []
                for f in local:
                    r = remote.get(f.rel)
                    if r is not None and r.size == f.size and r.mtime == f.mtime:
                        continue
                    if r is not None and r.size == f.size and f.size >= small_file_bytes:
                        doubt.append(f)
                    elif f.size < small_file_bytes:
                        small.append(f)
                    else:
                        big.append(f)
                if doubt:
                    big.extend(self._settle_doubts(rdir, doubt))
                todo = small + big
                if big and not sftp_only and channels is None:  # opening while the tar streams go
                    big_total = sum(f.size for f in big)
                    self.prefetch_pool(lambda rtt: channels_for(rtt, self.server_window, big_total,
                                                                   unit_bytes=SEGMENT_BYTES))
                total_bytes = sum(f.size for f in todo)
                done = {"bytes": 0, "files": 0, "resumed": 0, "next": 0}
                step = max(total_bytes // 200, 1)

                def count(n: int, path: str, file_done: bool) -> None:
                    # Reported every 0.5% of the bytes and at the end, not per file: a progress
                    # bar update per file cost more than sending a small file.
                    done["bytes"] += n
                    done["files"] += int(file_done)
                    if done["bytes"] >= done["next"] or done["files"] == len(todo):
                        done["next"] = done["bytes"] + step
                        emit(progress, done["bytes"], total_bytes, done["files"], len(todo), path)

                on_bytes = Serial(count)  # one bar, fed from every channel's thread
                rtt = self.measure_rtt() if todo else 0.0
                small_bytes = sum(f.size for f in small)
                big_bytes = sum(f.size for f in big)
                k_tar = channels if channels is not None else channels_for(
                    rtt, self.server_window, small_bytes, unit_bytes=_TAR_GROUP_BYTES)
                k_tar = max(1, min(k_tar, len(small)))
                n_big = channels if channels is not None else channels_for(rtt, self.server_window, big_bytes,
                                                                         unit_bytes=SEGMENT_BYTES)

                # Folders of the big files travel in the tar stream too, so SFTP can write into them.
                dirs = sorted({posixpath.dirname(f.rel) for f in big} - {""})
                if chan is not None and k_tar > 1:
                    self._finish_tar_groups(chan, rdir, root, small, dirs, on_bytes, k_tar)
                elif chan is not None:
                    self._finish_tar(chan, rdir, root, small, dirs, on_bytes)
                elif big:
                    makedirs(self._sftp_client(), rdir, dirs)
            finally:
                if chan is not None:
                    chan.close()
            # A sidecar left by a parallel run means its part has holes: only segments resume it.
            if big and (n_big > 1 or any(sidecar_name(part_name(f.rel, f.size, f.mtime)) in remote for f in big)):
                done["resumed"] += self._put_big_segments(big, rdir, remote, on_bytes, max(1, n_big), rtt)
            else:
                for f in big:
                    done["resumed"] += self._put_big(f, rdir, remote, on_bytes)
        return SyncStats(files_total=len(local), files_sent=len(todo), files_skipped=len(local) - len(todo),
                         bytes_total=sum(f.size for f in local), bytes_sent=done["bytes"] - done["resumed"],
                         bytes_resumed=done["resumed"], seconds=time.monotonic() - started,
                         links_left_out=tuple(links))

    def _sftp_manifest(self, rdir: str, dirs: set[str]) -> dict[str, RemoteFile]:
        """The files directly inside ``dirs`` (relative to ``rdir``): one listdir each."""
        sftp = self._sftp_client()
        files: dict[str, RemoteFile] = {}
        for d in sorted(dirs):
            try:
                entries = sftp.listdir_attr(posixpath.join(rdir, d) if d else rdir)
            except FileNotFoundError:
                continue
            for a in entries:
                if stat.S_ISREG(a.st_mode or 0):
                    rel = posixpath.join(d, a.filename) if d else a.filename
                    files[rel] = RemoteFile(rel, a.st_size or 0, int(a.st_mtime or 0))
        return files

    def _start_sync_channel(self, rdir: str) -> Any:
        """Start ``mkdir; find -printf; tar -x`` on one channel; the manifest is read later by
        :meth:`_read_sync_manifest`, so the remote shell starts while the caller works."""
        q = shlex.quote(rdir)
        script = (f"mkdir -p {q} && cd {q} || exit 1; "
                  f"if find . -maxdepth 0 -printf '' 2>/dev/null; then "
                  f"find . -type f -printf '%s %T@ %P\\0' 2>/dev/null; else printf '{_NO_PRINTF}'; fi; "
                  f"printf '{_MANIFEST_END_FMT}'; exec tar -xf -")
        chan = self._transport().open_session(timeout=self.connect_timeout_s)
        chan.settimeout(IO_TIMEOUT_S)
        chan.exec_command(script)
        return chan

    def _read_sync_manifest(self, chan: Any, rdir: str) -> dict[str, RemoteFile]:
        buf = bytearray()
        end = _MANIFEST_END
        deadline = time.monotonic() + 300
        while not buf.endswith(end):
            data = chan.recv(1 << 20)
            if not data or time.monotonic() > deadline:
                err = chan.recv_stderr(65536).decode(errors="replace").strip() if chan.recv_stderr_ready() else ""
                raise TransferError(f"listing {rdir} on {self.target} failed"
                                    + (f": {err}" if err else ""), hint="check the folder is writable")
            buf += data
        raw = bytes(buf[: -len(end)])
        if raw == _NO_PRINTF.encode():  # busybox find: walk over SFTP instead
            return self._sftp_walk(rdir)
        return parse_manifest(raw)

    def _settle_doubts(self, rdir: str, doubt: list[LocalFile]) -> list[LocalFile]:
        """Hash same-size files whose mtime differs; fix the mtime of the equal ones, return the rest."""
        listing = b"".join(f.rel.encode() + b"\0" for f in doubt)
        code, out, _ = self._exec(f"cd {shlex.quote(rdir)} && xargs -0 sha256sum --", timeout_s=3600,
                                  input=listing)
        lines = out.decode(errors="replace").splitlines()
        if code != 0 or len(lines) != len(doubt):
            return doubt
        changed = []
        sftp = self._sftp_client()
        for f, line in zip(doubt, lines, strict=True):
            local_hash = sha256_file(f.path)
            if line.lstrip("\\")[:64] == local_hash:
                sftp.utime(posixpath.join(rdir, f.rel), (f.mtime, f.mtime))
            else:
                changed.append(f)
        return changed

    def _finish_tar(self, chan: Any, rdir: str, root: Path, files: list[LocalFile], dirs: list[str],
                    on_bytes: Callable[[int, str, bool], None]) -> None:
        """Stream ``files`` (and ``dirs``) as one tar into the waiting ``tar -x``: no per-file round
        trips, which is what makes 10k small files as fast as rsync. An empty sync sends an empty
        archive so tar exits cleanly."""
        writer = CountingWriter(lambda data: send_all(chan, data))
        write_tar(writer, files, lambda f: on_bytes(f.size, f.rel, True),
                  dirs=[(d, _dir_mode(root / d), int(_dir_mtime(root / d))) for d in dirs])
        chan.shutdown_write()
        err = bytearray()
        deadline = time.monotonic() + 600
        while not chan.exit_status_ready() or chan.recv_stderr_ready() or chan.recv_ready():
            if chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            elif chan.recv_ready():
                chan.recv(65536)
            elif time.monotonic() > deadline:
                raise TransferError(f"tar -x on {self.target} did not finish")
            elif chan.closed:
                break
            else:
                select.select([chan], [], [], 0.2)
        code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        if code != 0:
            raise TransferError(f"unpacking files into {rdir} on {self.target} failed "
                                f"(tar exit {code}): {err.decode(errors='replace').strip()[-500:]}",
                                hint="run the same command again to resume")

    def _finish_tar_groups(self, chan: Any, rdir: str, root: Path, files: list[LocalFile], dirs: list[str],
                           on_bytes: Callable[[int, str, bool], None], k: int) -> None:
        """Like :meth:`_finish_tar`, with the files dealt round-robin into ``k`` tar streams: the
        sync channel takes the first (and the folders), ``k - 1`` more ``tar -x`` channels the rest."""
        groups = [files[i::k] for i in range(k)]
        extra: list[Any] = [None] * (k - 1)
        q = shlex.quote(rdir)

        def open_one(_: object, i: int) -> None:
            c = self._transport().open_session(timeout=self.connect_timeout_s)
            c.settimeout(IO_TIMEOUT_S)
            c.exec_command(f"cd {q} && exec tar -xf -")  # the sync channel made the folder
            extra[i] = c

        try:
            run_segments(list(range(k - 1)), [None] * (k - 1), open_one)
            jobs = [(chan, groups[0], dirs)] + [(c, g, []) for c, g in zip(extra, groups[1:], strict=True)]
            run_segments(jobs, [None] * k,
                         lambda _, job: self._finish_tar(job[0], rdir, root, job[1], job[2], on_bytes))
        finally:
            for c in extra:
                if c is not None:
                    c.close()

    def _put_big_segments(self, big: list[LocalFile], rdir: str, remote: dict[str, RemoteFile],
                          on_bytes: Callable[[int, str, bool], None], n: int, rtt: float) -> int:
        """Upload ``big`` in segments over ``n`` pooled SFTP channels (more while all are
        window-bound), each file to its part name with a sidecar recording the finished segments;
        returns the bytes earlier runs had sent."""
        sftp = self._sftp_client()
        record_lock = threading.Lock()

        def put_record(path: str, data: bytes) -> None:
            # Written beside and renamed over (the record is rewritten all the time, so a cut
            # would often land mid-write), on the main SFTP channel, which no segment uses. The
            # temp name is a part name of the same file: the next run removes it as stale.
            with record_lock:
                put_small(sftp, [(_record_tmp(path), data, path)])

        items: list[Segment] = []
        sidecars: dict[str, Sidecar] = {}
        resumed = 0
        try:
            stale = Batch(sftp)
            for f in big:
                part_rel = part_name(f.rel, f.size, f.mtime)
                for old in parts_of(f.rel, remote):
                    if old not in (part_rel, sidecar_name(part_rel)):
                        stale.remove(posixpath.join(rdir, old))
            stale.run()  # a stale part that will not go is only clutter: its errors do not matter
            firsts: list[tuple[str, bytes, str | None]] = []  # new parts and first records, sent together
            plans: list[tuple[LocalFile, int, set[int]]] = []
            for f in big:
                part_rel = part_name(f.rel, f.size, f.mtime)
                side_rel = sidecar_name(part_rel)
                seg, done = SEGMENT_BYTES, set[int]()
                if side_rel in remote and part_rel in remote:
                    got = parse_record(self.read_file(posixpath.join(rdir, side_rel)), f.size, f.mtime)
                    if got is not None:
                        seg, done = got
                elif part_rel in remote and 0 < remote[part_rel].size <= f.size:  # a single-channel partial
                    prefix = self._verified_length(sftp, posixpath.join(rdir, part_rel), f, remote[part_rel].size)
                    done = set(range(prefix // seg))
                if not done:
                    firsts.append((posixpath.join(rdir, part_rel), b"", None))
                side = posixpath.join(rdir, side_rel)
                firsts.append((_record_tmp(side), record(f.size, f.mtime, seg, done), side))
                plans.append((f, seg, done))
            # The parts exist and every record is written before the first byte moves.
            put_small(sftp, firsts)
            for f, seg, done in plans:
                side = posixpath.join(rdir, sidecar_name(part_name(f.rel, f.size, f.mtime)))
                sidecars[f.rel] = Sidecar(put_record, side, f.size, f.mtime, seg, done, written=True)
                had = sum(s.end - s.start for s in plan_segments(f.rel, f.size, seg) if s.index in done)
                if had:
                    on_bytes(had, f.rel, False)
                resumed += had
                items += plan_segments(f.rel, f.size, seg, done)
            by_rel = {f.rel: f for f in big}
            active = list(self._sftp_pool(n))
            ramp = Ramp(rtt, self.server_window, MAX_CHANNELS)

            def counted(k: int, path: str, file_done: bool) -> None:
                ramp.add(k)
                on_bytes(k, path, file_done)

            writers: dict[int, SegmentWriter] = {}  # one per channel, kept across its segments

            def work(client: Any, s: Segment) -> None:
                w = writers.get(id(client))
                if w is None:
                    w = writers[id(client)] = SegmentWriter(
                        client, max_write=self._max_write, on_bytes=counted,
                        on_acked=lambda seg: sidecars[seg.key].add(seg.index))
                f = by_rel[s.key]
                w.write(posixpath.join(rdir, part_name(f.rel, f.size, f.mtime)), f, s)

            def more() -> Any | None:
                if n > 1 and ramp.more(len(active)):
                    active.append(self._sftp_pool(len(active) + 1)[-1])
                    return active[-1]
                return None

            try:
                run_segments(items, active, work, more_client=more)
                ws = list(writers.values())
                run_segments(ws, [None] * len(ws), lambda _, w: w.finish())
            finally:
                for w in writers.values():
                    w.abort()
        finally:
            for sc in sidecars.values():
                sc.close()
        finish_parts(sftp, rdir, big, on_bytes, sidecars={f.rel: sidecars[f.rel].path for f in big})
        return resumed

    def _put_big(self, f: LocalFile, rdir: str, remote: dict[str, RemoteFile],
                 on_bytes: Callable[[int, str, bool], None]) -> int:
        """Upload one file over pipelined SFTP to its part name, resuming a matching partial;
        returns the number of bytes that a previous run had already sent."""
        sftp = self._sftp_client()
        part_rel = part_name(f.rel, f.size, f.mtime)
        part = posixpath.join(rdir, part_rel)
        for stale in parts_of(f.rel, remote):
            if stale != part_rel:
                with contextlib.suppress(OSError):
                    sftp.remove(posixpath.join(rdir, stale))
        offset = 0
        if part_rel in remote and 0 < remote[part_rel].size <= f.size:
            offset = self._verified_length(sftp, part, f, remote[part_rel].size)
        sent = write_from(sftp, part, f, offset, on_bytes, max_write=self._max_write)
        if sent != f.size:
            raise TransferError(f"{f.rel}: uploaded {sent} bytes, expected {f.size} (did the local "
                                f"file change during the sync?)", hint="run the same command again")
        finish_parts(sftp, rdir, [f], on_bytes, sidecars={})
        return offset

    def _verified_length(self, sftp: paramiko.SFTPClient, part: str, f: LocalFile, size: int) -> int:
        """How much of a partial upload can be kept: SFTP servers apply writes in order, so the
        partial is a prefix; its last MiB is compared with the local file in case it was cut
        mid-request or written by another version."""
        check = min(size, RESUME_CHECK_BYTES)
        parts: list[bytes] = []
        read_range(sftp, part, size - check, check, lambda b: parts.append(bytes(b)),
                   max_read=self._max_read)
        tail = b"".join(parts)
        with open(f.path, "rb") as src:
            src.seek(size - check)
            if src.read(check) == tail:
                return size
        return 0

    # -- download ------------------------------------------------------------------------------


def _record_tmp(path: str) -> str:
    """Where a resume record is written before it is renamed over ``path``: a part name of the same
    file, so a cut leaves something the next run removes as stale."""
    return path[: -len(PART_SUFFIX)] + "-new" + PART_SUFFIX


def _few_top_files(root: Path) -> bool:
    """True when ``root`` holds at most a few entries and no folder: the tree may be a handful of
    big files that SFTP alone handles, so a sync does not start a shell it may not need."""
    with os.scandir(root) as it:
        for i, entry in enumerate(it):
            if i >= _SFTP_ONLY_MAX_FILES or entry.is_dir(follow_symlinks=False):
                return False
    return True


def _dir_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o755


def _dir_mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()
