"""The one place that touches paramiko's private attributes; everything else uses its public API.

gpucli's transfers are fast because they bypass two slow paths of paramiko (see :mod:`gpucli.ssh.sftp`
and :mod:`gpucli.ssh.wire` for the measurements). Both need state paramiko does not publish. Every
private attribute relied on is listed here and in the comment above the paramiko pin in
``pyproject.toml``; keep the two lists equal when adding one:

``SFTPClient``
    ``_lock``, ``request_number`` (allocating request numbers for requests we frame ourselves),
    ``_request`` (the ``limits@openssh.com`` extension), ``_convert_status`` (a status reply -> the
    exception paramiko raises for it), ``_async_request`` and ``_read_response`` (several requests
    sent before their replies are read: :func:`pipelined`); ``SFTPFile.handle`` (the open file's
    SFTP handle).
``Channel``
    ``lock``, ``_wait_for_send_window``, ``out_window_size``, ``remote_chanid`` (taking send window
    for a batch of channel data).
``Transport``
    ``_send_user_message``, ``clear_to_send``, ``clear_to_send_lock``, ``clear_to_send_timeout``,
    ``active``, ``packetizer``, ``sock``.
``Packetizer`` (name-mangled ``_Packetizer__*``)
    ``aead_out``, ``write_lock``, ``compress_engine_out``, ``dump_packets``, ``block_engine_out``,
    ``iv_out``, ``sequence_number_out``, ``keepalive_last``, ``sent_bytes``, ``sent_packets``,
    ``need_rekey``, ``received_bytes_overflow``, ``received_packets_overflow``; and ``REKEY_BYTES``,
    ``REKEY_PACKETS``, ``_trigger_rekey``.

When one is missing (another paramiko version), the caller falls back to paramiko's public path
(``SFTPFile.read``/``write`` pipelined, ``Channel.sendall``) and the fallback is logged at debug,
once per reason, so a slower transfer can be traced to its cause without noise in a loop.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_REQUEST = 32 << 10  # paramiko's own; used when the server does not answer limits@openssh.com
_REQUEST_CAP = 1 << 20

_P = "_Packetizer__"
_GCM_STATE = ("aead_out", "write_lock", "compress_engine_out", "dump_packets", "block_engine_out",
              "iv_out", "sequence_number_out", "sent_bytes", "sent_packets", "need_rekey")
_logged: set[str] = set()
_logged_lock = threading.Lock()


def load() -> Any:
    """Import paramiko without ``invoke``: paramiko.config imports it eagerly when installed, only
    for ssh_config ``Match exec`` (which gpucli never parses), and that costs ~0.2 s of every SSH
    command's start-up on these machines. Other importers of invoke are unaffected afterwards."""
    if "paramiko" in sys.modules:
        _quiet_transport_logs()  # imported by someone else first: still never its tracebacks on stderr
        return sys.modules["paramiko"]
    blocked = "invoke" not in sys.modules
    if blocked:
        sys.modules["invoke"] = None  # type: ignore[assignment]  # makes `import invoke` fail fast
    try:
        import paramiko  # lazy: paramiko (~0.3 s) loads at the first connection
    finally:
        if blocked:
            del sys.modules["invoke"]
    _quiet_transport_logs()
    return paramiko


def _quiet_transport_logs() -> None:
    """paramiko's transport thread logs a failed handshake (a host that never sends an SSH banner, a
    frozen pod) as ERROR lines with a traceback; with no handler anywhere Python prints them on stderr.
    The failure reaches the user once, as the one-line ConnectionFailed the caller raises."""
    logger = logging.getLogger("paramiko")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())


def fallback(reason: str) -> None:
    """Log, once per process and reason, that paramiko's public (slower) path is taken."""
    with _logged_lock:
        if reason in _logged:
            return
        _logged.add(reason)
    log.debug("paramiko fallback: %s; using paramiko's public path", reason)


# ---------------------------------------------------------------------------------------------------
# Key re-exchange


def defer_own_sends(transport: Any) -> None:
    """Keep a key re-exchange from stalling the connection (paramiko/paramiko#822, open since 2016).

    Once paramiko has sent KEXINIT (every 512 MiB, or whatever ``REKEY_BYTES`` says) it holds every
    ``_send_user_message`` until the exchange ends, as RFC 4253 7.1 asks. But a message the server
    sent before it saw our KEXINIT (a channel's close, most often) is handled on the transport's own
    thread, whose reply then waits for an exchange only that thread can finish: the connection stalls
    for ``clear_to_send_timeout`` (30 s) and dies with "Key-exchange timed out waiting for key
    negotiation". Here what the transport thread sends while an exchange is under way (or while
    earlier such messages still wait) goes to a queue that one helper thread sends, in order, once
    the exchange is over; every other thread keeps paramiko's own wait."""
    if not all(hasattr(transport, a) for a in ("_send_user_message", "clear_to_send")):
        fallback("Transport lacks _send_user_message/clear_to_send: a key exchange may stall a channel close")
        return
    original = transport._send_user_message
    queue: list[Any] = []
    lock = threading.Lock()
    busy = [False]

    def drain() -> None:
        while True:
            with lock:
                if not queue:
                    busy[0] = False
                    return
                data = queue[0]
            try:
                original(data)  # waits for the exchange to end, as paramiko does
            except Exception as exc:  # the exchange never ended: the transport is failing anyway
                log.debug("a reply held over a key exchange was not sent: %s", exc)
                with lock:
                    queue.clear()
                    busy[0] = False
                return
            with lock:
                queue.pop(0)

    def send(data: Any) -> None:
        own = threading.current_thread() is transport  # (a bool: mypy would narrow transport to Thread)
        if own:
            with lock:
                if queue or not transport.clear_to_send.is_set():
                    queue.append(data)
                    transport.gpucli_held_over_kex = getattr(transport, "gpucli_held_over_kex", 0) + 1
                    if not busy[0]:
                        busy[0] = True
                        threading.Thread(target=drain, name="gpucli-kex-held", daemon=True).start()
                    return
        original(data)

    transport._send_user_message = send


# ---------------------------------------------------------------------------------------------------
# SFTP


def sftp_limits(sftp: Any) -> tuple[int, int]:
    """Ask OpenSSH for its max read/write length (255 KiB); paramiko's 32 KiB default splits every
    request into a full packet and a tiny one (paramiko #494)."""
    from paramiko.sftp import (  # lazy: paramiko (~0.3 s) loads at the first connection
        CMD_EXTENDED,
        CMD_EXTENDED_REPLY,
    )

    request = getattr(sftp, "_request", None)
    if request is None:
        fallback("SFTPClient._request is missing: requests of 32 KiB")
        return DEFAULT_REQUEST, DEFAULT_REQUEST
    try:
        kind, msg = request(CMD_EXTENDED, "limits@openssh.com")
        if kind != CMD_EXTENDED_REPLY:
            return DEFAULT_REQUEST, DEFAULT_REQUEST
        msg.get_int64()  # max packet length
        max_read, max_write = msg.get_int64(), msg.get_int64()
    except (OSError, EOFError, struct.error, Exception):  # any refusal means "use the default"
        return DEFAULT_REQUEST, DEFAULT_REQUEST
    return (min(max_read, _REQUEST_CAP) or DEFAULT_REQUEST), (min(max_write, _REQUEST_CAP) or DEFAULT_REQUEST)


class _Replies:
    """Where paramiko's reader hands the replies of requests sent by :func:`pipelined` (the
    ``_async_response`` hook its own prefetching files use), matched by request number."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[int, Any]] = {}

    def _async_response(self, t: int, msg: Any, num: int) -> None:
        self.got[num] = (t, msg)


def pipelined(sftp: Any, requests: list[tuple[Any, ...]]) -> list[tuple[int, Any]] | None:
    """Send every request (``(type, *args)`` as paramiko frames them) before reading any reply: the
    whole list costs one round trip instead of one each. Returns ``(reply type, Message)`` per
    request, in the order given (replies are matched by request number, so a server answering out
    of order is fine); None where paramiko lacks the hooks (the caller goes one request at a time).

    Requests that depend on an earlier one (a folder then its child, a write then a rename) rely on
    the server running requests in the order they arrive: OpenSSH's sftp-server does (``sftp-server.c``
    handles one message at a time from its input buffer, in ``process()``), and callers check the
    outcome (a stat at the end) where the order matters."""
    send = getattr(sftp, "_async_request", None)
    read = getattr(sftp, "_read_response", None)
    if send is None or read is None:
        fallback("SFTPClient lacks _async_request/_read_response: one request per round trip")
        return None
    sink = _Replies()
    nums = [send(sink, *req) for req in requests]
    while len(sink.got) < len(nums):
        read()  # one reply, handed to sink (the channel's timeout bounds the wait)
    return [sink.got[n] for n in nums]


def status_error(sftp: Any, msg: Any) -> BaseException | None:
    """The exception paramiko raises for a status reply ``msg`` (None for OK)."""
    try:
        sftp._convert_status(msg)
    except (OSError, EOFError) as exc:  # what _convert_status raises for a failed status
        return exc
    return None


def sftp_pipeline_ok(sftp: Any, what: str) -> bool:
    """Whether ``sftp`` has what the hand-framed request pipelines need."""
    if all(hasattr(sftp, a) for a in ("_lock", "request_number", "_convert_status")):
        return True
    fallback(f"SFTPClient lacks _lock/request_number/_convert_status: {what}")
    return False


def file_handle(fh: Any, what: str) -> bytes | None:
    """The SFTP handle of an open ``SFTPFile`` as framed on the wire (length-prefixed), or None."""
    handle = getattr(fh, "handle", None)
    if not isinstance(handle, bytes):
        fallback(f"SFTPFile.handle is missing: {what}")
        return None
    return struct.pack(">I", len(handle)) + handle


@contextlib.contextmanager
def request_numbers(sftp: Any) -> Iterator[Callable[[], int]]:
    """Allocate SFTP request numbers under the client's lock, so no request of paramiko's own (from
    another thread) gets the same number."""
    with sftp._lock:
        def take() -> int:
            num: int = sftp.request_number
            sftp.request_number += 1
            return num

        yield take


def raise_status(sftp: Any, body: bytes) -> None:
    """Raise the exception paramiko raises for an SFTP status reply ``body`` (no-op for OK)."""
    from paramiko.message import Message  # lazy: paramiko (~0.3 s) loads at the first connection

    sftp._convert_status(Message(body))


# ---------------------------------------------------------------------------------------------------
# channels and the transport's packetizer


class SendWindow:
    """The channel's lock, its send-window waiter, the window left and the peer's channel number:
    what taking send window for a batch of channel data needs."""

    def __init__(self, chan: Any) -> None:
        self._chan = chan
        self.lock = chan.lock
        self.wait = chan._wait_for_send_window  # blocks for window (up to the channel timeout)
        self.recipient: int = chan.remote_chanid
        chan.out_window_size  # noqa: B018  # read in left(): fail here, before any data moves

    def left(self) -> int:
        return int(self._chan.out_window_size)


def send_window(chan: Any) -> SendWindow | None:
    """The channel's :class:`SendWindow`, or None where paramiko differs."""
    try:
        return SendWindow(chan)
    except AttributeError:
        fallback("Channel lacks lock/_wait_for_send_window/out_window_size/remote_chanid: "
                 "Channel.sendall")
        return None


def send_message(transport: Any, payload: bytes | bytearray) -> None:
    """Send one SSH message (payload bytes) the way paramiko sends channel data."""
    from paramiko.message import Message  # lazy: paramiko (~0.3 s) loads at the first connection

    transport._send_user_message(Message(bytes(payload)))


class GcmOut:
    """The outbound AES-GCM state of a transport, taken under its locks by :func:`gcm_out`: the
    caller seals packets with ``engine`` and nonces from ``fixed`` + ``counter``, then calls
    :meth:`advance` before writing and :meth:`account` after, exactly what
    ``Packetizer.send_message`` does to the state."""

    def __init__(self, pk: Any, sock: Any) -> None:
        self._pk = pk
        self.sock = sock
        self.engine = getattr(pk, _P + "block_engine_out")
        iv = getattr(pk, _P + "iv_out")
        self.valid = isinstance(iv, bytes) and len(iv) == 12
        self.fixed = iv[:4] if self.valid else b""
        self.counter = int.from_bytes(iv[4:], "big") if self.valid else 0
        self._seq = getattr(pk, _P + "sequence_number_out")

    def advance(self, counter: int, packets: int) -> None:
        """Move nonce, sequence number and keepalive clock past ``packets`` sealed packets."""
        pk = self._pk
        setattr(pk, _P + "iv_out", self.fixed + counter.to_bytes(8, "big"))
        setattr(pk, _P + "sequence_number_out", (self._seq + packets) & 0xFFFFFFFF)
        setattr(pk, _P + "keepalive_last", time.time())

    def account(self, wire_bytes: int, packets: int) -> None:
        """Count what was written and start a key re-exchange when paramiko would."""
        pk = self._pk
        sent_bytes = getattr(pk, _P + "sent_bytes") + wire_bytes
        sent_packets = getattr(pk, _P + "sent_packets") + packets
        setattr(pk, _P + "sent_bytes", sent_bytes)
        setattr(pk, _P + "sent_packets", sent_packets)
        if (sent_packets >= pk.REKEY_PACKETS or sent_bytes >= pk.REKEY_BYTES) \
                and not getattr(pk, _P + "need_rekey"):
            setattr(pk, _P + "received_bytes_overflow", 0)
            setattr(pk, _P + "received_packets_overflow", 0)
            pk._trigger_rekey()


def gcm_ready(transport: Any, sock_type: type) -> bool:
    """Whether the transport sends with AES-GCM through paramiko internals we know; checked before
    any buffer is built or lock taken (and again under the locks by :func:`gcm_out`)."""
    pk = getattr(transport, "packetizer", None)
    if pk is None or not isinstance(getattr(transport, "sock", None), sock_type):
        return False  # a ProxyCommand is not a socket: nothing to report
    if not all(hasattr(transport, a) for a in ("clear_to_send", "clear_to_send_lock", "active")):
        fallback("Transport lacks clear_to_send/clear_to_send_lock/active: one message per packet")
        return False
    if not all(hasattr(pk, _P + a) for a in _GCM_STATE) or not hasattr(pk, "_trigger_rekey"):
        fallback("Packetizer state moved: one message per packet")
        return False
    return bool(getattr(pk, _P + "aead_out"))  # not AES-GCM: paramiko's path, as designed


@contextlib.contextmanager
def gcm_out(transport: Any) -> Iterator[GcmOut | None]:
    """Hold the transport's clear-to-send lock (no key exchange starts mid-batch, as in
    ``_send_user_message``) and the packetizer's write lock; yield the outbound GCM state, or None
    when the cipher is not AES-GCM (any more), compression or packet dumps are on."""
    with _clear_to_send(transport):
        pk = transport.packetizer
        with getattr(pk, _P + "write_lock"):
            state: GcmOut | None = None
            try:
                if not (not getattr(pk, _P + "aead_out") or getattr(pk, _P + "compress_engine_out") is not None
                        or getattr(pk, _P + "dump_packets")):
                    state = GcmOut(pk, transport.sock)
            except AttributeError:
                fallback("Packetizer state moved: one message per packet")
            yield state if state is not None and state.valid else None


@contextlib.contextmanager
def _clear_to_send(t: Any) -> Iterator[None]:
    deadline = time.monotonic() + getattr(t, "clear_to_send_timeout", 30.0)
    while True:
        t.clear_to_send.wait(0.1)
        if not t.active:
            raise EOFError("the SSH connection closed")
        t.clear_to_send_lock.acquire()
        if t.clear_to_send.is_set():
            break
        t.clear_to_send_lock.release()
        if time.monotonic() > deadline:
            # lazy: paramiko (~0.3 s) loads at the first connection
            from paramiko.ssh_exception import SSHException

            raise SSHException("Key-exchange timed out waiting for key negotiation")
    try:
        yield
    finally:
        t.clear_to_send_lock.release()
