"""Telegram from the user's machine: find the bot token and chat id, send one message.

The token comes from ``$TELEGRAM_BOT_TOKEN`` or ``gpucli keys set telegram`` (keys.json), the chat id
from ``$TELEGRAM_CHAT_ID`` or ``gpucli keys set telegram-chat``; the environment wins, as in
``gpucli keys list``. ``$TELEGRAM_API_BASE`` replaces https://api.telegram.org (tests use an emulator).

Nothing here prints. The token is only ever part of the request URL, and HTTP libraries put that URL
into their exception messages, so every error raised from here is built from scrubbed text and
raised ``from None``. (The pod-side sender is ``trainer/watch/notify.py``; the trainer cannot import gpucli.)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from gpucli.errors import ConnectionFailed, ProviderError, UsageError
from gpucli.settings import load_keys

DEFAULT_API_BASE = "https://api.telegram.org"
_TOKEN_IN_URL = re.compile(r"/bot[^/\s'\"]+")


class TelegramRejected(ProviderError):
    """Telegram answered with an error (bad token, unknown chat, rate limit)."""


@dataclass(frozen=True)
class TelegramTarget:
    """Where a message goes. ``token`` is kept out of ``repr``."""

    token: str = field(repr=False)
    chat_id: str
    api_base: str
    token_source: str  # "env TELEGRAM_BOT_TOKEN" | "keys.json"
    chat_source: str


@dataclass(frozen=True)
class SentMessage:
    message_id: int | None
    chat_id: str
    api_base: str


def scrub(text: str, token: str | None) -> str:
    """``text`` without the token (and without anything shaped like ``/bot<token>``)."""
    if token:
        text = text.replace(token, "****")
    return _TOKEN_IN_URL.sub("/bot****", text)


def resolve_target() -> TelegramTarget:
    """Token and chat id from the environment, else keys.json; a UsageError that says how to set them."""
    stored = load_keys()

    def pick(env_var: str, key: str) -> tuple[str, str] | None:
        if os.environ.get(env_var, "").strip():
            return os.environ[env_var].strip(), f"env {env_var}"
        if stored.get(key, "").strip():
            return stored[key].strip(), "keys.json"
        return None

    token = pick("TELEGRAM_BOT_TOKEN", "telegram")
    if token is None:
        raise UsageError("no Telegram bot token",
                         hint="create a bot with @BotFather, then run `gpucli keys set telegram` "
                              "or set TELEGRAM_BOT_TOKEN")
    chat = pick("TELEGRAM_CHAT_ID", "telegram-chat")
    if chat is None:
        raise UsageError("no Telegram chat id",
                         hint="send your bot a message, then run `gpucli keys set telegram-chat ID` "
                              "or set TELEGRAM_CHAT_ID")
    base = (os.environ.get("TELEGRAM_API_BASE") or DEFAULT_API_BASE).strip().rstrip("/")
    return TelegramTarget(token=token[0], chat_id=chat[0], api_base=base, token_source=token[1],
                          chat_source=chat[1])


def send_message(target: TelegramTarget, text: str, *, timeout_s: float = 10.0) -> SentMessage:
    """POST ``sendMessage`` once. Raises TelegramRejected (an error answer) or ConnectionFailed."""
    import requests  # lazy: requests costs ~0.1 s of start-up

    url = f"{target.api_base}/bot{target.token}/sendMessage"
    try:
        resp = requests.post(url, json={"chat_id": target.chat_id, "text": text}, timeout=timeout_s)
    except requests.Timeout:
        raise ConnectionFailed(f"Telegram at {target.api_base} did not answer within {timeout_s:g}s",
                               hint="check your network, or TELEGRAM_API_BASE") from None
    except requests.RequestException as exc:
        reason = scrub(_root_reason(exc), target.token)
        raise ConnectionFailed(f"cannot reach Telegram at {target.api_base}: {reason}",
                               hint="check your network, or TELEGRAM_API_BASE") from None
    try:
        answer = resp.json()
    except ValueError:
        answer = {}
    if not isinstance(answer, dict):
        answer = {}
    if resp.status_code == 200 and answer.get("ok", False):
        result: dict[str, Any] = answer["result"] if isinstance(answer.get("result"), dict) else {}
        mid = result.get("message_id")
        return SentMessage(int(mid) if isinstance(mid, int) else None, target.chat_id, target.api_base)
    desc = scrub(str(answer.get("description") or resp.reason or ""), target.token)[:200]
    status = resp.status_code
    if status == 401 or status == 404:
        raise TelegramRejected(f"Telegram rejected the bot token from {target.token_source} (HTTP {status} {desc})",
                               hint="copy it again from @BotFather and run `gpucli keys set telegram`")
    if status == 429:
        params: dict[str, Any] = answer["parameters"] if isinstance(answer.get("parameters"), dict) else {}
        wait = params.get("retry_after")
        raise TelegramRejected("Telegram is rate-limiting this bot (HTTP 429)",
                               hint=f"try again in {wait} s" if wait is not None else "try again later")
    if status in (400, 403):
        raise TelegramRejected(f"Telegram refused to send to chat {target.chat_id} from {target.chat_source} "
                               f"(HTTP {status} {desc})",
                               hint="send your bot a message first, and check the id with `gpucli keys list`")
    raise TelegramRejected(f"Telegram answered HTTP {status} {desc}".rstrip(), hint="try again later")


def _root_reason(exc: BaseException) -> str:
    """The innermost cause's words ('Connection refused'), not requests' message with the URL in it."""
    seen = exc
    for _ in range(10):
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    # urllib3's NewConnectionError reads "<conn object>: Failed to establish ...: [Errno 111] Connection refused"
    text = str(seen)
    m = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if m:
        return m.group(0).strip()
    return type(exc).__name__
