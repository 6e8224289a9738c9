"""Shared parts of the provider emulators: HTTP server, fault queue, pod behaviours, ledger, sshd pods.

Each emulator is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 with a random port. Faults are queued
per endpoint and consumed one request at a time, so a test says exactly which call misbehaves. Every
pod that reaches "running" is a real OpenSSH sshd (``tests/support/sshd.py``) whose authorized_keys
holds the key the client injected, so "SSH reached" means the key injection really worked.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.sshd import SshServer


# --- ledger -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerEvent:
    at: float
    pod_id: str
    event: str  # created | terminated | stopped | preempted
    label: str | None = None
    spot: bool = False
    bid: float | None = None


class Ledger:
    """Every pod created and ended, so a test can assert that nothing is left running (or billed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[LedgerEvent] = []

    def record(self, pod_id: str, event: str, **kw: Any) -> None:
        with self._lock:
            self.events.append(LedgerEvent(time.time(), pod_id, event, **kw))

    def created(self) -> list[LedgerEvent]:
        with self._lock:
            return [e for e in self.events if e.event == "created"]

    def alive(self) -> set[str]:
        """Pods created and not terminated (stopped pods still count: they still bill storage)."""
        with self._lock:
            made = {e.pod_id for e in self.events if e.event == "created"}
            gone = {e.pod_id for e in self.events if e.event == "terminated"}
        return made - gone


# --- faults -----------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str  # rate_limit | quota | server_error | drop | slow | lose_answer | no_capacity
    endpoint: str = "any"
    times: int = 1
    retry_after: str | None = None
    plain_text: bool = True
    status: int = 503
    seconds: float = 0.0


class FaultQueue:
    """Faults waiting for a request to the named endpoint (or any endpoint)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[Fault] = []

    def add(self, kind: str, endpoint: str = "any", times: int = 1, **kw: Any) -> None:
        with self._lock:
            self._items.append(Fault(kind, endpoint, times, **kw))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def take(self, endpoint: str) -> Fault | None:
        with self._lock:
            for f in self._items:
                if f.endpoint in ("any", endpoint):
                    f.times -= 1
                    if f.times <= 0:
                        self._items.remove(f)
                    return f
        return None


@dataclass
class PodBehaviour:
    """How the next created pod behaves while the client polls it."""

    pending_polls: int = 1  # polls answering runtime=null / actual_status null-or-loading
    stuck: bool = False  # never becomes running (runtime null forever / stuck "loading")
    exit_after_polls: int | None = None  # after this many polls the container exits
    bad_state: str = "exited"  # vast: exited | offline | unknown ; RunPod: EXITED


# --- pods -------------------------------------------------------------------------------------------
@dataclass
class EmuPod:
    pod_id: str
    label: str | None
    gpu_name: str
    gpu_count: int
    image: str
    price_per_hour: float
    spot: bool
    bid: float | None
    behaviour: PodBehaviour
    keys: list[str] = field(default_factory=list)
    polls: int = 0
    stopped: bool = False
    exited: bool = False
    sshd: SshServer | None = None
    created_at: float = field(default_factory=time.time)

    def ensure_sshd(self, root: Path) -> SshServer:
        if self.sshd is None:
            self.sshd = SshServer.start(root / f"pod-{self.pod_id}", authorized_keys=self.keys)
        return self.sshd

    def add_key(self, key: str) -> None:
        key = key.strip()
        if key and key not in self.keys:
            self.keys.append(key)
        if self.sshd is not None:
            (self.sshd.root / "authorized_keys").write_text("".join(k + "\n" for k in self.keys))

    def stop_sshd(self) -> None:
        if self.sshd is not None:
            self.sshd.stop()
            self.sshd = None


# --- HTTP server ------------------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    body: Any = None
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without an answer


class _Handler(BaseHTTPRequestHandler):
    server_version = "emulator"

    def log_message(self, fmt: str, *args: Any) -> None:  # keep test output clean
        pass

    def _serve(self, method: str) -> None:
        emulator: EmulatorBase = self.server.emulator  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        reply = emulator.dispatch(method, parts.path, query, body, dict(self.headers))
        if reply.drop:
            self.close_connection = True
            return
        if reply.text is not None:
            payload = reply.text.encode()
            ctype = "text/plain"
        else:
            payload = json.dumps(reply.body).encode()
            ctype = "application/json"
        self.send_response(reply.status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in reply.headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")


class EmulatorBase:
    """Server lifecycle, auth, fault injection and pod bookkeeping shared by both emulators."""

    provider = ""

    def __init__(self, root: Path, api_key: str = "test-key") -> None:
        self.root = Path(root)
        self.api_key = api_key
        self.ledger = Ledger()
        self.faults = FaultQueue()
        self.behaviours: deque[PodBehaviour] = deque()
        self.default_behaviour: Callable[[], PodBehaviour] = PodBehaviour
        self.pods: dict[str, EmuPod] = {}
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body) as received
        self.auth_headers: list[str | None] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> EmulatorBase:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.emulator = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:
            for pod in self.pods.values():
                pod.stop_sshd()

    def next_behaviour(self) -> PodBehaviour:
        return self.behaviours.popleft() if self.behaviours else self.default_behaviour()

    def running_sshd_count(self) -> int:
        with self.lock:
            return sum(1 for p in self.pods.values() if p.sshd is not None)

    # request path
    def dispatch(self, method: str, path: str, query: dict[str, str], body: Any,
                 headers: dict[str, str]) -> Reply:
        with self.lock:
            self.requests.append((method, path, body))
            self.auth_headers.append(headers.get("Authorization"))
        if headers.get("Authorization") != f"Bearer {self.api_key}":
            return self.unauthorized()
        endpoint = self.classify(method, path, body)
        fault = self.faults.take(endpoint)
        lose_answer = False
        no_capacity = False
        if fault is not None:
            if fault.kind == "rate_limit":
                hdrs = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
                if fault.plain_text:
                    return Reply(429, text="API requests too frequent endpoint threshold=2.0", headers=hdrs)
                return Reply(429, {"success": False, "error": "rate_limited",
                                   "msg": "API requests too frequent"}, headers=hdrs)
            if fault.kind == "quota":
                return Reply(429, {"success": False, "error": "search_quota_exceeded",
                                   "msg": "Daily search quota exceeded; resets at 00:00 UTC"})
            if fault.kind == "server_error":
                return Reply(fault.status, text="<html><body>upstream error</body></html>")
            if fault.kind == "drop":
                return Reply(0, drop=True)
            if fault.kind == "slow":
                time.sleep(fault.seconds)
            lose_answer = fault.kind == "lose_answer"
            no_capacity = fault.kind == "no_capacity"
        reply = self.handle(method, path, query, body, endpoint, no_capacity=no_capacity)
        if lose_answer:
            return Reply(0, drop=True)
        return reply

    # to override
    def classify(self, method: str, path: str, body: Any) -> str:
        raise NotImplementedError

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, endpoint: str, *,
               no_capacity: bool) -> Reply:
        raise NotImplementedError

    def unauthorized(self) -> Reply:
        return Reply(401, {"error": "unauthorized"})
