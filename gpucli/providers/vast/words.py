"""What a vast.ai answer means, read as vast's own sources define it: one function for every caller.

Standard library only and free of gpucli imports, so the pod-side watchdog and boot guard can ship it
next to themselves and read an answer exactly as the laptop does.

* A revoked or wrong key is ``{"success": false, "error": "auth_error", "msg": "Invalid user key"}``,
  and vast sends it with HTTP **404** as well as 401 (vast-ai/docs
  api-reference/openapi/yaml/show_charges.yaml: 404 "Invalid user key"; jhammant/AIonDemandCluster
  PR#1: "a wrong/revoked key comes back as HTTP 404"). It says nothing about the instance: never "gone".
* An instance that no longer exists is ``no_such_instance`` (older answers, vast-cli) or
  ``{"success": false, "error": "not_found", "msg": "Instance not found"}`` (destroy_instance.yaml
  L64-78). Either word, and only those, means gone; a bare 404 (a wrong URL, a proxy) proves nothing.
"""

from __future__ import annotations

from typing import Any

AUTH = "auth"
GONE = "gone"
OTHER = "other"

_GONE_CODES = frozenset({"no_such_instance", "not_found"})


def error_code(body: Any) -> str | None:
    """The ``error`` word of a vast answer body, or None."""
    if isinstance(body, dict) and body.get("error"):
        return str(body["error"])
    return None


def is_auth_answer(status: int, body: Any) -> bool:
    """A refused key, whatever the HTTP status vast chose for it (401, 403 or 404 ``auth_error``)."""
    return status in (401, 403) or (status == 404 and error_code(body) == "auth_error")


def instance_answer(status: int, body: Any) -> str:
    """``AUTH``, ``GONE`` or ``OTHER`` for an answer about one instance (get, stop, destroy)."""
    if is_auth_answer(status, body):
        return AUTH
    if error_code(body) in _GONE_CODES and status in (200, 400, 404, 410):
        # ``not_found`` is also vast's word for an unknown route; on an instance path it is the
        # documented "Instance not found" (destroy_instance.yaml).
        return GONE
    return OTHER
