"""How an alert is shaped for each webhook service: the kind of a configured URL and the request of one
message. Standard library only, shared by the pod-side sender (trainer/watch/webhook.py) and
``gpucli notify test --webhook`` on this machine.

Payloads as each service documents them: Slack incoming webhooks take ``{"text"}``; Discord's
execute-webhook ``{"content"}`` (at most 2000 characters); ntfy a plain-text body with ``Title``,
``Priority`` and ``Markdown`` headers; any other URL ``{"text", "source"}``.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

KINDS = ("slack", "discord", "ntfy", "json")
DISCORD_MAX = 2000


def webhook_kind(url: str) -> tuple[str, str]:
    """(kind, the URL to post to) of a configured webhook URL."""
    url = url.strip()
    for kind in KINDS:
        if url.lower().startswith(f"{kind}+"):
            return kind, url[len(kind) + 1:]
    host = (urlsplit(url).hostname or "").lower()
    if host == "hooks.slack.com":
        return "slack", url
    if host in ("discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com"):
        return "discord", url
    if host == "ntfy.sh" or host.startswith("ntfy."):
        return "ntfy", url
    return "json", url


def payload(kind: str, text: str, *, silent: bool = False, final: bool = False) -> tuple[bytes, dict[str, str]]:
    """The request body and headers of one message for ``kind``."""
    if kind == "slack":
        return json.dumps({"text": text}).encode(), {"Content-Type": "application/json"}
    if kind == "discord":
        content = text if len(text) <= DISCORD_MAX else text[:DISCORD_MAX - 3] + "..."
        return json.dumps({"content": content}).encode(), {"Content-Type": "application/json"}
    if kind == "ntfy":
        priority = "high" if final else ("low" if silent else "default")
        return text.encode(), {"Content-Type": "text/plain; charset=utf-8", "Title": "gpucli",
                               "Priority": priority, "Markdown": "yes", "Tags": "robot"}
    return json.dumps({"text": text, "source": "gpucli"}).encode(), {"Content-Type": "application/json"}
