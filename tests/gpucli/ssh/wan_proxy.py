"""A userspace stand-in for an internet path: a TCP proxy on 127.0.0.1 that adds delay and caps
bandwidth, each direction shaped on its own (this kernel has no ``sch_netem``).

    with WanProxy(sshd.port, rtt_s=0.1, rate_bytes_s=40e6) as proxy:
        ... connect to 127.0.0.1:proxy.port ...

Model: each direction is one link shared by every connection through the proxy (parallel channels
or connections do not get a link each). A chunk read from the sender occupies the link for
``len / rate`` after the link is free, then arrives ``rtt / 2`` later. What is queued on a link is
bounded (``queue_bytes``, by default two bandwidth-delay products): past it the proxy stops reading,
so the sender sees TCP back-pressure as from a router's full buffer. Nothing is dropped, so TCP's own
loss recovery is not modelled; what the proxy shows is what SSH's channel windows and round trips
cost over that RTT and rate.

Bounded and self-stopping: it listens on 127.0.0.1 only, serves at most ``max_connections`` at a
time, and closes everything after ``lifetime_s`` even if the caller forgets :meth:`stop`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque

_CHUNK = 256 << 10  # per recv: fewer Python steps per MB (the proxy shares the CPU with both ends)


class _Link:
    """One direction of the path: when the link is next free, and how much is queued on it."""

    def __init__(self, rate_bytes_s: float, delay_s: float, queue_bytes: int) -> None:
        if not rate_bytes_s > 0 or not delay_s >= 0:
            raise ValueError("rate must be > 0 and delay >= 0")
        self.rate = float(rate_bytes_s)
        self.delay = float(delay_s)
        self.queue_bytes = queue_bytes
        self._free_at = 0.0
        self._lock = threading.Lock()
        self.carried = 0

    def reserve(self, n: int) -> float:
        """Put ``n`` bytes on the link; returns when they arrive at the far end (monotonic time)."""
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + n / self.rate
            self.carried += n
            return self._free_at + self.delay


class _Pipe:
    """One direction of one connection: a reader thread queues timed chunks, a writer delivers them."""

    def __init__(self, src: socket.socket, dst: socket.socket, link: _Link, on_close) -> None:
        self.src, self.dst, self.link = src, dst, link
        self.q: deque[tuple[float, bytes]] = deque()
        self.queued = 0
        self.cv = threading.Condition()
        self.done = False
        self.on_close = on_close
        for fn in (self._read, self._write):
            threading.Thread(target=fn, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                with self.cv:
                    while self.queued >= self.link.queue_bytes and not self.done:
                        self.cv.wait(0.05)
                    if self.done:
                        return
                data = self.src.recv(_CHUNK)
                at = self.link.reserve(len(data)) if data else time.monotonic() + self.link.delay
                with self.cv:
                    self.q.append((at, data))
                    self.queued += len(data)
                    self.cv.notify_all()
                if not data:
                    return
        except OSError:
            self.stop()

    def _write(self) -> None:
        try:
            while True:
                with self.cv:
                    while not self.q and not self.done:
                        self.cv.wait(0.05)
                    if self.done:
                        return
                    at = self.q[0][0]
                wait = at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                batch = []
                eof = False
                with self.cv:
                    now = time.monotonic()
                    while self.q and self.q[0][0] <= now:
                        _, data = self.q.popleft()
                        self.queued -= len(data)
                        if not data:
                            eof = True
                            break
                        batch.append(data)
                    self.cv.notify_all()
                if batch:
                    self.dst.sendall(b"".join(batch))
                if eof:
                    with contextlib.suppress(OSError):
                        self.dst.shutdown(socket.SHUT_WR)
                    return
        except OSError:
            self.stop()

    def stop(self) -> None:
        with self.cv:
            self.done = True
            self.cv.notify_all()
        self.on_close()


class WanProxy:
    """Listens on 127.0.0.1:``port`` and forwards to 127.0.0.1:``target_port`` through two shaped links."""

    def __init__(self, target_port: int, *, rtt_s: float, rate_bytes_s: float,
                 queue_bytes: int | None = None, lifetime_s: float = 3600.0,
                 max_connections: int = 32) -> None:
        bdp = int(rate_bytes_s * rtt_s)
        q = queue_bytes if queue_bytes is not None else max(2 * bdp, 1 << 20)
        self.up = _Link(rate_bytes_s, rtt_s / 2, q)  # client -> server
        self.down = _Link(rate_bytes_s, rtt_s / 2, q)  # server -> client
        self.rtt_s, self.rate = rtt_s, rate_bytes_s
        self.target_port = target_port
        self.max_connections = max_connections
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port: int = self._listener.getsockname()[1]
        self._deadline = time.monotonic() + lifetime_s
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._watchdog, daemon=True).start()

    def __enter__(self) -> WanProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _watchdog(self) -> None:
        while not self._stopped.wait(0.5):
            if time.monotonic() > self._deadline:
                self.stop()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                live = sum(1 for s in self._socks if s.fileno() != -1) // 2
            if live >= self.max_connections:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._socks = [s for s in self._socks if s.fileno() != -1] + [client, server]

            def close(c: socket.socket = client, s: socket.socket = server) -> None:
                # shutdown first: close() alone does not wake a thread blocked in recv() on the
                # socket, and the kernel keeps the connection open (no FIN) until that recv returns.
                for sock in (c, s):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()

            _Pipe(client, server, self.up, close)
            _Pipe(server, client, self.down, close)

    def stop(self) -> None:
        """Close the listener and every connection through the proxy (idempotent)."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


def main() -> int:
    """``python tests/gpucli/ssh/wan_proxy.py TARGET_PORT RTT_MS MB_PER_S [SECONDS]``: run one in the
    foreground and print its port (for trying ssh/rsync/scp by hand)."""
    import sys

    target, rtt_ms, mbs = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    life = float(sys.argv[4]) if len(sys.argv) > 4 else 600.0
    with WanProxy(target, rtt_s=rtt_ms / 1000, rate_bytes_s=mbs * 1e6, lifetime_s=life) as p:
        sys.stdout.write(f"{p.port}\n")
        sys.stdout.flush()
        p._stopped.wait(life)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
