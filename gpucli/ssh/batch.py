"""SFTP requests sent together: the set-up and finishing steps of a transfer in one round trip each.

A file transfer is data plus a dozen small requests (make the folders, create the part, write the
resume record, then stat, chmod, utime, rename, remove). paramiko sends each and waits for its
reply, which costs nothing on loopback and 100 ms apiece on a link across the world: measured at
100 ms RTT, 128 MiB up spent 3.4 s moving data and 4.4 s on such requests and channel set-up
(BENCHMARKS.md). :class:`Batch` queues path requests and sends them with
:func:`gpucli.ssh._paramiko.pipelined` (one round trip for the lot); where paramiko lacks the hooks
it runs them one by one through paramiko's public API, with the same results.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import TransferError
from gpucli.ssh import _paramiko
from gpucli.ssh.transfer import LocalFile, part_name

if TYPE_CHECKING:
    import paramiko

__all__ = ["Batch", "Reply", "finish_parts", "makedirs", "put_small"]

# SSH_FXF_* open flags (draft-ietf-secsh-filexfer-02 section 6.3)
_WRITE, _CREAT, _TRUNC = 0x02, 0x08, 0x10
_WRITE_CHUNK = 32 << 10  # the length every SFTP server must accept in one write


@dataclass(frozen=True)
class Reply:
    """The outcome of one request: ``error`` is None on success; ``attrs`` for a stat, ``handle``
    for an open."""

    error: BaseException | None = None
    attrs: Any = None
    handle: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Batch:
    """Path requests queued by the methods and sent by :meth:`run`, which returns one
    :class:`Reply` per request in the order queued. The server runs them in that order (see
    :func:`gpucli.ssh._paramiko.pipelined`), so a folder may be made and used in one batch."""

    def __init__(self, sftp: paramiko.SFTPClient) -> None:
        self.sftp = sftp
        self._ops: list[tuple[str, tuple[Any, ...]]] = []

    def mkdir(self, path: str, mode: int = 0o777) -> Batch:
        self._ops.append(("mkdir", (path, mode)))
        return self

    def stat(self, path: str) -> Batch:
        self._ops.append(("stat", (path,)))
        return self

    def setstat(self, path: str, *, mode: int | None = None, times: tuple[float, float] | None = None) -> Batch:
        """chmod and utime in one request."""
        self._ops.append(("setstat", (path, mode, times)))
        return self

    def rename(self, old: str, new: str) -> Batch:
        """Replace ``new`` if it exists (``posix-rename@openssh.com``)."""
        self._ops.append(("rename", (old, new)))
        return self

    def remove(self, path: str) -> Batch:
        self._ops.append(("remove", (path,)))
        return self

    def create(self, path: str) -> Batch:
        """Open ``path`` for writing, created or truncated; the reply carries the handle."""
        self._ops.append(("create", (path,)))
        return self

    def write(self, handle: bytes, offset: int, data: bytes) -> Batch:
        self._ops.append(("write", (handle, offset, data)))
        return self

    def close(self, handle: bytes) -> Batch:
        self._ops.append(("close", (handle,)))
        return self

    def __len__(self) -> int:
        return len(self._ops)

    def run(self) -> list[Reply]:
        ops, self._ops = self._ops, []
        if not ops:
            return []
        from paramiko.sftp import (  # lazy: paramiko (~0.3 s) loads at the first connection
            CMD_ATTRS,
            CMD_HANDLE,
            CMD_STATUS,
        )

        replies = _paramiko.pipelined(self.sftp, [_frame(op, args) for op, args in ops])
        if replies is None:
            return [_one(self.sftp, op, args) for op, args in ops]
        out: list[Reply] = []
        for (op, _), (t, msg) in zip(ops, replies, strict=True):
            if t == CMD_STATUS:
                out.append(Reply(error=_paramiko.status_error(self.sftp, msg)))
            elif t == CMD_ATTRS:
                # lazy: paramiko (~0.3 s) loads at the first connection
                from paramiko.sftp_attr import SFTPAttributes

                out.append(Reply(attrs=SFTPAttributes._from_msg(msg)))
            elif t == CMD_HANDLE:
                out.append(Reply(handle=msg.get_binary()))
            else:
                out.append(Reply(error=OSError(f"unexpected SFTP reply {t} to {op}")))
        return out


def _frame(op: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``(type, *args)`` as paramiko's ``_async_request`` frames them."""
    from paramiko.sftp import (  # lazy: paramiko (~0.3 s) loads at the first connection
        CMD_CLOSE,
        CMD_EXTENDED,
        CMD_MKDIR,
        CMD_OPEN,
        CMD_REMOVE,
        CMD_SETSTAT,
        CMD_STAT,
        CMD_WRITE,
        int64,
    )
    from paramiko.sftp_attr import SFTPAttributes  # lazy: paramiko (~0.3 s) loads at the first connection

    if op == "mkdir":
        attr = SFTPAttributes()
        attr.st_mode = args[1]
        return (CMD_MKDIR, args[0], attr)
    if op == "stat":
        return (CMD_STAT, args[0])
    if op == "setstat":
        path, mode, times = args
        attr = SFTPAttributes()
        if mode is not None:
            attr.st_mode = mode
        if times is not None:
            attr.st_atime, attr.st_mtime = int(times[0]), int(times[1])
        return (CMD_SETSTAT, path, attr)
    if op == "rename":
        return (CMD_EXTENDED, "posix-rename@openssh.com", args[0], args[1])
    if op == "remove":
        return (CMD_REMOVE, args[0])
    if op == "create":
        return (CMD_OPEN, args[0], _WRITE | _CREAT | _TRUNC, SFTPAttributes())
    if op == "write":
        return (CMD_WRITE, args[0], int64(args[1]), args[2])
    if op == "close":
        return (CMD_CLOSE, args[0])
    raise ValueError(op)


def _one(sftp: Any, op: str, args: tuple[Any, ...]) -> Reply:
    """One request through paramiko's public API (the fallback of :meth:`Batch.run`). Handles are
    the public ``SFTPFile`` objects here, carried in ``Reply.handle``'s place by identity."""
    try:
        if op == "mkdir":
            sftp.mkdir(args[0], args[1])
        elif op == "stat":
            return Reply(attrs=sftp.stat(args[0]))
        elif op == "setstat":
            path, mode, times = args
            if mode is not None:
                sftp.chmod(path, mode)
            if times is not None:
                sftp.utime(path, times)
        elif op == "rename":
            sftp.posix_rename(args[0], args[1])
        elif op == "remove":
            sftp.remove(args[0])
        elif op == "create":
            return Reply(handle=_Handles.put(sftp.open(args[0], "wb")))
        elif op == "write":
            fh = _Handles.get(args[0])
            fh.seek(args[1])
            fh.write(args[2])
        elif op == "close":
            _Handles.pop(args[0]).close()
    except (OSError, EOFError) as exc:
        return Reply(error=exc)
    return Reply()


class _Handles:
    """Open public ``SFTPFile`` objects of the fallback path, keyed by a token standing in for the
    wire handle."""

    _open: dict[bytes, Any] = {}

    @classmethod
    def put(cls, fh: Any) -> bytes:
        token = f"fh{id(fh)}".encode()
        cls._open[token] = fh
        return token

    @classmethod
    def get(cls, token: bytes) -> Any:
        return cls._open[token]

    @classmethod
    def pop(cls, token: bytes) -> Any:
        return cls._open.pop(token)


def put_small(sftp: paramiko.SFTPClient, files: Sequence[tuple[str, bytes, str | None]]) -> None:
    """Write each ``(path, data, rename_to)``: the file created (or truncated) with ``data`` and,
    when ``rename_to`` is given, renamed over it. Two round trips for all of them, whatever their
    number; the first error is raised."""
    opened = Batch(sftp)
    for path, _, _ in files:
        opened.create(path)
    handles = opened.run()
    rest = Batch(sftp)
    for (path, data, dest), got in zip(files, handles, strict=True):
        if got.error is not None or got.handle is None:
            continue
        for off in range(0, len(data), _WRITE_CHUNK):  # under every server's write length
            rest.write(got.handle, off, data[off:off + _WRITE_CHUNK])
        rest.close(got.handle)
        if dest is not None:
            rest.rename(path, dest)
    done = rest.run()
    for got in handles + done:
        if got.error is not None:
            raise got.error


def makedirs(sftp: paramiko.SFTPClient, rdir: str, dirs: Sequence[str]) -> None:
    """``mkdir -p`` for ``rdir`` and ``dirs`` below it: every folder on the way asked for in one
    batch (those already there answer with an error that changes nothing), then each wanted folder
    checked; one round trip, not two per path component. A folder still missing after that is
    walked one step at a time, whose error names the component at fault."""
    wanted = [rdir] + [posixpath.join(rdir, d) for d in dirs]
    steps: list[str] = []
    for path in wanted:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            if sub and sub != "." and sub not in steps:
                steps.append(sub)
    batch = Batch(sftp)
    for sub in steps:
        batch.mkdir(sub)
    for path in wanted:
        batch.stat(path)
    checks = batch.run()[len(steps):]
    for path, got in zip(wanted, checks, strict=True):
        if not (got.error is None and got.attrs is not None and stat.S_ISDIR(got.attrs.st_mode or 0)):
            _makedirs_walk(sftp, path)


def _makedirs_walk(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if not sub or sub == ".":
            continue
        try:
            sftp.stat(sub)
        except FileNotFoundError:
            with contextlib.suppress(OSError):  # raced with another creator: stat decides
                sftp.mkdir(sub)
            sftp.stat(sub)


def finish_parts(sftp: paramiko.SFTPClient, rdir: str, files: Sequence[LocalFile],
                 on_bytes: Callable[[int, str, bool], None], *, sidecars: Mapping[str, str]) -> None:
    """Check each uploaded part's size, give it the local mode and mtime, rename it into place and
    drop its resume record (``sidecars``: rel -> remote path): two round trips for all the files
    together (stat with setstat, then rename with remove)."""
    check = Batch(sftp)
    for f in files:
        part = posixpath.join(rdir, part_name(f.rel, f.size, f.mtime))
        check.stat(part).setstat(part, mode=f.mode, times=(f.mtime, f.mtime))
    got = iter(check.run())
    for f in files:
        st, chmod = next(got), next(got)
        for r in (st, chmod):
            if r.error is not None:
                raise r.error
        size = st.attrs.st_size if st.attrs is not None else None
        if size != f.size:
            raise TransferError(f"{f.rel}: uploaded {size} bytes, expected {f.size} (did the local "
                                f"file change during the sync?)", hint="run the same command again")
    move = Batch(sftp)
    for f in files:
        move.rename(posixpath.join(rdir, part_name(f.rel, f.size, f.mtime)), posixpath.join(rdir, f.rel))
        if f.rel in sidecars:
            move.remove(sidecars[f.rel])
    moved = iter(move.run())
    for f in files:
        r = next(moved)
        if r.error is not None:
            raise r.error
        if f.rel in sidecars:
            next(moved)  # a record left behind is removed as stale by the next sync
        on_bytes(0, f.rel, True)
