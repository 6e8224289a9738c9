"""A real OpenSSH sshd on 127.0.0.1 for tests: its own host key, authorized_keys and port.

    server = SshServer.start(tmp_path / "sshd", authorized_keys=[pubkey_text])
    ...  # connect to server.host:server.port as server.user
    server.stop()

``kill_sessions()`` kills the per-connection sshd children (not the listener), which is how the fault
tests cut a connection mid-transfer. ``set_env={"NAME": "value"}`` writes an sshd ``SetEnv`` line, so every
session (exec, shell, sftp) and everything it starts sees those variables (the cloud emulators use it
to hand a pod's processes its environment).
"""

from __future__ import annotations

import getpass
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_keypair(path: Path, kind: str = "ed25519") -> tuple[Path, str]:
    """Create an OpenSSH key pair at ``path``; returns (private key path, public key text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path), "-C", "gpucli-test"],
                       check=True)
    return path, path.with_suffix(path.suffix + ".pub").read_text().strip()


def _set_env_item(name: str, value: str) -> str:
    """One ``NAME=value`` word of an sshd_config ``SetEnv`` line (double-quoted when it has spaces)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or any(c in value for c in '"\n\r\\'):
        raise ValueError(f"cannot pass {name!r} through sshd SetEnv")
    return f'"{name}={value}"' if any(c.isspace() for c in value) else f"{name}={value}"


@dataclass
class SshServer:
    root: Path
    port: int
    proc: subprocess.Popen
    host: str = "127.0.0.1"
    user: str = field(default_factory=getpass.getuser)
    host_key_pub: str = ""

    @classmethod
    def start(cls, root: Path, authorized_keys: list[str], port: int | None = None,
              timeout_s: float = 10.0, set_env: dict[str, str] | None = None,
              sftp_server: str = "internal-sftp") -> SshServer:
        """``sftp_server``: the sftp Subsystem; Debian's default is ``/usr/lib/openssh/sftp-server``,
        which sshd runs through the login shell like any command (the benchmark uses it)."""
        if not os.path.exists(SSHD):
            raise RuntimeError("openssh-server is not installed (scripts/test.sh installs it)")
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation dir sshd insists on
        host_key, host_pub = make_keypair(root / "ssh_host_ed25519_key")
        auth = root / "authorized_keys"
        auth.write_text("".join(k.strip() + "\n" for k in authorized_keys))
        os.chmod(auth, 0o600)
        port = port or free_port()
        config = root / "sshd_config"
        config.write_text(
            f"Port {port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {host_key}\n"
            f"PidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {auth}\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\n"
            "UsePAM no\n"
            "StrictModes no\n"
            f"Subsystem sftp {sftp_server}\n"
            "MaxSessions 64\n"
            "MaxStartups 64:30:128\n"
            "LogLevel ERROR\n"
            # sshd honours only the first SetEnv line: every variable goes on that one line.
            + (f"SetEnv {' '.join(_set_env_item(k, v) for k, v in set_env.items())}\n" if set_env else "")
        )
        log = open(root / "sshd.log", "ab")
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                                start_new_session=True)
        server = cls(root=root, port=port, proc=proc, host_key_pub=host_pub)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(root / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return server
            except OSError:
                time.sleep(0.05)
        server.stop()
        raise RuntimeError("sshd did not come up in time")

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def session_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes (children of the listener)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_sessions(self) -> int:
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
