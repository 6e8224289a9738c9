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
            if self._hold(client):
                continue
            port = self._upstream_port()
            try:
                if port is None:
                    raise OSError("container down")
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b, inbound in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, inbound), daemon=True).start()

    def _hold(self, client: socket.socket) -> bool:
        """Whether this connection is kept open and never piped (a subclass's fault switch)."""
        return False

    def _upstream_port(self) -> int | None:
        """Where a new connection goes now (None: nowhere, it is closed)."""
        return self.target_port

    def _carried(self, n: int, inbound: bool) -> None:
        """``n`` bytes piped towards the sshd (``inbound``) or back (a subclass counts them)."""

    def _pipe(self, src: socket.socket, dst: socket.socket, inbound: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
                self._carried(len(data), inbound)
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
