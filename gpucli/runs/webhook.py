"""A webhook alert from this machine (``gpucli notify test --webhook``): the URL runs send their
alerts to (``$GPUCLI_WEBHOOK_URL`` or ``gpucli keys set webhook URL``), one message, shaped by
:mod:`trainer.spec.webhooks` exactly as the pod's sender shapes it. The URL is a credential: it never
appears in an error (errors are built from scrubbed text and raised ``from None``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import requests

from gpucli.errors import ConnectionFailed, ProviderError, UsageError
from gpucli.settings import load_keys
from trainer.spec.webhooks import payload, webhook_kind


class WebhookRejected(ProviderError):
    """The webhook answered with an error status."""


@dataclass(frozen=True)
class WebhookTarget:
    kind: str  # slack | discord | ntfy | json
    url: str = field(repr=False)
    source: str  # "env GPUCLI_WEBHOOK_URL" | "keys.json"


def check_url(value: str) -> str:
    kind, url = webhook_kind(value)
    if not url.lower().startswith(("http://", "https://")) or "://" not in url or len(url.split("://", 1)[1]) < 3:
        raise UsageError("a webhook is an http(s):// URL (Slack, Discord, ntfy or any JSON endpoint)",
                         hint="e.g. https://hooks.slack.com/services/..., https://ntfy.sh/my-topic, or "
                              "slack+https://host/... to name the kind of a self-hosted one")
    return kind


def resolve_target() -> WebhookTarget:
    value, source = os.environ.get("GPUCLI_WEBHOOK_URL", "").strip(), "env GPUCLI_WEBHOOK_URL"
    if not value:
        value, source = load_keys().get("webhook", "").strip(), "keys.json"
    if not value:
        raise UsageError("no webhook URL", hint="run `gpucli keys set webhook URL` (Slack, Discord or ntfy)")
    check_url(value)
    kind, url = webhook_kind(value)
    return WebhookTarget(kind, url, source)


def send(target: WebhookTarget, text: str, *, timeout_s: float = 10.0) -> int:
    """POST one message; its HTTP status. WebhookRejected on an error status, ConnectionFailed when
    the URL cannot be reached."""
    body, headers = payload(target.kind, text)
    where = f"the {target.kind} webhook from {target.source}"
    try:
        resp = requests.post(target.url, data=body, headers=headers, timeout=timeout_s)
    except requests.Timeout:
        raise ConnectionFailed(f"{where} did not answer within {timeout_s:g} s") from None
    except requests.RequestException as exc:
        raise ConnectionFailed(f"cannot reach {where}: {type(exc).__name__}") from None
    if resp.status_code >= 300:
        hint = ("the URL was refused: copy it again and run `gpucli keys set webhook URL`"
                if resp.status_code in (401, 403, 404) else "try again later")
        raise WebhookRejected(f"{where} answered HTTP {resp.status_code}", hint=hint)
    return resp.status_code
