"""A test's own HTTP server on loopback: a handler class served from a thread, with its base URL, as a
context manager. The transfer sizing's cache (``gpucli.run.files.transfer.data_leg``) is cleared on the way in
(a source of one test never answers for another's) and, with ``clear_on_exit``, on the way out (a test
that reads the sizes after the server closed keeps them)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpucli.run.files.transfer import data_leg


class LoopbackHttp:
    def __init__(self, handler: type[BaseHTTPRequestHandler], *, clear_on_exit: bool = False) -> None:
        self.handler = handler
        self.clear_on_exit = clear_on_exit
        self.url = ""

    def __enter__(self) -> LoopbackHttp:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        data_leg.cache_clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.clear_on_exit:
            data_leg.cache_clear()
