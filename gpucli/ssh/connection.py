"""One SSH connection: pinned host keys, authentication, commands with deadlines, detached processes.

The base of :class:`gpucli.ssh.Remote`; the file and sync methods live in :mod:`gpucli.ssh.files`
and :mod:`gpucli.ssh.sync` and use this class's transport, SFTP client and error translation.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import posixpath
import re
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpucli.errors import ConnectionFailed, HostKeyError, RemoteCommandError, TransferError
from gpucli.settings import home
from gpucli.ssh import _paramiko
from gpucli.ssh.jump import hop_channel, jump_socket
from gpucli.ssh.target import (
    CommandResult,
    SshTarget,
    append_known_host,
    fingerprint,
    key_algorithms,
    parse_target,
    read_known_hosts,
    split_key,
)

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)
_C = TypeVar("_C", bound="Connection")

# Receive window of exec and tar-stream channels. paramiko's BufferedPipe memmoves the whole
# buffered window on every read, so a big window costs CPU: profiled, 8 MiB spent 40% of a
# download there (with paramiko's SFTP reply path, which the pipelined reads no longer use). 2 MiB
# is OpenSSH's own default; on a long-RTT link it caps one channel at 2 MiB per round trip.
WINDOW_BYTES = 2 << 20
# The SFTP channel's window: the pipelined reads take the whole buffered window in one read (no
# memmove), so a bigger window only deepens the pipe; 8 MiB measured ~10% faster than 2 MiB on 1 GiB
# downloads (whole commands, medians of 10) and allows 4x more per round trip on a long link.
SFTP_WINDOW_BYTES = 8 << 20
# The extra SFTP channels of a parallel transfer (a long link): twice the window, so fewer of them
# fill the link when we are the receiver; each has at most POOL_INFLIGHT_BYTES of reads in flight.
POOL_WINDOW_BYTES = 16 << 20
POOL_INFLIGHT_BYTES = 24 << 20
# What sshd grants a session channel when we could not read it (OpenSSH channels.h:
# CHAN_SES_WINDOW_DEFAULT = 64 * CHAN_SES_PACKET_DEFAULT = 2 MiB).
SERVER_WINDOW_BYTES = 2 << 20
PACKET_BYTES = 256 << 10  # sshd honours it for data it sends us: 8x fewer packets to decrypt
IO_TIMEOUT_S = 60.0  # a channel silent this long is dead (keepalives run every 15 s)
# aes128-gcm first: paramiko lists it last, and its per-packet cost is what limits throughput on a
# fast link (measured in shared/reference/ssh-transfer.md); gpucli.ssh.wire batches it.
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


def norm(path: str) -> str:
    """SFTP does not expand '~'; both SFTP and exec start in the login directory, so drop it."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


class Connection:
    """One SSH connection (a paramiko Transport) plus one lazily opened SFTP channel, and what runs
    on it: commands with deadlines and detached processes. :class:`gpucli.ssh.Remote` adds files
    and sync on top.

    Not thread-safe for concurrent operations; use one per thread. Operations after the connection
    dropped reconnect once (the host key is checked again), so a ``tail`` loop can keep using the
    same object.
    """

    def __init__(self, target: SshTarget | str, *, known_hosts: Path | None = None,
                 connect_timeout_s: float = 15.0) -> None:
        self.target = parse_target(target) if isinstance(target, str) else target
        if known_hosts is None:
            known_hosts = home() / "known_hosts"
        self.known_hosts = known_hosts
        self.connect_timeout_s = connect_timeout_s
        self.host_key: str | None = None
        self._t: paramiko.Transport | None = None
        self._via: Connection | None = None  # the connection a target with ``via`` is reached through
        self._sftp: paramiko.SFTPClient | None = None
        self._max_read = _paramiko.DEFAULT_REQUEST
        self._max_write = _paramiko.DEFAULT_REQUEST
        self._pool: list[paramiko.SFTPClient] = []  # extra SFTP channels of parallel transfers
        self._prefetch: threading.Thread | None = None  # opening pool channels ahead of their use
        # The round trip of one SFTP request (the smallest seen) and the window sshd grants a
        # session channel: what sizes a parallel transfer (gpucli.ssh.parallel.channels_for).
        self.rtt_s: float | None = None
        self.server_window = SERVER_WINDOW_BYTES

    # -- connection ----------------------------------------------------------------------------

    def __enter__(self: _C) -> _C:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the transport, check the host key against the pin, authenticate."""
        pm = _paramiko.load()
        t = self.target
        if t.via is not None:
            sock = self._hop(pm, t, t.via)
        elif t.proxy_jump:
            sock = jump_socket(pm, t)
        else:
            try:
                sock = socket.create_connection((t.host, t.port), timeout=self.connect_timeout_s)
            except OSError as exc:
                raise ConnectionFailed(f"cannot reach {t.host}:{t.port}: {exc}",
                                       hint="is the machine up and the port right?") from exc
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = pm.Transport(sock, default_window_size=WINDOW_BYTES,
                                 default_max_packet_size=PACKET_BYTES)
        _paramiko.defer_own_sends(transport)
        try:
            transport.banner_timeout = self.connect_timeout_s
            transport.handshake_timeout = self.connect_timeout_s
            transport.auth_timeout = self.connect_timeout_s
            opts = transport.get_security_options()
            opts.ciphers = tuple(c for c in CIPHERS if c in opts.ciphers) or opts.ciphers
            pinned = self._pinned()
            if pinned:
                offered = [a for a in key_algorithms(pinned[0][0]) if a in opts.key_types]
                if offered:  # like OpenSSH: ask for the key type we know, so the check is meaningful
                    opts.key_types = tuple(offered)
            transport.start_client(timeout=self.connect_timeout_s)
            key = transport.get_remote_server_key()
            self._check_host_key(key.get_name(), key.get_base64(), pinned)
            self._authenticate(transport)
        except (HostKeyError, ConnectionFailed):
            self._drop(transport)
            raise
        except (pm.SSHException, OSError, EOFError) as exc:
            self._drop(transport)
            if not getattr(transport, "remote_version", ""):  # TCP connected, but no SSH server spoke
                raise ConnectionFailed(f"SSH to {t} failed: {t.host}:{t.port} accepted the connection but sent "
                                       f"no SSH banner within {self.connect_timeout_s:g} s",
                                       hint="is an SSH server listening on that port?") from exc
            raise ConnectionFailed(f"SSH to {t} failed: {exc}") from exc
        transport.set_keepalive(15)
        self._t = transport

    def _drop(self, transport: Any) -> None:
        """A connect that failed: its transport, and the hop it ran over."""
        transport.close()
        if self._via is not None:
            self._via.close()
            self._via = None

    def _hop(self, pm: Any, t: SshTarget, jump: SshTarget) -> Any:
        """The socket to ``t`` through ``jump``'s connection (its host key checked as any)."""
        via = Connection(jump, known_hosts=self.known_hosts, connect_timeout_s=self.connect_timeout_s)
        via.connect()
        try:
            assert via._t is not None
            chan = hop_channel(pm, via._t, t, self.connect_timeout_s)
        except ConnectionFailed:
            via.close()
            raise
        self._via = via
        return chan

    def _pinned(self) -> list[tuple[str, str, str]]:
        """(key type, base64, where) of every key pinned for this target, explicit pin first."""
        out = []
        if self.target.host_key:
            kt, kb = split_key(self.target.host_key)
            out.append((kt, kb, "the run record"))
        for k in read_known_hosts(self.known_hosts, self.target.known_hosts_name):
            out.append((k.key_type, k.key_b64, f"{self.known_hosts} line {k.line_no}"))
        return out

    def _check_host_key(self, key_type: str, key_b64: str,
                        pinned: list[tuple[str, str, str]]) -> None:
        name = self.target.known_hosts_name
        offered = f"{key_type} {fingerprint(key_b64)}"
        if self.target.host_key:
            want_type, want_b64 = split_key(self.target.host_key)
            if (want_type, want_b64) != (key_type, key_b64):
                raise HostKeyError(
                    f"host key of {name} does not match the one recorded for this run "
                    f"(expected {want_type} {fingerprint(want_b64)}, server offers {offered})",
                    hint="the pod may have been replaced; refusing to connect")
            if not any(p[:2] == (key_type, key_b64) for p in pinned[1:]):
                append_known_host(self.known_hosts, name, key_type, key_b64)
        elif pinned:
            if not any(p[:2] == (key_type, key_b64) for p in pinned):
                where = pinned[0][2]
                raise HostKeyError(
                    f"host key of {name} changed: server offers {offered}, pinned in {where} "
                    f"({pinned[0][0]} {fingerprint(pinned[0][1])})",
                    hint=f"if the machine was legitimately re-created, delete that line from "
                         f"{self.known_hosts} and connect again; otherwise someone may be "
                         f"intercepting the connection")
        else:
            log.info("pinning host key of %s (%s) in %s", name, offered, self.known_hosts)
            append_known_host(self.known_hosts, name, key_type, key_b64)
        self.host_key = f"{key_type} {key_b64}"

    def _authenticate(self, transport: paramiko.Transport) -> None:
        pm = _paramiko.load()
        t = self.target
        keys: list[Any] = []
        if t.identity_file:
            path = Path(t.identity_file).expanduser()
            try:
                keys.append(pm.PKey.from_path(str(path)))
            except FileNotFoundError as exc:
                raise ConnectionFailed(f"identity file {path} does not exist") from exc
            except pm.PasswordRequiredException as exc:
                raise ConnectionFailed(f"identity file {path} is passphrase-protected",
                                       hint="add it to ssh-agent (ssh-add) and omit --identity") from exc
            except (pm.SSHException, ValueError) as exc:
                raise ConnectionFailed(f"cannot load identity file {path}: {exc}") from exc
        else:
            with contextlib.suppress(pm.SSHException, OSError):
                keys.extend(pm.Agent().get_keys())
            for name in ("id_ed25519", "id_ecdsa", "id_rsa"):
                path = Path.home() / ".ssh" / name
                if path.exists():
                    with contextlib.suppress(pm.SSHException, ValueError, OSError):
                        keys.append(pm.PKey.from_path(str(path)))
        for key in keys:
            try:
                transport.auth_publickey(t.user, key)
            except pm.AuthenticationException:
                continue
            if transport.is_authenticated():
                return
        raise ConnectionFailed(
            f"authentication to {t} failed ({len(keys)} key(s) tried)",
            hint="pass --identity KEYFILE, or load the key into ssh-agent; the pod must have its "
                 "public key in authorized_keys")

    def close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        if self._t is not None:
            with contextlib.suppress(Exception):
                self._t.close()  # also makes a prefetch still opening channels fail at once
            self._t = None
        if self._prefetch is not None:
            self._prefetch.join(5)
            self._prefetch = None
        pool, self._pool = self._pool, []
        for extra in pool:
            with contextlib.suppress(Exception):
                extra.close()
        if self._via is not None:
            self._via.close()
            self._via = None

    def _transport(self) -> paramiko.Transport:
        if self._t is None or not self._t.is_active():
            self.close()
            self.connect()
        assert self._t is not None
        return self._t

    def _sftp_client(self) -> paramiko.SFTPClient:
        # A pipelined transfer that stopped midway closes the SFTP session (replies still unread
        # would desynchronise it): open a new one then.
        if self._sftp is None or self._sftp.get_channel().closed or self._t is None \
                or not self._t.is_active():
            pm = _paramiko.load()
            t = self._transport()
            try:
                sftp = pm.SFTPClient.from_transport(t, window_size=SFTP_WINDOW_BYTES,
                                                    max_packet_size=PACKET_BYTES)
            except (pm.SSHException, OSError, EOFError) as exc:
                raise ConnectionFailed(f"cannot open SFTP on {self.target}: {exc}") from exc
            sftp.get_channel().settimeout(IO_TIMEOUT_S)
            self._sftp = sftp
            window = _paramiko.send_window(sftp.get_channel())
            if window is not None and window.left() > 0:
                self.server_window = window.left()
            started = time.monotonic()
            self._max_read, self._max_write = _paramiko.sftp_limits(sftp)
            self.note_rtt(time.monotonic() - started)
        return self._sftp

    def note_rtt(self, seconds: float) -> None:
        """Record the time of one request-reply exchange; the smallest seen is the RTT."""
        if seconds > 0 and (self.rtt_s is None or seconds < self.rtt_s):
            self.rtt_s = seconds

    def measure_rtt(self) -> float:
        """The connection's round trip in seconds: the smallest exchange seen, or one
        ``keepalive@openssh.com`` global request (sshd answers it at once) when none was timed."""
        if self.rtt_s is None:
            t = self._transport()
            started = time.monotonic()
            t.global_request("keepalive@openssh.com", wait=True)
            self.note_rtt(time.monotonic() - started)
        return self.rtt_s or 0.0

    def prefetch_pool(self, channels: Callable[[float], int]) -> None:
        """Start opening, in the background, the extra SFTP channels a parallel transfer is about
        to ask for (``channels(rtt)`` of them). Each costs a channel open, sftp-server started
        through the login shell and the SFTP handshake: several round trips, 0.7 s at 100 ms,
        which then overlap the transfer's own set-up (listing, folders, parts) instead of delaying
        its first byte. A failure here is only a lost head start: :meth:`_sftp_pool` opens
        whatever is missing and reports its own errors."""
        if self._prefetch is not None:
            return

        def run() -> None:
            with contextlib.suppress(Exception):  # retried (and reported) by _sftp_pool
                n = channels(self.measure_rtt())
                if n > 1:
                    self._open_pool(n)

        self._prefetch = threading.Thread(target=run, daemon=True, name="gpucli-sftp-open")
        self._prefetch.start()

    def _sftp_pool(self, n: int) -> list[paramiko.SFTPClient]:
        """``n`` extra SFTP sessions (each its own channel, window and sftp-server) for a parallel
        transfer, opened at once and kept for the next transfer on this connection. Sessions a
        transfer closed midway are replaced."""
        if self._prefetch is not None:
            self._prefetch.join(self.connect_timeout_s + 10)
            self._prefetch = None
        self._sftp_client()  # limits, RTT and a live transport first
        return self._open_pool(n)

    def _open_pool(self, n: int) -> list[paramiko.SFTPClient]:
        self._pool = [s for s in self._pool if not s.get_channel().closed]
        need = n - len(self._pool)
        if need > 0:
            pm = _paramiko.load()
            t = self._transport()
            opened: list[Any] = [None] * need

            def open_one(i: int) -> None:
                try:
                    sftp = pm.SFTPClient.from_transport(t, window_size=POOL_WINDOW_BYTES,
                                                        max_packet_size=PACKET_BYTES)
                    sftp.get_channel().settimeout(IO_TIMEOUT_S)
                    opened[i] = sftp
                except (pm.SSHException, OSError, EOFError) as exc:
                    opened[i] = exc

            threads = [threading.Thread(target=open_one, args=(i,), daemon=True) for i in range(need)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(self.connect_timeout_s + 5)
            for got in opened:
                if isinstance(got, BaseException) or got is None:
                    for s in opened:
                        if s is not None and not isinstance(s, BaseException):
                            with contextlib.suppress(Exception):
                                s.close()
                    raise ConnectionFailed(f"cannot open SFTP on {self.target}: {got or 'timed out'}")
            self._pool.extend(opened)
        return self._pool[:n]

    # -- commands ------------------------------------------------------------------------------

    def _exec(self, cmd: str, *, timeout_s: float, input: bytes | None = None) -> tuple[int, bytes, bytes]:
        pm = _paramiko.load()
        deadline = time.monotonic() + timeout_s
        try:
            chan = self._transport().open_session(timeout=min(timeout_s, self.connect_timeout_s))
            try:
                chan.exec_command(cmd)
                if input:
                    chan.sendall(input)
                chan.shutdown_write()
                out, err = bytearray(), bytearray()
                while True:
                    if chan.recv_ready():
                        out += chan.recv(1 << 20)
                        continue
                    if chan.recv_stderr_ready():
                        err += chan.recv_stderr(1 << 20)
                        continue
                    if chan.exit_status_ready() and not chan.recv_ready() \
                            and not chan.recv_stderr_ready():
                        if chan.closed or chan.eof_received:
                            break
                    if chan.closed and not chan.exit_status_ready():
                        raise ConnectionFailed(f"connection to {self.target} dropped while running "
                                               f"`{_short(cmd)}`")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RemoteCommandError(
                            f"`{_short(cmd)}` on {self.target} did not finish within {timeout_s:g} s",
                            hint="the command may still be running on the remote host")
                    select.select([chan], [], [], min(left, 0.5))
                return chan.recv_exit_status(), bytes(out), bytes(err)
            finally:
                chan.close()
        except (RemoteCommandError, ConnectionFailed):
            raise
        except (pm.SSHException, OSError, EOFError) as exc:
            raise ConnectionFailed(f"connection to {self.target} failed while running "
                                   f"`{_short(cmd)}`: {exc}") from exc

    def run(self, cmd: str, *, timeout_s: float, check: bool = True,
            input: bytes | str | None = None) -> CommandResult:
        """Run ``cmd`` through the login shell; stdout/stderr decoded as UTF-8 (replacing errors).

        Every call has a deadline: past it the channel is closed and RemoteCommandError raised (the
        remote process is not killed; wrap long commands in ``timeout`` if that matters).
        """
        data = input.encode() if isinstance(input, str) else input
        code, out, err = self._exec(cmd, timeout_s=timeout_s, input=data)
        result = CommandResult(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
        if check and code != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-500:]
            raise RemoteCommandError(f"`{_short(cmd)}` failed on {self.target} with exit code {code}"
                                     + (f": {tail}" if tail else ""))
        return result

    def start_detached(self, cmd: str, *, cwd: str, log_path: str, env_file: str | None = None,
                       timeout_s: float = 30.0) -> int:
        """Start ``cmd`` (a shell command line) in its own session with stdin from /dev/null and
        stdout+stderr appended to ``log_path``; return its pid, which is also its process group id.

        ``setsid`` detaches it from the SSH session, so it survives the connection dropping or the
        laptop closing. With ``env_file``, the remote shell sources it (``set -a``) before running
        ``cmd``: secrets come from the 0600 file, never from a command line visible in ``ps``.
        """
        q = _sh_path
        log_path = norm(log_path)
        pid_file = log_path + ".pid"
        # Paths travel as arguments of the inner shell and are absolute ("$HOME"/rel when given
        # relative), because `cd cwd` changes what a relative path means.
        inner = 'echo $$ > "$1"; ' + ('set -a; . "$2"; set +a; ' if env_file else "") + "shift 2; " + cmd
        env_arg = q(norm(env_file)) if env_file else "''"
        script = (
            f"mkdir -p {q(posixpath.dirname(log_path) or '.')} && cd {q(norm(cwd))} || exit 1; "
            f"rm -f {q(pid_file)}; "
            f"setsid nohup sh -c {shlex.quote(inner)} sh {q(pid_file)} {env_arg} "
            f">> {q(log_path)} 2>&1 < /dev/null & "
            f"i=0; while [ ! -s {q(pid_file)} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
            f"cat {q(pid_file)}"
        )
        res = self.run(script, timeout_s=timeout_s)
        try:
            return int(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise RemoteCommandError(f"could not start `{_short(cmd)}` on {self.target}: "
                                     f"{res.stderr.strip() or 'no pid reported'}") from exc

    def is_running(self, pid: int, *, timeout_s: float = 15.0) -> bool:
        """Whether any process of the run's process group is alive. Zombies do not count: in a
        container without an init, exited processes may never be reaped."""
        p = int(pid)
        cmd = (f"if command -v ps >/dev/null 2>&1; then "
               f"ps -eo pgid=,stat= | awk -v g={p} '$1==g && $2 !~ /^Z/ {{f=1}} END {{exit !f}}'; "
               f"else kill -s 0 -- -{p} 2>/dev/null; fi")
        return self.run(cmd, timeout_s=timeout_s, check=False).exit_code == 0

    def signal(self, pid: int, sig: str = "TERM", *, timeout_s: float = 15.0) -> bool:
        """Send ``sig`` to the process group of a :meth:`start_detached` pid (torchrun and its
        workers all get it); returns False when nothing was running."""
        if not re.fullmatch(r"[A-Z0-9]+", sig):
            raise ValueError(f"bad signal name {sig!r}")
        p = int(pid)
        # `kill -s SIG -- -PGID` is the form both dash and bash accept (dash rejects `kill -SIG -- -PGID`).
        res = self.run(f"kill -s {sig} -- -{p} 2>/dev/null || kill -s {sig} {p} 2>/dev/null",
                       timeout_s=timeout_s, check=False)
        return res.exit_code == 0

    # -- small files ---------------------------------------------------------------------------

    def _io(self, what: str) -> contextlib.AbstractContextManager[None]:
        return _translate_errors(self, what)


def _short(cmd: str, limit: int = 80) -> str:
    one = " ".join(cmd.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def _sh_path(path: str) -> str:
    """Quote a remote path for sh, anchoring a relative one at $HOME (it is used after a `cd`)."""
    return shlex.quote(path) if path.startswith("/") else '"$HOME"/' + shlex.quote(path)


@contextlib.contextmanager
def _translate_errors(remote: Connection, what: str) -> Iterator[None]:
    """A dropped connection or SFTP failure becomes TransferError saying how to resume; the
    connection is reset so the next call reconnects."""
    pm = _paramiko.load()
    try:
        yield
    except (TransferError, ConnectionFailed, RemoteCommandError):
        raise
    except FileNotFoundError as exc:
        raise TransferError(f"{what}: no such file: {exc.filename or exc}") from exc
    except PermissionError as exc:
        raise TransferError(f"{what}: permission denied: {exc.filename or exc}") from exc
    except (pm.SSHException, EOFError, OSError) as exc:  # socket.timeout is an OSError
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise TransferError(f"{what}: no space left on device") from exc
        remote.close()
        raise TransferError(f"{what} on {remote.target} failed: {exc or type(exc).__name__}",
                            hint="the connection may have dropped; run the same command again "
                                 "to resume") from exc
