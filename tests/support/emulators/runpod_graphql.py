"""The RunPod GraphQL the emulator still serves: only what gpucli uses where REST v2 has no equal.

``POST /graphql`` with Bearer auth; errors are HTTP 200 with an ``errors`` list (RunPod's convention,
providers.md §1). Served: ``myself { id clientBalance pubKey }`` (runpodctl internal/api/gpu.go
``GetUser``), and ``podStop`` / ``podTerminate`` with ``$podId: String!`` (runpodctl api/pod.go) for the
pod-side watchdog's fallback. Every other root field is a validation error, as a GraphQL server
answers a field its schema lacks; ``podRentInterruptable`` among them (interruptible pods were removed:
runpodctl PR #267, RunPod maintainer 2026-04-13). ``emulator.graphql_enabled = False`` answers 404:
GraphQL is retired in early 2027 (runpod/docs release-notes.mdx 2026-08-18). Inputs must be passed as
variables (never string-built), and variable types must be the ones official clients send.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tests.support.emulators.common import Reply, RouteCall

if TYPE_CHECKING:
    from tests.support.emulators.runpod import RunPodEmulator

_ROOT = re.compile(r"\{\s*([A-Za-z_][A-Za-z0-9_]*)")
_INLINE_INPUT = re.compile(r"\(\s*input\s*:\s*\{([^}]*)\}")
_VAR_DECL = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([A-Za-z_\[\]!]+)")
KNOWN_TYPES = frozenset({"String!", "String"})


def _error(message: str, root: str | None, code: str | None = None) -> Reply:
    err: dict[str, Any] = {"message": message}
    if root:
        err["path"] = [root]
    if code:
        err["extensions"] = {"code": code}
    return Reply(200, {"errors": [err], "data": {root: None} if root else None})


def _root(body: Any) -> str:
    m = _ROOT.search(str(body.get("query") or "")) if isinstance(body, dict) else None
    return m.group(1) if m else ""


def install_graphql(emu: RunPodEmulator) -> None:
    """Add ``POST /graphql`` to ``emu``'s route table."""

    def pod_key_ok(pod_id: str, c: RouteCall) -> bool:
        variables = (c.body or {}).get("variables") or {} if isinstance(c.body, dict) else {}
        return _root(c.body) in ("podStop", "podTerminate") and str(variables.get("podId")) == pod_id

    def handle(c: RouteCall) -> Reply:
        if not emu.graphql_enabled:
            return Reply(404, text="Not Found")
        body = c.body
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return Reply(400, {"errors": [{"message": "Must provide query string.", "extensions": {"code": "BAD_REQUEST"}}]})
        document = body["query"]
        variables = body.get("variables") or {}
        root = _root(body)
        emu._log(root, variables)
        for inline in _INLINE_INPUT.finditer(document):
            values = [v.split(":", 1)[-1].strip() for v in inline.group(1).split(",") if v.strip()]
            if any(not v.startswith("$") for v in values):
                return Reply(400, {"errors": [{"message": "emulator: pass inputs as variables, not literals"}]})
        if c.by != "pod-key" or emu.strict_pod_calls:
            for _name, type_name in _VAR_DECL.findall(document):
                if type_name not in KNOWN_TYPES:
                    return Reply(400, {"errors": [{"message": f'Unknown type "{type_name.strip("[]!")}".',
                                                   "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"}}]})
        if root == "myself":
            return Reply(200, {"data": {"myself": {"id": "user_emu", "clientBalance": emu.balance_usd,
                                                   "pubKey": "\n".join(emu.account_keys)}}})
        if root in ("podStop", "podTerminate"):
            pod_id = str(variables.get("podId"))
            event = "stopped" if root == "podStop" else "terminated"
            if emu.end_pod(pod_id, event, c.by) is None:
                return _error("pod not found" if root == "podStop" else "pod not found to terminate", root)
            return Reply(200, {"data": {root: {"id": pod_id, "desiredStatus": "EXITED"} if root == "podStop" else None}})
        return _error(f'Cannot query field "{root}" on type "Query".', None, "GRAPHQL_VALIDATION_FAILED")

    emu.add_route("POST", "/graphql/?", "graphql", handle, pod_key_ok=pod_key_ok)
