"""A vast.ai rental's terms that can change under a run: its end date and a pending price increase.

* "When the rental end date is reached, the rental contract expires and the instance is stopped"
  (vast-ai/docs guides/reference/faq/instances.mdx L13); "Expired instances may be deleted 48 hours
  after expiration" (guides/instances/choosing/instance-types.mdx L49). The instance's ``end_date`` is
  its end in epoch seconds (api-reference/openapi/yaml/show_instance.yaml).
* A host that raised its price cannot extend a rental until the renter accepts the increase, per
  contract (vast-ai.crisp.help, 2026-03-16); the rows are ``GET /api/v0/instances/pending-price-increases/``
  ``{pending_price_increases: [{contract_id, old_gpu_costpersec, new_gpu_costpersec, ...}]}``, accepted
  with a PUT naming the row (vast-cli vastai/api/price_increase.py). gpucli only shows them: a higher
  price is the user's decision, never taken silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucli.providers.api import Contract
from gpucli.providers.query import as_number

PENDING_PATH = "/api/v0/instances/pending-price-increases/"


def price_increase_note(body: Any, instance_id: str) -> str | None:
    """What the host asks for ``instance_id`` from the pending-increases answer, or None."""
    rows = body.get("pending_price_increases") if isinstance(body, Mapping) else None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping) or str(row.get("contract_id")) != str(instance_id):
            continue
        old, new = as_number(row.get("old_gpu_costpersec")), as_number(row.get("new_gpu_costpersec"))
        if old is not None and new is not None:
            return f"GPU ${old * 3600:.3f}/h -> ${new * 3600:.3f}/h"
        return "a higher price (see the vast.ai console)"
    return None


def contract_of(instance: Mapping[str, Any] | None, pending_body: Any, instance_id: str) -> Contract | None:
    """The instance's end date (``end_date``) and any price increase asked for it; None when neither."""
    ends = as_number(instance.get("end_date")) if isinstance(instance, Mapping) else None
    note = price_increase_note(pending_body, instance_id)
    if ends is None and note is None:
        return None
    return Contract(ends_at_epoch_s=ends, price_increase=note)
