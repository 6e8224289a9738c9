"""What an SSH connection is made of and returns: the target, the results of commands and transfers,
and gpucli's own known_hosts file (OpenSSH format). Pure data: no paramiko, cheap to import."""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpucli.errors import HostKeyError, UsageError

__all__ = ["CommandResult", "DownloadStats", "RemoteStat", "SshTarget", "SyncStats", "parse_target"]

# boundary dataclasses


@dataclass(frozen=True)
class SshTarget:
    """Where to connect. ``host_key`` ("ssh-ed25519 AAAA...") pins the key when the caller already
    knows it (from a run record or a provider API); otherwise gpucli's known_hosts decides."""

    host: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    host_key: str | None = None
    proxy_jump: str | None = None  # ~/.ssh/config ProxyJump: reached through `ssh -W` to that jump host
    #: Reached through this host's SSH connection (a ``direct-tcpip`` channel from it to host:port): a
    #: RunPod cluster's worker, which has no SSH endpoint of its own, through the cluster's primary.
    via: SshTarget | None = None

    def __post_init__(self) -> None:
        if isinstance(self.via, dict):  # as a run record stores it
            object.__setattr__(self, "via", SshTarget(**self.via))

    def __str__(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")

    @property
    def known_hosts_name(self) -> str:
        """The host field OpenSSH writes in known_hosts for this target."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


_TARGET_RE = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<port>\d+))?$")


def parse_target(text: str, *, identity_file: str | None = None, host_key: str | None = None,
                 default_user: str = "root") -> SshTarget:
    """Parse ``user@host[:port]`` (IPv6 as ``[::1]:2222``); the user defaults to root, as on pods."""
    m = _TARGET_RE.match(text.strip())
    if not m:
        raise UsageError(f"cannot parse SSH target '{text}'", hint="use user@host or user@host:port")
    port = int(m["port"]) if m["port"] else 22
    if not 0 < port < 65536:
        raise UsageError(f"SSH port {port} out of range in '{text}'")
    return SshTarget(host=m["host"].strip("[]"), port=port, user=m["user"] or default_user,
                     identity_file=identity_file, host_key=host_key)


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class RemoteStat:
    size: int
    mtime: int
    mode: int
    is_dir: bool


@dataclass(frozen=True)
class SyncStats:
    """What a sync or tree download did. ``files_sent`` counts files whose bytes moved."""

    files_total: int
    files_sent: int
    files_skipped: int
    bytes_total: int
    bytes_sent: int
    bytes_resumed: int
    seconds: float
    links_left_out: tuple[str, ...] = ()  # symlinks pointing outside the folder: never followed


@dataclass(frozen=True)
class DownloadStats:
    bytes_total: int
    bytes_transferred: int
    resumed_from: int
    seconds: float
    sha256: str | None
    skipped: bool = False


# ---------------------------------------------------------------------------------------------------
# known_hosts (OpenSSH format, gpucli's own file)


@dataclass(frozen=True)
class KnownKey:
    line_no: int
    key_type: str
    key_b64: str


def read_known_hosts(path: Path, name: str) -> list[KnownKey]:
    if not path.exists():
        return []
    found = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        parts = line.split()
        if len(parts) < 3 or line.lstrip().startswith("#"):
            continue
        if name in parts[0].split(","):
            found.append(KnownKey(i, parts[1], parts[2]))
    return found


def append_known_host(path: Path, name: str, key_type: str, key_b64: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{name} {key_type} {key_b64}\n")


def fingerprint(key_b64: str) -> str:
    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def split_key(text: str) -> tuple[str, str]:
    parts = text.split()
    if len(parts) < 2:
        raise HostKeyError(f"pinned host key '{text[:40]}' is not 'TYPE BASE64'")
    return parts[0], parts[1]


def key_algorithms(key_type: str) -> list[str]:
    """Host-key algorithms to offer when a key of ``key_type`` is pinned (RSA keys sign with sha2)."""
    return ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if key_type == "ssh-rsa" else [key_type]

