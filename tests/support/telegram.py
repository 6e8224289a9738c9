"""An emulator of the Telegram Bot API's ``sendMessage``, and the ``telegram_emulator`` pytest fixture.

A stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (random port) answering ``POST /bot<token>/sendMessage``
with a JSON or form body the way api.telegram.org does:

* ``{"ok": true, "result": {message_id, date, chat, text, ...}}`` for the right token and chat;
* 401 ``{"ok": false, "error_code": 401, "description": "Unauthorized"}`` for any other token;
* 400 ``Bad Request: chat not found`` for another chat, ``... message text is empty``,
  ``... can't parse entities`` for legacy-Markdown with unbalanced ``*``/``_``/````` (outside code);
* fault switches (``set_fault``): ``429`` with ``parameters.retry_after``, ``500``, ``hang`` (holds
  the connection ``delay_s`` or until the server stops), ``slow`` (answers after ``delay_s``),
  ``drop`` (closes the connection without an answer); ``down()``/``up()`` close and reopen the port.

Every request is kept in ``requests`` (with the status it got); every delivered message in
``messages``. Use it with ``TELEGRAM_API_BASE=emu.url`` (the fixture sets that and the token/chat vars).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest

TOKEN = "42:placeholder-bot-token-for-tests-only"  # not a real token
CHAT_ID = "424242"
FAULTS = ("429", "500", "hang", "slow", "drop")

_PATH = re.compile(r"^/bot(?P<token>[^/]+)/(?P<method>[A-Za-z]+)$")


def markdown_ok(text: str) -> bool:
    """Legacy-Markdown check close enough to Telegram's: entities outside code must be balanced."""
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    rest = re.sub(r"`[^`]*`", "", rest)
    return "`" not in rest and rest.count("*") % 2 == 0 and rest.count("_") % 2 == 0


@dataclass
class Request:
    at: float
    token: str
    method: str
    body: dict[str, Any]
    status: int | None = None  # None: no answer (hang, drop, or the server stopped first)


@dataclass
class Message:
    message_id: int
    at: float
    chat_id: str
    text: str
    parse_mode: str | None
    disable_notification: bool


@dataclass
class _Fault:
    kind: str
    remaining: int | None  # None: every request until cleared
    retry_after: int = 1
    delay_s: float = 30.0


@dataclass
class TelegramEmulator:
    token: str = TOKEN
    chat_id: str = CHAT_ID
    requests: list[Request] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._fault: _Fault | None = None
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TelegramEmulator:
        self._stopping.clear()
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases hanging handlers
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def down(self) -> None:
        """Close the port: clients get 'connection refused' until :meth:`up`."""
        self.stop()

    def up(self) -> None:
        self.start()

    # -- faults ------------------------------------------------------------------------------

    def set_fault(self, kind: str, *, count: int | None = None, retry_after: int = 1, delay_s: float = 30.0) -> None:
        """Make the next ``count`` requests (all when None) fail as ``kind`` (one of FAULTS)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r} (choose from {FAULTS})")
        with self._lock:
            self._fault = _Fault(kind, count, retry_after, delay_s)

    def clear_fault(self) -> None:
        with self._lock:
            self._fault = None

    def _take_fault(self) -> _Fault | None:
        with self._lock:
            f = self._fault
            if f is None:
                return None
            if f.remaining is not None:
                f.remaining -= 1
                if f.remaining <= 0:
                    self._fault = None
            return f

    # -- what it saw -------------------------------------------------------------------------

    def texts(self) -> list[str]:
        with self._lock:
            return [m.text for m in self.messages]

    def with_title(self, title: str) -> list[Message]:
        """Messages whose first line is ``*title*`` (the trainer's event shapes)."""
        with self._lock:
            return [m for m in self.messages if m.text.split("\n", 1)[0] == f"*{title}*"]

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return bool(predicate(self))

    # -- the API -----------------------------------------------------------------------------

    def handle(self, token: str, method: str, body: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
        req = Request(time.time(), token, method, body)
        with self._lock:
            self.requests.append(req)
        if token != self.token:
            return self._answer(req, 401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
        if method != "sendMessage":
            return self._answer(req, 404, {"ok": False, "error_code": 404, "description": "Not Found"})
        fault = self._take_fault()
        if fault is not None:
            if fault.kind == "429":
                return self._answer(req, 429, {
                    "ok": False, "error_code": 429, "parameters": {"retry_after": fault.retry_after},
                    "description": f"Too Many Requests: retry after {fault.retry_after}"})
            if fault.kind == "500":
                return self._answer(req, 500, {"ok": False, "error_code": 500, "description": "Internal Server Error"})
            if fault.kind in ("hang", "drop"):
                if fault.kind == "hang":
                    self._stopping.wait(fault.delay_s)
                return None, None
            if fault.kind == "slow":
                self._stopping.wait(fault.delay_s)
        chat = str(body.get("chat_id", ""))
        text = str(body.get("text", ""))
        if chat != self.chat_id:
            return self._answer(req, 400, {"ok": False, "error_code": 400, "description": "Bad Request: chat not found"})
        if not text.strip():
            return self._answer(req, 400, {"ok": False, "error_code": 400,
                                           "description": "Bad Request: message text is empty"})
        if len(text) > 4096:
            return self._answer(req, 400, {"ok": False, "error_code": 400,
                                           "description": "Bad Request: message is too long"})
        parse_mode = body.get("parse_mode") or None
        if parse_mode == "Markdown" and not markdown_ok(text):
            return self._answer(req, 400, {"ok": False, "error_code": 400, "description":
                                           "Bad Request: can't parse entities: can't find end of the entity"})
        silent = body.get("disable_notification") in (True, "true", "True", "1", 1)
        with self._lock:
            msg = Message(len(self.messages) + 1, time.time(), chat, text, parse_mode, silent)
            self.messages.append(msg)
        result = {"message_id": msg.message_id, "date": int(msg.at), "text": text,
                  "from": {"id": int(self.token.split(":")[0]), "is_bot": True, "first_name": "gpucli test bot"},
                  "chat": {"id": int(chat) if chat.lstrip("-").isdigit() else chat, "type": "private"}}
        return self._answer(req, 200, {"ok": True, "result": result})

    def _answer(self, req: Request, status: int, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        req.status = status
        return status, payload


def _handler(emu: TelegramEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # the path holds the token: never log it
            pass

        def _reply(self, status: int | None, payload: dict[str, Any] | None) -> None:
            if status is None or payload is None:
                self.close_connection = True
                return
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            m = _PATH.match(self.path.split("?", 1)[0])
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if m is None:
                self._reply(404, {"ok": False, "error_code": 404, "description": "Not Found"})
                return
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            body: dict[str, Any]
            try:
                if ctype == "application/json":
                    loaded = json.loads(raw or b"{}")
                    body = loaded if isinstance(loaded, dict) else {}
                else:
                    body = {k: v[-1] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
            except (ValueError, UnicodeDecodeError):
                self._reply(400, {"ok": False, "error_code": 400, "description": "Bad Request: can't parse JSON"})
                return
            self._reply(*emu.handle(m["token"], m["method"], body))

        do_GET = do_POST  # noqa: N815 - Telegram accepts GET with a query string too; we only test POST

    return Handler


@pytest.fixture
def telegram_emulator(monkeypatch):
    """A running emulator; TELEGRAM_API_BASE, TELEGRAM_BOT_TOKEN and TELEGRAM_CHAT_ID point at it."""
    emu = TelegramEmulator().start()
    monkeypatch.setenv("TELEGRAM_API_BASE", emu.url)
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", emu.token)
    monkeypatch.setenv("TELEGRAM_CHAT_ID", emu.chat_id)
    try:
        yield emu
    finally:
        emu.stop()


_FIELD = re.compile(r"^(?P<key>[A-Za-z ]+): `(?P<value>[^`]*)`")


def fields(text: str) -> dict[str, str]:
    """``Key: `value``` lines of an alert as a dict (plus 'title' and 'Stage')."""
    lines = text.split("\n")
    out = {"title": lines[0].strip("*")}
    for line in lines[1:]:
        m = _FIELD.match(line)
        if m:
            out[m["key"]] = m["value"]
        elif line.startswith("Time: "):
            out["Time"] = line[len("Time: "):]
        elif line.startswith("Now entering Stage `"):
            out["Stage"] = line.split("`")[1]
    return out
