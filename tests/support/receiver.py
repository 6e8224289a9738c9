"""A local HTTP receiver for webhook alerts: a stdlib server that keeps every POST."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """Keeps every request (path, headers, body); answers 200, or holds every connection until
    stop() while ``hang`` is set (an endpoint that never answers)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.hang = threading.Event()
        self.stopping = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if outer.hang.is_set():
                    outer.stopping.wait(60)
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
