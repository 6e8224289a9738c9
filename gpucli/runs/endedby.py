"""Which path ended a run's pod, as the pod's own watchdog wrote it in ``watchdog.json`` (gpucli/pod/watchdog.py
``finish``; the paths are gpucli/pod/podend.py's): kept in the run record as ``ended_by`` and shown by
``gpucli status``, so that a run shows whether the pod's key could end its pod (RunPod REST v2 with a
pod-scoped key is undocumented; GraphQL is the fallback until it is retired: the audit of 2026-11-28, §3.B).

Values: the watchdog's own path names (``REST v2``, ``REST v2 cluster``, ``GraphQL``, ``API``), or
``none`` when the watchdog of a cloud pod finished without ending it (a ``keep``, or every path failed).
"""

from __future__ import annotations

import json
from typing import Any

NONE = "none"
CLOUDS = ("runpod", "vast")

WORDS = {
    "REST v2": "pod key via REST v2",
    "REST v2 cluster": "pod key via REST v2 (DELETE of its cluster)",
    "GraphQL": "pod key via GraphQL",
    "API": "instance key via the vast.ai API",
    NONE: "nothing on the pod (`gpucli down` or the provider's console ends it)",
}


def ended_by_of(state: Any) -> str | None:
    """The path that ended the pod, from ``watchdog.json``'s object; None when the watchdog has not
    come to the pod's end (or the object is not its state)."""
    if not isinstance(state, dict):
        return None
    path = state.get("ended_by")
    if state.get("state") == "done":
        if isinstance(path, str) and path:
            return path
        return NONE if state.get("provider") in CLOUDS else None
    trying = state.get("trying")
    if state.get("state") == "ending" and isinstance(trying, str) and trying:
        # a stop or delete that works kills the watchdog with the container, often before the answer is
        # read: the last path tried is the one that ended the pod (gpucli/pod/podend.py end_pod)
        return trying
    return None


def ended_by_in(raw: bytes | str | None) -> str | None:
    """:func:`ended_by_of` of the text of a ``watchdog.json`` (None when it is missing or not JSON)."""
    if not raw:
        return None
    try:
        return ended_by_of(json.loads(raw))
    except (ValueError, RecursionError):
        return None


def ended_by_words(ended_by: str | None) -> str | None:
    return None if ended_by is None else WORDS.get(ended_by, ended_by)
