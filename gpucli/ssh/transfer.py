"""Pure helpers for moving files: progress records, gitignore-style excludes, manifests, tar streams.

Nothing here touches the network or imports paramiko, so it is cheap to import and easy to test;
:mod:`gpucli.ssh.remote` drives the SSH side. Split out because the sync logic (what to send, what to
skip, how to resume) is independent of how bytes travel.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat as stat_mod
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from shlex import quote

from gpucli.errors import TransferError
from gpucli.ssh.globmatch import Glob

# Patterns that are never worth sending to a pod: VCS data, caches, our own temporaries.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".git/", "__pycache__/", "*.pyc", ".DS_Store", "*.partial", "*.partial.json", ".*.gpucli-part",
)

# The per-directory ignore file read from the root of a synced folder, same syntax as .gitignore.
IGNORE_FILE = ".gpucliignore"

# Suffix of an interrupted SFTP upload. The local size and mtime are part of the name, so a partial
# of an older version of the file is never resumed (it would splice two versions together).
PART_SUFFIX = ".gpucli-part"


@dataclass(frozen=True)
class TransferProgress:
    """One progress report: what a progress bar needs (bytes and files so far, the current path)."""

    bytes_done: int
    bytes_total: int
    files_done: int
    files_total: int
    path: str


ProgressFn = Callable[[TransferProgress], None]


@dataclass(frozen=True)
class LocalFile:
    """A regular file under a synced root. ``rel`` uses '/' separators; ``path`` is the local path
    as a string (a ``Path`` per file cost more than the stat in a 10k-file walk); ``mtime`` is
    whole seconds because tar headers and SFTP v3 attributes only carry integers."""

    rel: str
    path: str
    size: int
    mtime: int
    mode: int


@dataclass(frozen=True)
class RemoteFile:
    """One entry of a remote manifest (``find -printf``): size in bytes, mtime in whole seconds."""

    rel: str
    size: int
    mtime: int


# ---------------------------------------------------------------------------------------------------
# gitignore-style patterns


@dataclass(frozen=True)
class _Rule:
    glob: Glob  # matched in time linear in the name (gpucli/ssh/globmatch.py)
    negate: bool
    dir_only: bool
    regex: re.Pattern[str] | None  # the same match as a regex, when it cannot backtrack badly

    def match(self, rel: str) -> bool:
        if self.regex is not None:
            return self.regex.match(rel.rsplit("/", 1)[-1] if self.glob.basename else rel) is not None
        return self.glob.match(rel)


class IgnoreRules:
    """gitignore semantics for one root: last matching pattern wins, ``!`` re-includes, a trailing
    ``/`` matches directories only, a pattern with a ``/`` in it is anchored to the root, ``**``
    spans directories. As in git, a file inside an excluded directory cannot be re-included (the
    walk never enters that directory)."""

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self._rules: list[_Rule] = []
        self._fast: tuple[re.Pattern[str], re.Pattern[str]] | None = None
        for raw in patterns:
            self.add(raw)

    def add(self, raw: str) -> None:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            return
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            return
        anchored = "/" in line
        line = line.lstrip("/")
        glob = Glob(line, anchored)
        regex = re.compile("^" + glob.regex + "$", re.DOTALL) if glob.safe else None
        self._rules.append(_Rule(glob, negate, dir_only, regex))
        self._fast = self._combine()

    def _combine(self) -> tuple[re.Pattern[str], re.Pattern[str]] | None:
        """Without ``!`` rules the order does not matter and any match ignores, so all rules matched
        against the last part of the path fold into one regex for files and one for folders (each
        alternative anchored, with one unbounded part at most: no bad backtracking); the others are
        matched one by one."""
        if any(r.negate for r in self._rules):
            return None
        never = "(?!)"
        base = [r for r in self._rules if r.regex is not None and r.glob.basename]
        files = "|".join(f"(?:{r.regex.pattern})" for r in base if r.regex is not None and not r.dir_only) or never
        dirs = "|".join(f"(?:{r.regex.pattern})" for r in base if r.regex is not None) or never
        return re.compile(files, re.DOTALL), re.compile(dirs, re.DOTALL)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        if self._fast is not None:
            if self._fast[is_dir].match(rel.rsplit("/", 1)[-1]) is not None:
                return True
            return any(r.match(rel) for r in self._rules
                       if not (r.regex is not None and r.glob.basename) and (is_dir or not r.dir_only))
        result = False
        for rule in self._rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.match(rel):
                result = not rule.negate
        return result


def load_ignore(root: Path, excludes: Iterable[str]) -> IgnoreRules:
    """The rules for ``root``: the given patterns, then ``root/.gpucliignore`` if it exists (so the
    folder's own file can re-include with ``!``)."""
    rules = IgnoreRules(excludes)
    ignore_file = root / IGNORE_FILE
    if ignore_file.is_file():
        for line in ignore_file.read_text(encoding="utf-8", errors="replace").splitlines():
            rules.add(line)
    return rules


def never_sent(rel: str, is_dir: bool) -> bool:
    """What no sync sends whatever the ignore files say (a ``!.git`` re-include included): git's own
    folder, SSH folders, private keys and credential files."""
    parts = rel.split("/")
    if any(p in NEVER_SENT_DIRS for p in (parts if is_dir else parts[:-1])):
        return True
    name = parts[-1]
    return name in NEVER_SENT_DIRS or name in NEVER_SENT_FILES or (
        not is_dir and name.startswith("id_") and not name.endswith(".pub") and "_" not in name[3:]
        and name[3:] in ("rsa", "dsa", "ecdsa", "ed25519", "ecdsa_sk", "ed25519_sk"))


NEVER_SENT_DIRS = frozenset({".git", ".ssh", ".gnupg"})
NEVER_SENT_FILES = frozenset({".git-credentials", ".netrc", "_netrc", ".pypirc", ".npmrc", ".dockercfg",
                              "credentials.json", ".gpucli-keys.json", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"})


def walk_local(root: Path, rules: IgnoreRules, links_left_out: list[str] | None = None) -> list[LocalFile]:
    """Every regular file under ``root`` not excluded by ``rules`` (nor :func:`never_sent`), sorted by
    path.

    A symlink to a file inside ``root`` is followed (its content is sent); one whose target is outside
    ``root`` (``~/.ssh/id_ed25519``, say) is never followed: its name goes to ``links_left_out``.
    Symlinked directories are not entered, which keeps a link to a huge dataset or a loop from being
    copied by surprise. A folder that cannot be read is a TransferError naming it.
    """
    files: list[LocalFile] = []
    real_root = os.path.realpath(root)
    stack: list[tuple[str, str]] = [(os.fspath(root), "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            it = os.scandir(folder)
        except PermissionError as exc:
            raise TransferError(f"{folder}: cannot read this folder ({exc.strerror})",
                                hint="make it readable, or leave it out with a .gpucliignore line") from None
        with it:
            for entry in it:
                rel = prefix + entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if not rules.ignored(rel, True) and not never_sent(rel, True):
                            stack.append((entry.path, rel + "/"))
                        continue
                    if not entry.is_file(follow_symlinks=True) or rules.ignored(rel, False) or never_sent(rel, False):
                        continue
                    if entry.is_symlink():
                        target = os.path.realpath(entry.path)
                        if os.path.commonpath([real_root, target]) != real_root or never_sent(
                                os.path.relpath(target, real_root), False):
                            if links_left_out is not None:
                                links_left_out.append(rel)
                            continue
                    st = entry.stat(follow_symlinks=True)
                except FileNotFoundError:  # vanished while walking (a log being rotated)
                    continue
                files.append(LocalFile(rel, entry.path, st.st_size, int(st.st_mtime),
                                       stat_mod.S_IMODE(st.st_mode)))
    files.sort(key=lambda f: f.rel)
    return files


# ---------------------------------------------------------------------------------------------------
# remote manifest


def manifest_command(remote_dir: str) -> str:
    """One shell command listing every file under ``remote_dir`` as ``size mtime relpath\\0``.

    NUL-terminated so any file name survives; prints nothing (exit 0) when the folder does not exist.
    Exit status 3 means ``find`` lacks ``-printf`` (busybox), and the caller falls back to SFTP.
    """
    q = quote(remote_dir)
    return (f"[ -d {q} ] || exit 0; find {q} -type f -printf '%s %T@ %P\\0' 2>/dev/null "
            f"|| {{ find {q} -maxdepth 0 -printf '' 2>/dev/null || exit 3; }}")


def parse_manifest(raw: bytes) -> dict[str, RemoteFile]:
    """The listing ``manifest_command`` printed. A record that is not ``size mtime relpath`` (a host
    whose ``find`` prints something else, or a pod that lies) is a TransferError, never a ValueError."""
    files: dict[str, RemoteFile] = {}
    for rec in raw.split(b"\0"):
        if not rec:
            continue
        fields = rec.split(b" ", 2)
        mtime_whole = fields[1].partition(b".")[0] if len(fields) == 3 else b""
        if len(fields) != 3 or not fields[2] or not fields[0].isdigit() or len(fields[0]) > 20 \
                or not mtime_whole.lstrip(b"-").isdigit() or len(mtime_whole) > 20:
            shown = rec[:80].decode("utf-8", "replace").encode("unicode_escape").decode()
            raise TransferError(f"the host's file listing is not what find prints (record {shown!r})",
                                hint="the host's find or the folder may be damaged")
        rel = fields[2].decode("utf-8", "surrogateescape")  # what os.fsdecode does on Linux, faster
        files[rel] = RemoteFile(rel, int(fields[0]), int(mtime_whole))  # whole seconds
    return files


def part_name(rel: str, size: int, mtime: int) -> str:
    """The temp name an SFTP upload of ``rel`` writes to before the final rename."""
    head, name = posixpath.split(rel)
    return posixpath.join(head, f".{name}.{size}.{mtime}{PART_SUFFIX}")


def is_part(rel: str) -> bool:
    return rel.endswith(PART_SUFFIX) and posixpath.basename(rel).startswith(".")


def parts_of(rel: str, remote: dict[str, RemoteFile]) -> list[str]:
    """All partial uploads of ``rel`` present remotely (any version)."""
    head, name = posixpath.split(rel)
    prefix = posixpath.join(head, f".{name}.")
    return [r for r in remote if r.startswith(prefix) and r.endswith(PART_SUFFIX)
            and r.count("/") == rel.count("/")]


# ---------------------------------------------------------------------------------------------------
# tar stream


class CountingWriter:
    """A write-only file object over a ``send(bytes)`` callable that sends in ``chunk``-sized
    pieces and counts bytes. The bytearray buffer appends in amortised O(1); tarfile's own stream
    buffer re-copies itself on every write, which cost more CPU than the encryption for 10k files."""

    def __init__(self, send: Callable[[bytes | bytearray], object], chunk: int = 1 << 20) -> None:
        self._send = send
        self._chunk = chunk
        self._buf = bytearray()
        self.count = 0

    def write(self, data: bytes) -> int:
        self._buf += data
        self.count += len(data)
        if len(self._buf) >= self._chunk:
            self.flush()
        return len(data)

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        if self._buf:
            # Hand over the buffer itself (no copy) and start a new one.
            buf, self._buf = self._buf, bytearray()
            self._send(buf)


_ZERO_BLOCK = bytes(512)
# uid and gid 0: neutral ownership, root extracting must not recreate ours.
_NEUTRAL_IDS = b"0000000\0" * 2
_GNU_MAGIC = b"ustar  \0"  # GNU magic + version, at offset 257
_HEADER_TAIL = bytes(100) + _GNU_MAGIC + bytes(512 - 265)  # after the type flag: offsets 157..511
_HEADER_CONST_SUM = 8 * ord(" ") + sum(_GNU_MAGIC)  # the checksum field counts as eight spaces
_OCTAL_MAX = 8**11  # the largest size or mtime a classic 11-digit octal header field holds


def _tar_header(rel: str, mode: int, mtime: int, size: int, kind: bytes) -> bytes:
    """One 512-byte GNU tar header for a short name, built directly: tarfile's own header code was
    the biggest CPU cost of a 10k-file sync. Names over 100 bytes (and huge sizes) get tarfile's
    header, with its GNU long-name record."""
    name = rel.encode("utf-8", "surrogateescape")
    if len(name) > 100 or size >= _OCTAL_MAX or not 0 <= mtime < _OCTAL_MAX:
        info = tarfile.TarInfo(rel)
        info.size, info.mtime, info.mode = size, mtime, mode
        info.type = kind
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    # The fields in order; everything after the type flag is constant (no link name, GNU magic,
    # empty owner names), so the checksum is the front's byte sum plus a constant.
    front = name.ljust(100, b"\0") + b"%07o\0%s%011o\0%011o\0" % (mode & 0o7777, _NEUTRAL_IDS, size, mtime)
    checksum = sum(front) + _HEADER_CONST_SUM + kind[0]
    return front + b"%06o\0 " % checksum + kind + _HEADER_TAIL


def _read_whole(path: str, size: int) -> bytes:
    """The bytes of a file expected to hold ``size`` (up to one more, so growth shows), with bare
    ``os`` calls: a buffered file object per small file cost more than the read itself."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        data = os.read(fd, size + 1)
        while len(data) < size:  # a short read is legal (FUSE, NFS); read on until EOF
            chunk = os.read(fd, size + 1 - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)


def write_tar(out: CountingWriter, files: list[LocalFile], on_file: Callable[[LocalFile], None],
              dirs: Iterable[tuple[str, int, int]] = ()) -> None:
    """Write ``dirs`` (rel, mode, mtime) then ``files`` as one GNU tar stream that ``tar -x``
    reads: integer mtimes, GNU long-name records only where needed, neutral ownership."""
    for rel, mode, mtime in dirs:
        out.write(_tar_header(rel.rstrip("/") + "/", mode, int(mtime), 0, tarfile.DIRTYPE))
    for f in files:
        data = _read_whole(f.path, f.size)
        if len(data) != f.size:
            # A file that changed since the walk would corrupt the stream; the caller reports it and
            # the next sync sends it again.
            raise OSError(f"{f.rel} changed size during the sync ({f.size} -> {len(data)} bytes)")
        out.write(_tar_header(f.rel, f.mode, int(f.mtime), f.size, tarfile.REGTYPE))
        out.write(data)
        out.write(_ZERO_BLOCK[:-len(data) % 512])
        on_file(f)
    # End of archive: two zero blocks, padded to tar's 10 KiB record as tarfile does.
    out.write(_ZERO_BLOCK * 2)
    out.write(bytes(-out.tell() % tarfile.RECORDSIZE))
    out.flush()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (``hashlib.file_digest`` is Python 3.11+ only)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
