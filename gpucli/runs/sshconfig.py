"""``~/.ssh/config`` both ways: a ``Host gpucli-<run>`` entry for each run (``gpucli ssh-config``), so
``ssh gpucli-<run>``, ``scp``, ``rsync`` and VS Code Remote-SSH reach the pod by name; and the user's own
entries read for ``--provider ssh --host NAME`` (HostName, User, Port, IdentityFile, ProxyJump).

The entries live in files of gpucli's own (``GPUCLI_HOME/ssh/gpucli-<run>.conf``), pulled in by one
``Include`` line at the top of ``~/.ssh/config`` (at the top, so it is not inside some other ``Host``
block). Each entry pins the run's host key in a known_hosts file of that run alone
(``GPUCLI_HOME/ssh/gpucli-<run>.known_hosts``, ``StrictHostKeyChecking yes``): a pod's address is
reused by the next pod, so the user's global known_hosts is never written. ``gpucli down`` removes both.
SkyPilot does the same per cluster (its generated ``~/.sky/generated/ssh`` files and an Include).
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko

from gpucli.errors import UsageError
from gpucli.settings import home, write_private
from gpucli.ssh import SshTarget
from gpucli.ssh.target import split_key

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord
    from gpucli.ssh import SshTarget

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def user_ssh_config() -> Path:
    return Path.home() / ".ssh" / "config"


def entries_dir() -> Path:
    return home() / "ssh"


def alias(run: str) -> str:
    return f"gpucli-{_SAFE.sub('_', run)}"


@dataclass(frozen=True)
class SshConfigEntry:
    alias: str
    path: Path  # the entry's file
    known_hosts: Path
    include_added: bool  # whether ~/.ssh/config got its Include line now


def _quote(value: str) -> str:
    """A value in ssh_config: double-quoted when it has spaces (ssh_config has no escapes inside quotes)."""
    if any(c in value for c in '"\n\r'):
        raise UsageError(f"cannot write {value!r} into an ssh config file")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def include_line() -> str:
    return f"Include {_quote(str(entries_dir() / 'gpucli-*.conf'))}"


def ensure_include(config: Path | None = None) -> bool:
    """Put gpucli's ``Include`` line at the top of ``~/.ssh/config`` (created 0600 if missing). True
    when it was added now."""
    config = config or user_ssh_config()
    line = include_line()
    try:
        text = config.read_text() if config.exists() else ""
    except OSError as exc:
        raise UsageError(f"cannot read {config}: {exc}") from exc
    if line in text.splitlines():
        return False
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = f"# gpucli: one file per run (gpucli ssh-config; removed by gpucli down)\n{line}\n\n{text}"
    tmp = config.with_name(f".{config.name}.gpucli{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(body)
    if config.exists():
        os.chmod(tmp, config.stat().st_mode & 0o777)
    os.replace(tmp, config)
    return True


def entry_text(record: RunRecord, known_hosts: Path) -> str:
    ssh = record.ssh
    assert ssh is not None
    lines = [f"# run {record.name} ({record.provider}); written by gpucli ssh-config", f"Host {alias(record.name)}",
             f"    HostName {_quote(ssh.host)}", f"    Port {ssh.port}", f"    User {_quote(ssh.user)}"]
    if ssh.identity_file:
        lines += [f"    IdentityFile {_quote(str(Path(ssh.identity_file).expanduser()))}", "    IdentitiesOnly yes"]
    if getattr(ssh, "proxy_jump", None):
        lines.append(f"    ProxyJump {_quote(ssh.proxy_jump)}")  # type: ignore[arg-type]
    lines += [f"    UserKnownHostsFile {_quote(str(known_hosts))}",
              "    StrictHostKeyChecking yes" if ssh.host_key else "    StrictHostKeyChecking accept-new",
              "    ServerAliveInterval 15"]
    return "\n".join(lines) + "\n"


def write_entry(record: RunRecord, *, config: Path | None = None, here: bool = False) -> SshConfigEntry:
    """Write (or refresh) the run's entry and its pinned key; add the Include line when missing.
    ``here``: the run's host is this machine (its target's ``caps.this_machine``), which has no endpoint."""
    if record.ssh is None:
        raise UsageError(f"run {record.name} has no SSH endpoint" + (" (it runs on this machine)"
                         if here else f" yet (status: {record.status})"))
    d = entries_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = alias(record.name)
    known = d / f"{name}.known_hosts"
    if record.ssh.host_key:
        key_type, key_b64 = split_key(record.ssh.host_key)
        write_private(known, f"{record.ssh.known_hosts_name} {key_type} {key_b64}\n")
    path = d / f"{name}.conf"
    write_private(path, entry_text(record, known))
    return SshConfigEntry(name, path, known, ensure_include(config))


def remove_entry(run: str) -> bool:
    """Forget the run's entry and key (``gpucli down``); True when there was one."""
    d = entries_dir()
    found = False
    for path in (d / f"{alias(run)}.conf", d / f"{alias(run)}.known_hosts"):
        if path.exists():
            path.unlink(missing_ok=True)
            found = True
    return found


# ---- reading the user's own entries (--provider ssh --host NAME) -----------------------------------

def target_from_config(name: str, identity_file: str | None = None, *, config: Path | None = None
                       ) -> SshTarget | None:
    """The endpoint ``~/.ssh/config`` gives the bare host ``name`` (no ``user@``, no ``:port``), or None
    when the file has no entry that says anything about it. ``--identity`` wins over IdentityFile."""
    config = config or user_ssh_config()
    if "@" in name or ":" in name or not config.is_file():
        return None
    try:
        parsed = paramiko.SSHConfig.from_path(str(config))
        found = parsed.lookup(name)
    except Exception as exc:  # noqa: BLE001 - paramiko raises several kinds for a bad file
        raise UsageError(f"{config}: cannot read it for host {name!r}: {type(exc).__name__}: {exc}") from exc
    if set(found) <= {"hostname"} and found.get("hostname", name) == name:
        return None
    try:
        port = int(found.get("port", 22))
    except ValueError as exc:
        raise UsageError(f"{config}: Port {found.get('port')!r} of host {name!r} is not a number") from exc
    if not 0 < port < 65536:
        raise UsageError(f"{config}: Port {port} of host {name!r} is out of range")
    keys = [k for k in found.get("identityfile", []) if Path(k).expanduser().is_file()]
    jump = found.get("proxyjump")
    return SshTarget(host=found.get("hostname", name), port=port, user=found.get("user") or _local_user(),
                     identity_file=identity_file or (keys[0] if keys else None),
                     proxy_jump=None if not jump or jump.lower() == "none" else jump)


def _local_user() -> str:
    """OpenSSH's default user: the local login name (not root, which a pod's default is)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "root"
