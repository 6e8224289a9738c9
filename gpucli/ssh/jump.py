"""Reaching an SSH host through another: OpenSSH's ProxyJump with the user's own ~/.ssh/config, or a
``direct-tcpip`` channel of a gpucli connection (a RunPod cluster's worker through its primary)."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

from gpucli.errors import ConnectionFailed
from gpucli.ssh.target import SshTarget


def jump_socket(pm: Any, t: SshTarget) -> Any:
    """A ProxyJump as OpenSSH makes it: ``ssh -W host:port JUMP`` with the user's ~/.ssh/config (the
    jump host's name, key and known_hosts are the user's own), its stdio the socket paramiko talks over.
    Only names and a port are on that command line."""
    exe = shutil.which("ssh")
    if exe is None:
        raise ConnectionFailed(f"ProxyJump {t.proxy_jump} needs the ssh client, and it is not installed")
    config = Path.home() / ".ssh" / "config"
    argv = [exe, *(["-F", str(config)] if config.is_file() else []), "-o", "BatchMode=yes",
            "-W", f"{t.host}:{t.port}", "--", str(t.proxy_jump)]
    try:
        return pm.ProxyCommand(" ".join(shlex.quote(a) for a in argv))
    except (pm.SSHException, OSError) as exc:
        raise ConnectionFailed(f"ProxyJump {t.proxy_jump}: {exc}") from exc


def hop_channel(pm: Any, transport: Any, t: SshTarget, timeout_s: float) -> Any:
    """A ``direct-tcpip`` channel (RFC 4254 7.2) from ``transport``'s host to ``t``'s host and port: the
    socket a connection to ``t`` runs its own SSH over, end to end (``t``'s host key is checked as any)."""
    try:
        return transport.open_channel("direct-tcpip", (t.host, t.port), ("127.0.0.1", 0), timeout=timeout_s)
    except (pm.SSHException, OSError, EOFError) as exc:
        raise ConnectionFailed(f"cannot reach {t.host}:{t.port} through {t.via}: {exc}",
                               hint="the node is not up on the cluster's network yet") from exc
