"""What vast.ai says an instance has been billed: ``GET /api/v0/charges/`` (vast-ai/docs
api-reference/openapi/yaml/show_charges.yaml): "Shows charges per instance, including GPU, storage, and
bandwidth". ``select_filters`` is required and must carry a ``day`` range in unix seconds (400 without);
each result is one contract, ``source`` ``instance-<id>``, with ``amount`` and ``items`` typed ``gpu``,
``disk``, ``bwd`` (download: data reaching the instance, at the offer's ``inet_down_cost``) and ``bwu``
(upload: data leaving it, at ``inet_up_cost``). Paged by ``next_token``/``after_token``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

from gpucli.providers.api import Billed

BANDWIDTH_ITEMS = ("bwd", "bwu")
MAX_PAGES = 20  # 500 contracts a page: far beyond the contracts of one day range gpucli asks about
_DAY_S = 86400


def charges_params(since_epoch_s: float, *, after_token: str | None = None) -> dict[str, Any]:
    """The query for charges from a day before ``since_epoch_s`` until a day from now (the range is
    whole days on vast's side; a margin either way never drops the contract)."""
    day = {"gte": int(since_epoch_s) - _DAY_S, "lte": int(time.time()) + _DAY_S}
    params: dict[str, Any] = {"select_filters": json.dumps({"day": day, "type": {"in": ["instance"]}}),
                              "limit": 500}
    if after_token:
        params["after_token"] = after_token
    return params


def _money(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def billed_in(body: Any, instance_id: str) -> tuple[Billed | None, str | None]:
    """(this instance's charges, the next page's token). None: no contract of that id on this page.
    A row whose amounts are not numbers counts as absent, never as $0."""
    if not isinstance(body, Mapping) or not isinstance(body.get("results"), list):
        return None, None
    token = body.get("next_token") if isinstance(body.get("next_token"), str) else None
    for row in body["results"]:
        if not isinstance(row, Mapping) or row.get("source") != f"instance-{instance_id}":
            continue
        total = _money(row.get("amount"))
        items = row.get("items")
        bandwidth = 0.0
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping) and item.get("type") in BANDWIDTH_ITEMS:
                bandwidth += _money(item.get("amount")) or 0.0
        if total is not None:
            return Billed(total_usd=total, bandwidth_usd=bandwidth), None
    return None, token
