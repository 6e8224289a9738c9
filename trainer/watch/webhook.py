"""Alerts to a webhook: Slack, Discord, ntfy, or any URL that takes JSON, with the events, queue and
never-block rule of the Telegram sender (:class:`trainer.watch.notify.Notifier`, which this extends:
one daemon thread, bounded queue, timeouts, bounded retries, the final alert first at exit, sending
off after a rejected URL). Standard library only.

The URL (``$GPUCLI_WEBHOOK_URL``, from ``gpucli keys set webhook URL``) is a credential (a Slack or
Discord webhook URL is all it takes to post): it is masked in every log line. Its kind comes from
the host (hooks.slack.com, discord.com/api/webhooks, ntfy.sh or a host named ntfy*) or a prefix
(``slack+https://...``, ``discord+``, ``ntfy+``, ``json+``) for self-hosted ones; anything else gets
``{"text": ..., "source": "gpucli"}``. Payloads, as each service documents them: Slack incoming
webhooks ``{"text"}``; Discord execute-webhook ``{"content"}`` (2000 characters); ntfy a plain-text
body with ``Title``, ``Priority`` and ``Markdown`` headers.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.request
from typing import Any

from trainer.spec.webhooks import payload, webhook_kind
from trainer.watch.notify import Notifier

__all__ = ["Fanout", "WebhookNotifier", "payload", "webhook_kind"]


class WebhookNotifier(Notifier):
    """The Telegram sender's machinery posting to a webhook instead (see the module's docstring)."""

    def __init__(self, url: str | None = None, enabled: bool = True, events: list[str] | None = None,
                 timeout_s: float = 10.0, **kwargs: Any) -> None:
        raw = (url or os.environ.get("GPUCLI_WEBHOOK_URL") or "").strip()
        self.kind, self.url = webhook_kind(raw) if raw else ("json", "")
        ok = self.url.lower().startswith(("http://", "https://"))
        # the URL is the "token" the base class masks everywhere; the chat is only a placeholder
        super().__init__(bot_token=self.url if ok else "", chat_id="webhook", enabled=enabled and ok, events=events,
                         timeout_s=timeout_s, api_base=self.url or None, **kwargs)
        if self._thread is not None:
            self._thread.name = "webhook"

    def __repr__(self) -> str:
        return (f"WebhookNotifier({self.kind}, enabled={self.enabled}, sent={self.sent}, failed={self.failed}, "
                f"dropped={self.dropped})")

    def _warn(self, fmt: str, *args: object) -> None:
        super()._warn(fmt.replace("telegram:", f"webhook ({self.kind}):").replace("bot token or chat", "webhook URL"),
                      *args)

    def _post(self, message: dict) -> tuple[int | None, dict, str]:
        body, headers = payload(self.kind, str(message.get("text", "")), silent=bool(message.get("disable_notification")))
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        timeout = self.timeout_s
        if self._closing.is_set():
            timeout = max(0.1, min(timeout, self._deadline - time.monotonic()))
        retry_after: str | None = None
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read(65536)
        except urllib.error.HTTPError as e:  # its .url holds the webhook: keep only the status
            status, retry_after = e.code, e.headers.get("Retry-After") if e.headers else None
            try:
                raw = e.read(65536)
            except Exception:  # noqa: BLE001
                raw = b""
            finally:
                e.close()
        except Exception as e:  # noqa: BLE001 - unreachable, timeouts, resets
            return None, {}, self._safe(e)
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        wait = _seconds(retry_after) if retry_after is not None else _seconds(answer.get("retry_after"))
        if status == 429 and wait is not None:
            answer = {**answer, "parameters": {"retry_after": wait}}  # what the base class's retry reads
        answer.pop("ok", None)  # a Slack or ntfy answer has no Telegram "ok"; the status decides
        return status, answer, f"HTTP {status}"

    def summary(self) -> str:
        return super().summary().replace("telegram:", f"webhook ({self.kind}):")


def _seconds(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v >= 0 else None


class Fanout:
    """Several senders as one: every event goes to each (Telegram and a webhook)."""

    def __init__(self, senders: list[Any]) -> None:
        self.senders = senders

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def each(*args: Any, **kwargs: Any) -> Any:
            results = [getattr(s, name)(*args, **kwargs) for s in self.senders]
            return any(bool(r) for r in results) if name not in ("close",) else None

        return each

    @property
    def enabled(self) -> bool:
        return any(getattr(s, "enabled", False) for s in self.senders)

    def summary(self) -> str:
        return "; ".join(s.summary() for s in self.senders)
