"""``--provider local``: the run lives on this machine, in its own session, like a pod's trainer.

``LocalHost`` gives the ``Host`` operations with plain files and processes. A detached start is a
new session (``setsid``) with stdin from /dev/null and output appended to the log, the env file
sourced by the shell (``set -a``) so secrets never appear on a command line: what ``Remote`` does
on a pod, so a local run survives the terminal closing and behaves like a pod's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal as _signal
import stat
import stat as st
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import RemoteCommandError, TransferError
from gpucli.pod import procid
from gpucli.providers.target import Capabilities, NoPod, env_file_text
from gpucli.settings import home
from gpucli.ssh import (
    DEFAULT_EXCLUDES,
    CommandResult,
    DownloadStats,
    RemoteFile,
    SyncStats,
    TransferProgress,
    load_ignore,
    walk_local,
)
from gpucli.ssh.files import MAX_READ_FILE
from gpucli.ssh.target import RemoteStat

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord


def _home_path(p: str) -> Path:
    """A host path as a pod reads it: ``~`` expanded, relative to the home (login) directory."""
    path = Path(os.path.expanduser(p))
    return path if path.is_absolute() else Path.home() / path


class LocalHost:
    """This machine, as a :class:`gpucli.providers.target.Host`."""

    host_key: str | None = None
    target = "this machine"

    def __enter__(self) -> LocalHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        return None

    def run(self, cmd: str, *, timeout_s: float, check: bool = True, input: bytes | None = None) -> CommandResult:
        try:
            proc = subprocess.run(["sh", "-c", cmd], input=input, capture_output=True, timeout=timeout_s,
                                  cwd=Path.home())
        except subprocess.TimeoutExpired as exc:
            raise RemoteCommandError(f"`{cmd[:80]}` did not finish within {timeout_s:g} s") from exc
        result = CommandResult(proc.returncode, proc.stdout.decode(errors="replace"),
                               proc.stderr.decode(errors="replace"))
        if check and proc.returncode != 0:
            raise RemoteCommandError(f"`{cmd[:80]}` failed with exit status {proc.returncode}: "
                                     f"{result.stderr.strip()[-300:]}")
        return result

    def start_detached(self, cmd: str, *, cwd: str, log_path: str, env_file: str | None = None,
                       timeout_s: float = 30.0) -> int:
        """Start ``cmd`` in a new session (its pid is its process group id) and return at once."""
        log = _home_path(log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        script = ('set -a; . "$1"; set +a; ' if env_file else "") + cmd
        with open(log, "ab") as out:
            try:
                proc = subprocess.Popen(["sh", "-c", script, "sh", str(_home_path(env_file)) if env_file else ""],
                                        cwd=_home_path(cwd), stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise RemoteCommandError(f"could not start `{cmd[:80]}`: {exc}") from exc
        return proc.pid

    def is_running(self, pid: int, *, timeout_s: float = 15.0) -> bool:
        """Whether any process of the run's process group (torchrun and its workers) is alive."""
        return procid.group_alive(int(pid))

    def signal(self, pid: int, sig: str = "TERM", *, timeout_s: float = 15.0) -> bool:
        try:
            os.killpg(int(pid), getattr(_signal, f"SIG{sig}"))
        except ProcessLookupError:
            return False
        return True

    # -- files --------------------------------------------------------------------------------------

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o600) -> None:
        path = _home_path(remote_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    def write_env_file(self, remote_path: str, env: Mapping[str, str]) -> None:
        self.write_file(remote_path, env_file_text(env), mode=0o600)

    def read_file(self, remote_path: str) -> bytes:
        data, _ = self._read_regular(remote_path, 0, MAX_READ_FILE + 1, missing_ok=False)
        if len(data) > MAX_READ_FILE:
            raise TransferError(f"{remote_path} is more than {MAX_READ_FILE >> 20} MB: not read whole")
        return data

    @staticmethod
    def _read_regular(remote_path: str, offset: int, max_bytes: int, *, missing_ok: bool) -> tuple[bytes, int]:
        """Up to ``max_bytes`` from ``offset`` of a regular file (opened without blocking: a FIFO in its
        place is refused, never waited on)."""
        try:
            fd = os.open(_home_path(remote_path), os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            if missing_ok:
                return b"", offset
            raise TransferError(f"{remote_path} does not exist") from exc
        except OSError as exc:
            raise TransferError(f"{remote_path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                if missing_ok:  # as over SFTP: a FIFO's size is 0, nothing to read
                    return b"", offset
                raise TransferError(f"{remote_path} is not a regular file: not read")
            if st.st_size < offset:  # truncated or replaced: start over
                offset = 0
            fh.seek(offset)
            data = fh.read(max_bytes)
        return data, offset + len(data)

    def exists(self, remote_path: str) -> bool:
        return _home_path(remote_path).exists()

    def stat(self, remote_path: str) -> Any:
        """As over SFTP: size, mtime, mode and whether it is a folder; None when there is nothing."""
        try:
            a = os.stat(_home_path(remote_path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TransferError(f"{remote_path}: {exc.strerror}") from None
        return RemoteStat(a.st_size, int(a.st_mtime), st.S_IMODE(a.st_mode), st.S_ISDIR(a.st_mode))

    def read_from(self, remote_path: str, offset: int, max_bytes: int = 8 << 20) -> tuple[bytes, int]:
        return self._read_regular(remote_path, offset, max_bytes, missing_ok=True)

    def list_files(self, remote_dir: str) -> dict[str, RemoteFile]:
        root = _home_path(remote_dir)
        out: dict[str, RemoteFile] = {}
        if not root.is_dir():
            return out
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                p = Path(dirpath) / name
                try:
                    st = p.stat()
                except OSError:
                    continue
                rel = p.relative_to(root).as_posix()
                out[rel] = RemoteFile(rel, st.st_size, int(st.st_mtime))
        return out

    def sync_up(self, local_dir: str | os.PathLike[str], remote_dir: str, *, excludes: Any = None,
                progress: Any = None) -> SyncStats:
        """Copy a tree, skipping files whose size and mtime already match (like the SSH sync)."""
        started = time.monotonic()
        src = Path(local_dir)
        dst = _home_path(remote_dir)
        links: list[str] = []
        files = walk_local(src, load_ignore(src, DEFAULT_EXCLUDES if excludes is None else excludes), links)
        sent = skipped = bytes_sent = 0
        total = sum(f.size for f in files)
        for f in files:
            target = dst / f.rel
            try:
                st = target.stat()
                if st.st_size == f.size and int(st.st_mtime) == int(f.mtime):
                    skipped += 1
                    continue
            except FileNotFoundError:
                pass
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.gpucli-tmp")
            shutil.copy2(src / f.rel, tmp)
            os.replace(tmp, target)
            sent += 1
            bytes_sent += f.size
        return SyncStats(len(files), sent, skipped, total, bytes_sent, 0, time.monotonic() - started,
                         links_left_out=tuple(links))

    def download_files(self, items: Sequence[tuple[str, str | os.PathLike[str], str | None]], *,
                       progress: Any = None) -> list[DownloadStats]:
        """Each file copied and verified in turn; reported once per file (a copy here is quick)."""
        sizes = [_home_path(r).stat().st_size if _home_path(r).exists() else 0 for r, _, _ in items]
        out, done = [], 0
        for i, (rpath, loc, sha) in enumerate(items):
            out.append(self.download(rpath, loc, sha256=sha))
            done += out[-1].bytes_total
            if progress is not None:
                progress(TransferProgress(done, sum(sizes), i + 1, len(items), rpath))
        return out

    def download(self, remote_path: str, local_path: str | os.PathLike[str], *, sha256: str | None = None,
                 progress: Any = None) -> DownloadStats:
        started = time.monotonic()
        src = _home_path(remote_path)
        dest = Path(local_path)
        if not src.exists():
            raise TransferError(f"{remote_path} does not exist")
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        digest = hashlib.sha256()
        with open(src, "rb") as fi, open(partial, "wb") as fo:
            for chunk in iter(lambda: fi.read(8 << 20), b""):
                digest.update(chunk)
                fo.write(chunk)
        got = digest.hexdigest()
        if sha256 is not None and got != sha256.lower():
            partial.unlink(missing_ok=True)
            raise TransferError(f"{remote_path}: sha256 mismatch (expected {sha256[:12]}..., got {got[:12]}...); "
                                "the previous local copy is unchanged")
        st = src.stat()
        os.utime(partial, (st.st_atime, st.st_mtime))
        os.replace(partial, dest)
        return DownloadStats(st.st_size, st.st_size, 0, time.monotonic() - started, got)


def local_gpus() -> int:
    """GPUs this machine has: ``nvidia-smi -L`` lines (0 when there is no driver), or an AMD GPU's
    ``/dev/kfd`` with ``rocm-smi``."""
    if shutil.which("nvidia-smi"):
        try:
            res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU ")) if res.returncode == 0 else 0
    return 1 if Path("/dev/kfd").exists() and shutil.which("rocm-smi") else 0


class LocalTarget(NoPod):
    name = "local"
    describe = "this machine"
    bootstrap = False  # this Python already has the trainer's packages
    caps = Capabilities(
        this_machine=True,
        max_nodes=8,  # node agents on this machine (each a torchrun with its own processes): gpucli's limit
        nodes_are="node agents",
        link_source="loopback on this machine",
        bills_transfer=False,  # no provider between this machine and a --store
    )

    def default_workdir(self, run: str) -> str:
        return str(home() / "local-runs" / run)

    def default_python(self) -> str:
        return sys.executable

    def open(self, record: RunRecord, *, connect_timeout_s: float = 20.0) -> LocalHost:
        return LocalHost()

    def interactive_shell(self, record: RunRecord) -> tuple[list[str], str | None]:
        shell = os.environ.get("SHELL", "/bin/sh")
        return [shell], record.workdir
