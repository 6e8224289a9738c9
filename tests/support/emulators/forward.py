"""A second address for one sshd (vast's SSH proxy route), shared by the emulators."""

from __future__ import annotations

import socket
import threading


class TcpForwarder:
    """A second address for one sshd: what vast's SSH proxy (``sshN.vast.ai:port``) is to an instance
    whose direct route is ``public_ipaddr:HostPort``. Every connection is piped to ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._sock.close()
