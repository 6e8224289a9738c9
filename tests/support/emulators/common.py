"""Shared parts of the provider emulators: HTTP server, fault queue, pod behaviours, ledger, sshd pods.

Each emulator is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 with a random port. Faults are queued
per endpoint and consumed one request at a time, so a test says exactly which call misbehaves. Every
pod that reaches "running" is a real OpenSSH sshd (``tests/support/sshd.py``) whose authorized_keys
holds the key the client injected, so "SSH reached" means the key injection really worked.

Pods are modelled as far as gpucli's guards need them:

- **A pod environment.** Each pod has a fresh random *pod-scoped* key. The provider's variables
  (RunPod: ``RUNPOD_POD_ID``, ``RUNPOD_API_KEY``; vast: ``CONTAINER_ID``, ``CONTAINER_API_KEY``; no
  API base URL, as on real pods) are written NUL-separated to ``<pod dir>/environ``, like a
  container's ``/proc/1/environ``. SSH sessions do not get them (they do not on real pods either); they
  get ``GPUCLI_POD_ENVIRON=<that file>`` (sshd ``SetEnv``), which is where the pod-side watchdog looks.
- **Pod-scoped keys.** The API accepts a pod's key only for stopping or terminating that same pod
  (``pod_key_allows``) and refuses it for anything else (``forbidden``); the key dies with the pod.
- **Who ended a pod.** The ledger records ``by``: ``account-key`` (the user's API key),
  ``pod-key`` (the pod's own key: the watchdog) or ``preemption`` (the provider).
- **A pod takes its processes with it.** Every session also gets ``GPUCLI_EMU_POD=<marker>``, which
  everything started in the pod inherits; stopping, terminating or preempting a pod SIGKILLs every
  process whose ``/proc/PID/environ`` carries its marker, then stops its sshd. A process that asked
  for its own pod's end dies before the answer reaches it, as it can in a real container.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.emulators.forward import TcpForwarder
from tests.support.sshd import SshServer

__all__ = ["EmulatorBase", "EmuPod", "Reply", "Route", "RouteCall", "TcpForwarder"]


# --- ledger -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerEvent:
    at: float
    pod_id: str
    event: str  # created | terminated | stopped | preempted
    label: str | None = None
    spot: bool = False
    bid: float | None = None
    by: str | None = None  # who ended it: account-key | pod-key | preemption (None for "created")


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

    def ended(self, pod_id: str) -> list[LedgerEvent]:
        """The pod's stop / terminate / preempt events, oldest first."""
        with self._lock:
            return [e for e in self.events if e.pod_id == pod_id and e.event != "created"]

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
    no_public_ip: bool = False  # RunPod: runs, but its host has no public IP: 22/tcp never published
    #: What the host's ``nvidia-smi --query-gpu=...`` prints (CSV lines), or None: no nvidia-smi (a CPU
    #: host, as the emulators' pods are). Any other nvidia-smi call fails, as on a host whose driver is
    #: broken, so the pod's environment build still takes the CPU path. The preflight's health check
    #: reads it (gpucli/runs/health.py ``SMI_COMMAND``): a host with ECC errors or fewer GPUs, to order.
    nvidia_smi: str | None = None
    #: What ``nvidia-smi -q ...`` prints (the memory repairs section, gpucli/runs/health.py
    #: ``MEMORY_COMMAND``), or None: that call fails as the others do. Only with ``nvidia_smi``.
    nvidia_smi_q: str | None = None


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
    scoped_key: str = field(default_factory=lambda: "pod-" + secrets.token_urlsafe(24))
    marker: str = field(default_factory=lambda: secrets.token_hex(8))  # GPUCLI_EMU_POD's value
    environ_path: Path | None = None
    proxy: TcpForwarder | None = None  # vast's proxy route to this pod's sshd, when it has one
    disk_gb: float = 0.0  # the disk it was created with (vast bills it while stopped)
    keep_port: int | None = None  # the sshd port a restarted container gets again (None: a new one)

    def ensure_sshd(self, root: Path, environment: dict[str, str]) -> SshServer:
        """Boot the pod: write its PID-1-style environment file and start its sshd."""
        if self.sshd is None:
            folder = root / f"pod-{self.pod_id}"
            folder.mkdir(parents=True, exist_ok=True)
            self.environ_path = folder / "environ"
            self.environ_path.write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environment.items()))
            os.chmod(self.environ_path, 0o600)
            env = {"GPUCLI_POD_ENVIRON": str(self.environ_path), "GPUCLI_EMU_POD": self.marker}
            if self.behaviour.nvidia_smi is not None:  # the host's nvidia-smi, first on the sessions' PATH
                tools = folder / "bin"
                tools.mkdir(exist_ok=True)
                (tools / "answer.csv").write_text(self.behaviour.nvidia_smi)
                query = ""
                if self.behaviour.nvidia_smi_q is not None:
                    (tools / "answer.txt").write_text(self.behaviour.nvidia_smi_q)
                    query = f'"-q "*) cat "{tools}/answer.txt";; '
                script = tools / "nvidia-smi"
                script.write_text(f'#!/bin/sh\ncase "$*" in *--query-gpu=*) cat "{tools}/answer.csv";; {query}'
                                  '*) echo "NVIDIA-SMI has failed" >&2; exit 9;; esac\n')
                script.chmod(0o755)
                env["PATH"] = f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            elif os.environ.get("GPUCLI_EMU_POD_PATH"):  # a test's PATH for the pod's sessions (a fake nvidia-smi first)
                env["PATH"] = os.environ["GPUCLI_EMU_POD_PATH"]
            self.sshd = SshServer.start(folder, authorized_keys=self.keys, port=self.keep_port, set_env=env)
        return self.sshd

    def add_key(self, key: str) -> None:
        key = key.strip()
        if key and key not in self.keys:
            self.keys.append(key)
        if self.sshd is not None:
            (self.sshd.root / "authorized_keys").write_text("".join(k + "\n" for k in self.keys))

    def stop_sshd(self) -> None:
        """The pod goes down: every process started in it dies (SIGKILL), then its sshd stops."""
        kill_pod_processes(self.marker)
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        if self.sshd is not None:
            self.sshd.stop()
            self.sshd = None


def pod_process_ids(marker: str) -> list[int]:
    """Processes started inside the pod: their environment carries ``GPUCLI_EMU_POD=<marker>``."""
    needle = f"GPUCLI_EMU_POD={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry))
    return found


def kill_pod_processes(marker: str, timeout_s: float = 5.0) -> int:
    """SIGKILL every process of the pod (again, until none is left: one may fork meanwhile)."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # Zombies keep their environ readable until reaped; only live ones count.
        pids = [p for p in pod_process_ids(marker) if not _is_zombie(p)]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return len(killed)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


#: User-Agents Cloudflare answers with 403 "error code: 1010" in front of RunPod's API (reported by
#: users of its REST API, lumpenspace/raft#14); the emulators apply it to both providers.
_DEFAULT_AGENTS = ("python-urllib", "python-requests", "python-httpx", "aiohttp")


def refused_user_agent(agent: str | None) -> bool:
    return not agent or agent.strip().lower().startswith(_DEFAULT_AGENTS)


# --- HTTP server ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouteCall:
    """One request as a route handler sees it: ``groups`` are the path pattern's named groups."""

    method: str
    path: str
    groups: dict[str, str]
    query: dict[str, str]
    body: Any
    by: str  # account-key | pod-key
    no_capacity: bool


@dataclass(frozen=True)
class Route:
    """``METHOD`` + a full-match path pattern -> a handler; ``endpoint`` names it for faults and the
    pod-key rule. A separate module extends an emulator with ``emulator.add_route(...)``."""

    method: str
    pattern: re.Pattern[str]
    endpoint: str
    handler: Callable[[RouteCall], Reply]
    pod_key_ok: Callable[[str, RouteCall], bool] | None = None  # (pod id, call) -> may that pod's key call it


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
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            # The caller is gone: e.g. a process in a pod that asked for its own pod's end died with it.
            self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._serve("PATCH")


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
        self.scoped_keys: dict[str, str] = {}  # a live pod's own key -> its pod id
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body) as received
        self.auth_headers: list[str | None] = []
        self.user_agents: list[str | None] = []
        # Strictness switches (each on unless a test turns it off). ``strict_pod_calls`` applies the
        # same User-Agent / schema checks to calls made with a pod's own key (the pod-side watchdog).
        self.strict_user_agent = True
        self.strict_pod_calls = True
        # Real pods have no RUNPOD_API_BASE_URL / VAST_URL: the watchdog takes its endpoint from its own
        # env file (watchdog.env, written by the launch).
        self.pod_env_has_base_url = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.routes: list[Route] = []  # tried before classify/handle, in order

    def add_route(self, method: str, pattern: str, endpoint: str, handler: Callable[[RouteCall], Reply], *,
                  pod_key_ok: Callable[[str, RouteCall], bool] | None = None) -> None:
        """Serve ``METHOD pattern`` (a regex matched against the whole path) with ``handler``."""
        self.routes.append(Route(method.upper(), re.compile(pattern), endpoint, handler, pod_key_ok))

    def match_route(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            m = route.pattern.fullmatch(path)
            if m is not None and route.method == method:
                return route, {k: v for k, v in m.groupdict().items() if v is not None}
        return None

    # lifecycle
    def start(self) -> EmulatorBase:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.emulator = self  # type: ignore[attr-defined]
        # A short poll: shutdown() waits up to one poll interval (0.5 s by default) at every teardown.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
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
                pod.stop_sshd()  # the emulator going away takes every pod, and its processes, with it

    def next_behaviour(self) -> PodBehaviour:
        return self.behaviours.popleft() if self.behaviours else self.default_behaviour()

    def running_sshd_count(self) -> int:
        with self.lock:
            return sum(1 for p in self.pods.values() if p.sshd is not None)

    # pods
    def add_pod(self, pod: EmuPod) -> None:
        with self.lock:
            self.pods[pod.pod_id] = pod
            self.scoped_keys[pod.scoped_key] = pod.pod_id

    def boot(self, pod: EmuPod) -> SshServer:
        """Start the pod's sshd with its environment (idempotent)."""
        return pod.ensure_sshd(self.root, self.pod_environment(pod))

    def end_pod(self, pod_id: str, event: str, by: str) -> EmuPod | None:
        """Stop ("stopped", "preempted") or terminate ("terminated") a pod: its processes die, its
        sshd stops, the ledger says who did it. Returns the pod, or None when there is no such pod."""
        with self.lock:
            pod = self.pods.pop(pod_id, None) if event == "terminated" else self.pods.get(pod_id)
            if pod is None:
                return None
            if event == "terminated":
                self.scoped_keys.pop(pod.scoped_key, None)
            else:
                pod.stopped = True
            pod.stop_sshd()
        self.on_end(pod_id, event)  # before the ledger says so: a test that waits on the ledger sees it done
        self.ledger.record(pod_id, event, label=pod.label if event == "terminated" else None, by=by)
        return pod

    def on_end(self, pod_id: str, event: str) -> None:
        """What a provider does to a pod's disks when it stops or ends (nothing here)."""

    def pod_key_of(self, pod_id: str) -> str:
        """The pod's own scoped key (what its environment carries)."""
        with self.lock:
            return self.pods[pod_id].scoped_key

    # request path
    def dispatch(self, method: str, path: str, query: dict[str, str], body: Any,
                 headers: dict[str, str]) -> Reply:
        auth = headers.get("Authorization") or ""
        with self.lock:
            self.requests.append((method, path, body))
            self.auth_headers.append(headers.get("Authorization"))
            self.user_agents.append(headers.get("User-Agent"))
            own_pod = self.scoped_keys.get(auth[7:]) if auth.startswith("Bearer ") else None
        if self.strict_user_agent and (own_pod is None or self.strict_pod_calls) and \
                refused_user_agent(headers.get("User-Agent")):
            return Reply(403, text="error code: 1010")
        routed = self.match_route(method, path)
        endpoint = routed[0].endpoint if routed is not None else self.classify(method, path, body)
        if own_pod is not None:
            # A pod's own key: good for ending that pod and nothing else.
            if routed is not None:
                route, groups = routed
                call = RouteCall(method, path, groups, query, body, "pod-key", False)
                allowed = route.pod_key_ok is not None and route.pod_key_ok(own_pod, call)
            else:
                allowed = self.pod_key_allows(own_pod, method, path, body, endpoint)
            if not allowed:
                return self.forbidden(endpoint)
            by = "pod-key"
        elif auth == f"Bearer {self.api_key}":
            by = "account-key"
        else:
            return self.unauthorized()
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
            if fault.kind == "refuse":  # vast: HTTP 200 whose body says it did nothing
                return Reply(200, {"success": False, "error": "invalid_args", "msg": "request refused"})
            if fault.kind == "slow":
                time.sleep(fault.seconds)
            lose_answer = fault.kind == "lose_answer"
            no_capacity = fault.kind == "no_capacity"
        if fault is not None and fault.kind == "not_json":  # HTTP 200 whose body is not the documented JSON
            return Reply(200, text="<html><body>OK</body></html>")
        if routed is not None:
            reply = routed[0].handler(RouteCall(method, path, routed[1], query, body, by, no_capacity))
        else:
            reply = self.handle(method, path, query, body, endpoint, no_capacity=no_capacity, by=by)
        if lose_answer:
            return Reply(0, drop=True)
        return reply

    # to override
    def classify(self, method: str, path: str, body: Any) -> str:
        raise NotImplementedError

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, endpoint: str, *,
               no_capacity: bool, by: str) -> Reply:
        """``by`` is who is calling: account-key or pod-key (already limited to its own pod)."""
        raise NotImplementedError

    def pod_environment(self, pod: EmuPod) -> dict[str, str]:
        """The provider's variables in the pod's PID 1 environment."""
        raise NotImplementedError

    def pod_key_allows(self, pod_id: str, method: str, path: str, body: Any, endpoint: str) -> bool:
        """Whether pod ``pod_id``'s scoped key may make this request (only: end that same pod)."""
        raise NotImplementedError

    def forbidden(self, endpoint: str) -> Reply:
        return Reply(403, {"error": "forbidden"})

    def unauthorized(self) -> Reply:
        return Reply(401, {"error": "unauthorized"})
