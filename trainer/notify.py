"""Telegram notifications that can never slow down or crash training.

Messages go into a bounded queue drained by one daemon thread with short timeouts; a full queue
drops the message. The bot token is part of the URL only and is never logged: errors are reported
by type and HTTP status alone.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import urllib.request

log = logging.getLogger("trainer.notify")


class Notifier:
    """Sends text to a Telegram chat when a token and chat id are configured; otherwise a no-op."""

    def __init__(self, bot_token: str | None = None, chat_id: str | None = None, enabled: bool = True,
                 events: list[str] | None = None, timeout_s: float = 10.0) -> None:
        self._token = bot_token or os.environ.get("TELEGRAM_BOT_TOKEN") or None
        self._chat = chat_id or os.environ.get("TELEGRAM_CHAT_ID") or None
        self.base_url = os.environ.get("TELEGRAM_API_BASE", "https://api.telegram.org").rstrip("/")
        self.enabled = bool(enabled and self._token and self._chat)
        self.events = set(events) if events is not None else None
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self._q: queue.Queue[str | None] = queue.Queue(maxsize=100)
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="telegram", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:  # never show the token
        return f"Notifier(enabled={self.enabled})"

    def send(self, text: str, event: str | None = None) -> None:
        if not self.enabled or (event is not None and self.events is not None and event not in self.events):
            return
        try:
            self._q.put_nowait(text)
        except queue.Full:
            self.failed += 1

    def _run(self) -> None:
        while True:
            text = self._q.get()
            if text is None:
                return
            try:
                body = json.dumps({"chat_id": self._chat, "text": text[:4000]}).encode()
                req = urllib.request.Request(f"{self.base_url}/bot{self._token}/sendMessage", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    resp.read()
                self.sent += 1
            except Exception as e:  # noqa: BLE001 - a notification must never take training down
                self.failed += 1
                status = getattr(e, "code", None)
                log.warning("telegram send failed: %s%s", type(e).__name__, f" (HTTP {status})" if status else "")

    def close(self, wait_s: float = 5.0) -> None:
        """Flush what is queued (up to ``wait_s``) and stop the thread."""
        if self._thread is None:
            return
        try:
            self._q.put(None, timeout=wait_s)
        except queue.Full:
            return
        self._thread.join(timeout=wait_s)
        self._thread = None
