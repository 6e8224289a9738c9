"""Hosts a launch stays away from: machines that failed their health check, kept a week on this machine.

``GPUCLI_HOME/avoid.json`` maps ``provider:host`` to ``{"until": epoch seconds, "why": one line}``. It holds
no secret (a host's id and what it measured), so it is written with the usual mode, but atomically (a
temporary file renamed into place): two launches at once never read half a file. A damaged file is
read as empty: it only ever costs a host tried again.

What names the physical host differs per provider:

- vast.ai: the offer's ``machine_id`` (search answers carry ``machine_id`` and ``host_id``: the
  reference audit, row V1, vast.py L388-423); one machine is one set of GPUs, so the machine, not the
  host account (which may own many), is avoided.
- RunPod: a search answer names no machine (gpucli/providers/api.py ``Offer.machine_id``: "RunPod has none at
  search time"); the create pins a GPU type, a cloud (SECURE or COMMUNITY) and a data centre (the offer
  id ``gpu|count|cloud|dc``, gpucli/providers/runpod/v2.py), so that triple is what is avoided.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpucli.providers.api import offer_host
from gpucli.settings import home

if TYPE_CHECKING:
    from gpucli.providers.api import Offer

WEEK_S = 7 * 24 * 3600.0
FILE = "avoid.json"


@dataclass(frozen=True)
class Avoided:
    key: str
    until: float
    why: str


def host_key(offer: Offer) -> str | None:
    """``provider:host`` for an offer, or None when the offer names no host (the provider's own rule:
    :func:`gpucli.providers.api.offer_host`)."""
    host = offer_host(offer)
    return f"{offer.provider}:{host}" if host else None


def _path() -> Path:
    return home() / FILE


def load(now: float | None = None) -> dict[str, Avoided]:
    """The hosts avoided now (expired ones dropped)."""
    now = time.time() if now is None else now
    try:
        data = json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, Avoided] = {}
    if not isinstance(data, dict):
        return out
    for key, row in data.items():
        if isinstance(row, dict) and isinstance(row.get("until"), (int, float)) and row["until"] > now:
            out[str(key)] = Avoided(str(key), float(row["until"]), str(row.get("why") or "")[:300])
    return out


def add(key: str, why: str, *, now: float | None = None, for_s: float = WEEK_S) -> Avoided:
    """Avoid ``key`` for ``for_s`` (a week) from ``now``; the file is rewritten atomically."""
    now = time.time() if now is None else now
    kept = load(now)
    entry = Avoided(key, now + for_s, why[:300])
    kept[key] = entry
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: {"until": v.until, "why": v.why} for k, v in sorted(kept.items())}, indent=1))
    os.replace(tmp, path)
    return entry


def avoided(offer: Offer, table: dict[str, Avoided]) -> Avoided | None:
    key = host_key(offer)
    return table.get(key) if key else None
