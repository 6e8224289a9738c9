"""A TCP proxy on loopback that passes at most ``bytes_per_s`` towards its target: an upload slow
enough to be cut in the middle on purpose."""

from __future__ import annotations

import socket
import threading
import time


class ThrottleProxy:
    def __init__(self, target_port: int, *, bytes_per_s: int) -> None:
        self.target_port, self.rate = target_port, bytes_per_s
        self.sent = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()

    def __enter__(self) -> ThrottleProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while True:
                data = src.recv(64 << 10)
                if not data:
                    break
                dst.sendall(data)
                if slow:
                    self.sent += len(data)
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
