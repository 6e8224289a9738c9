"""Seeing a run and using its model: TensorBoard over the run's SSH connection, and a local
OpenAI-compatible server (``python -m trainer.serve``) for a checkpoint.

The tunnel is :class:`PortForward`: a local listening socket whose every accepted connection becomes a
``direct-tcpip`` channel of the run's already-open, host-key-pinned paramiko Transport (RFC 4254
section 7.2, what ``ssh -L`` does): no extra key, no port opened on the pod. TensorBoard on the host
is bound to 127.0.0.1 there, so only this tunnel reaches it.

Nothing here prints: the command layer renders the URLs and notices.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import posixpath
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gpucli
from gpucli.errors import GpucliError, NotFoundError, RemoteCommandError, UsageError

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

log = logging.getLogger(__name__)

REMOTE_TB_PORT = 6006
TB_STATE = ".tensorboard"  # in the run's folder on the host: "<pid> <port>" of the TensorBoard gpucli started
READY_TIMEOUT_S = 120.0
_BUF = 1 << 16


class PortForward:
    """``local_host:local_port`` -> ``remote_host:remote_port`` as seen from the SSH server, through
    ``transport`` (a connected ``paramiko.Transport``), until :meth:`close`. Port 0 picks a free one
    (:attr:`port`). Only public paramiko API: ``Transport.open_channel`` and ``Channel``'s socket-like
    methods."""

    def __init__(self, transport: Any, remote_port: int, *, remote_host: str = "127.0.0.1",
                 local_host: str = "127.0.0.1", local_port: int = 0, open_timeout_s: float = 15.0) -> None:
        self.transport = transport
        self.remote = (remote_host, remote_port)
        self.open_timeout_s = open_timeout_s
        self._sock = socket.create_server((local_host, local_port))
        self._sock.settimeout(0.5)
        self.host, self.port = self._sock.getsockname()[:2]
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept_loop, name="forward-accept", daemon=True)
        self._accepter.start()

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return not self._closed.is_set() and bool(self.transport.is_active())

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._accepter.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)

    def wait(self, poll_s: float = 0.5) -> None:
        """Block until closed or the SSH connection drops (Ctrl-C raises KeyboardInterrupt as usual)."""
        while self.alive:
            time.sleep(poll_s)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn, peer), name="forward-conn", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        try:
            chan = self.transport.open_channel("direct-tcpip", self.remote, peer[:2], timeout=self.open_timeout_s)
        except Exception as exc:  # refused on the far side (nothing listening) or the connection is gone
            log.info("forward to %s:%s refused: %s", *self.remote, exc)
            conn.close()
            return
        try:
            _pump(conn, chan, self._closed)
        finally:
            chan.close()
            conn.close()


def _pump(conn: socket.socket, chan: Any, closed: threading.Event) -> None:
    """Copy bytes both ways until both sides have finished sending (or ``closed``)."""
    conn_open = chan_open = True
    while (conn_open or chan_open) and not closed.is_set():
        readers = ([conn] if conn_open else []) + ([chan] if chan_open else [])
        ready, _, _ = select.select(readers, [], [], 0.5)
        for r in ready:
            try:
                data = r.recv(_BUF)
            except OSError:
                data = b""
            other = chan if r is conn else conn
            if data:
                try:
                    other.sendall(data)
                except OSError:
                    return
                continue
            if r is conn:  # the local client finished sending: pass the half-close on
                conn_open = False
                with contextlib.suppress(OSError):
                    chan.shutdown_write()
            else:
                chan_open = False
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
        if chan.closed:
            return


def transport_of(host: Host) -> Any:
    """The paramiko Transport of a connected :class:`gpucli.ssh.Remote`."""
    transport = getattr(host, "transport", None)
    if transport is None:
        getter = getattr(host, "_transport", None)  # Remote keeps it behind a reconnecting accessor
        transport = getter() if callable(getter) else None
    if transport is None:
        raise GpucliError("this run's host has no SSH connection to forward through")
    return transport


# --- TensorBoard -------------------------------------------------------------------------------


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tensorboard_argv(python: str, logdir: str, port: int) -> list[str]:
    return [python, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)]


def _bind_probe(python: str, port: int) -> str:
    """A host command that binds 127.0.0.1:``port`` (0: any) and prints the port; fails when taken."""
    code = f"import socket; s = socket.socket(); s.bind(('127.0.0.1', {port})); print(s.getsockname()[1])"
    return f"{shlex.quote(python)} -c {shlex.quote(code)}"


def run_logdir(record: RunRecord, logdir: str | None = None) -> str:
    """Where a run's TensorBoard events are, relative to its folder: the bundled trainer's ``tb``; for
    your own code the code folder (TensorBoard finds ``runs/``, ``lightning_logs/``... under it), or
    ``--logdir`` inside it."""
    if record.inputs.own is None:
        return "tb"
    sub = posixpath.normpath((logdir or ".").strip("/")) if logdir else "."
    if sub.startswith("..") or posixpath.isabs(sub):
        raise GpucliError(f"--logdir {logdir}: must be a folder inside the code folder")
    return "code" if sub == "." else f"code/{sub}"


EVENTS_PATTERN = "events.out.tfevents.*"


def ensure_remote_tensorboard(host: Host, record: RunRecord, *, port: int | None = None, logdir: str = "tb",
                              on_event: Callable[[str], None] = lambda m: None) -> int:
    """TensorBoard on the run's host, bound to 127.0.0.1, serving ``logdir`` of the run's folder (the
    trainer's ``tb/``); started (detached, its pid and port kept in ``.tensorboard``) unless the one
    gpucli started before is still running. ``port`` None: 6006 when free on the host, else any free
    one. Returns its port on the host."""
    state = f"{record.workdir}/{TB_STATE}"
    with contextlib.suppress(Exception):
        pid_s, port_s = host.read_file(state).decode().split()
        if host.is_running(int(pid_s)):
            on_event(f"TensorBoard already running on the host (port {port_s})")
            return int(port_s)
    if logdir == "tb":  # the trainer's folder, made with its first logged step
        found = host.exists(f"{record.workdir}/tb")
    else:  # your own code's: wherever under the code folder its loggers write
        found = bool(host.run(f"find {shlex.quote(f'{record.workdir}/{logdir}')} -name "
                              f"{shlex.quote(EVENTS_PATTERN)} -print -quit 2>/dev/null",
                              timeout_s=60, check=False).stdout.strip())
    if not found:
        raise NotFoundError(f"the run has no TensorBoard events yet ({record.workdir}/{logdir})",
                            hint="they appear with the first logged step")
    if port is None:
        if host.run(_bind_probe(record.python, REMOTE_TB_PORT), timeout_s=30, check=False).exit_code == 0:
            port = REMOTE_TB_PORT
        else:
            port = int(host.run(_bind_probe(record.python, 0), timeout_s=30).stdout)
    cmd = shlex.join(tensorboard_argv(record.python, logdir, port))
    pid = host.start_detached(cmd, cwd=record.workdir, log_path=f"{record.workdir}/tensorboard.log")
    host.write_file(state, f"{pid} {port}\n".encode())
    on_event(f"started TensorBoard on the host (pid {pid}, port {port})")
    return port


def wait_http(opener: Callable[[], Any], *, timeout_s: float = READY_TIMEOUT_S, what: str,
              alive: Callable[[], bool] = lambda: True) -> None:
    """Poll ``opener`` (returns a response or raises) until it answers, ``alive`` turns false, or the
    deadline passes."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not alive():
            raise RemoteCommandError(f"{what} exited before it answered")
        try:
            with opener():
                return
        except urllib.error.HTTPError:
            return  # it answers, even if not that path
        except (OSError, urllib.error.URLError) as exc:
            last = exc
            time.sleep(0.5)
    raise RemoteCommandError(f"{what} did not answer within {timeout_s:g} s ({last})")


def url_ready(url: str, timeout_s: float = READY_TIMEOUT_S, *, what: str,
              alive: Callable[[], bool] = lambda: True) -> None:
    wait_http(lambda: urllib.request.urlopen(url, timeout=5), timeout_s=timeout_s, what=what, alive=alive)


# --- serving a checkpoint ----------------------------------------------------------------------


@dataclass(frozen=True)
class ServedModel:
    checkpoint: Path
    url: str  # the API base, http://127.0.0.1:PORT/v1
    process: subprocess.Popen[bytes]


def is_checkpoint(path: Path) -> bool:
    """A checkpoint folder, a run's ``checkpoints`` folder or a run folder (what trainer.sample takes)."""
    return (path / "meta.json").is_file() or (path / "checkpoints").is_dir() or any(path.glob("step_*/meta.json"))


def start_server(checkpoint: Path, *, port: int, python: str = sys.executable, log_path: Path,
                 timeout_s: float = READY_TIMEOUT_S) -> ServedModel:
    """``python -m trainer.serve`` for ``checkpoint`` on 127.0.0.1:``port``, waited for until it answers
    ``/v1/models``; its output goes to ``log_path``. The caller stops it (:func:`stop_server`)."""
    repo = Path(gpucli.__file__).resolve().parents[1]  # holds gpucli/ and trainer/
    port_free(port)  # else another server's answer would read as this one's
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([python, "-m", "trainer.serve", "--checkpoint", str(checkpoint),
                                 "--host", "127.0.0.1", "--port", str(port)],
                                cwd=repo, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_end_with_parent if sys.platform == "linux" else None)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        url_ready(f"{url}/models", timeout_s, what="the model server", alive=lambda: proc.poll() is None)
    except RemoteCommandError as exc:
        stop_server(proc)
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] if log_path.exists() else []
        raise RemoteCommandError(f"{exc}: {tail[0] if tail else 'no output'} (log: {log_path})") from None
    return ServedModel(checkpoint, url, proc)


def port_free(port: int) -> None:
    """A UsageError (one line) when something already listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a listener fails it, a TIME_WAIT does not
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise UsageError(f"port {port} on 127.0.0.1 is in use ({exc.strerror or exc})",
                             hint="pass --port with a free one") from None


def _end_with_parent() -> None:
    """In the server's process before it runs (Linux): SIGTERM when gpucli's process ends, however
    it ends (SIGKILL included), so a model server never outlives its `gpucli serve`."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
