"""How a pod ends itself with its own credentials: the provider calls of the watchdog (watchdog.py), its
idle watch (idlewatch.py) and a container's resume script (resume.sh), standard library only and loaded
by path beside them on the pod.

RunPod: the pod-scoped ``RUNPOD_API_KEY`` through REST v2 ``POST /v2/pods/{id}/action`` (a 409 to a stop
is done), then GraphQL ``podStop``/``podTerminate`` (no source says v2 takes the pod key; GraphQL retires
in early 2027); rank 0 of an Instant Cluster ``DELETE /v2/clusters/{id}`` instead. vast.ai: the
instance's ``CONTAINER_API_KEY`` through ``PUT /api/v0/instances/{CONTAINER_ID}/`` (or DELETE). Every
attempt is a line of the run folder's ``watchdog.log``; the path that worked is returned (``ended_by``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


def log(run_dir: Path, message: str) -> None:
    """A line of the run's ``watchdog.log``, as the watchdog writes them."""
    with open(run_dir / "watchdog.log", "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} watchdog: {message}\n")


def pod_environ() -> dict[str, str]:
    env = {}
    path = os.environ.get("GPUCLI_POD_ENVIRON") or "/proc/1/environ"
    try:
        raw = Path(path).read_bytes()
    except OSError:
        raw = b""
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env  # the pod's own only: a key merely exported in this process is never used


#: Where the APIs are when the launch's env file does not say. RunPod: REST v2 under /v2 and GraphQL under
#: /graphql on one host (runpod/docs api-reference-v2/openapi.json); v1 (retired 2026-11-15) never.
RUNPOD_API_BASE = "https://api.runpod.io"
VAST_BASE = "https://console.vast.ai"
END_CAP_S = 900.0  # how long it keeps trying to end the pod (GPUCLI_WATCHDOG_END_CAP_S in its env file)

# The one-pod GraphQL documents runpodctl sends (runpod/runpodctl api/pod.go stopPod, terminatePod).
STOP_MUTATION = "mutation stopPod($podId: String!) {\n  podStop(input: {podId: $podId}) { id desiredStatus }\n}"
TERMINATE_MUTATION = "mutation terminatePod($podId: String!) {\n  podTerminate(input: {podId: $podId})\n}"


def user_agent() -> str:
    """``gpucli/<version>``, as the CLI sends. Cloudflare in front of RunPod's API answers Python's
    default agent (``Python-urllib/3.x``) with 403 "error code: 1010" (lumpenspace/raft#14). The
    version comes from the env file the launch wrote: this file cannot import gpucli."""
    return f"gpucli/{os.environ.get('GPUCLI_VERSION') or 'unknown'}"


def _endpoint(name: str, default: str) -> str:
    """An API base from the launch's env file (this process's environment), never from the pod's
    PID 1 environment: real pods carry no RUNPOD_API_BASE_URL / VAST_URL."""
    return (os.environ.get(name) or default).rstrip("/")


def _request(method: str, url: str, token: str, body: dict | None, timeout_s: float = 20.0) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json",
        "User-Agent": user_agent()})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - https or a test emulator
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _gone(text: str) -> bool:
    """The provider says there is no such pod: nothing of it bills any more."""
    low = text.lower()
    return any(p in low for p in ("pod not found", "not found to terminate", "no_such_instance", "not_found",
                                  "pod does not exist"))


def runpod_v2_ok(status: int, text: str) -> str | None:
    """RunPod REST v2 ``POST /v2/pods/{id}/action``: stop answers 200 with the pod, terminate 204
    (openapi.json ``podAction``); a 404 counts only with v2's problem body (``status: 404``), never a
    bare 404 (a wrong URL, a proxy, the retired v1)."""
    if status == 204:
        return "ended"
    body = _json(text)
    if status == 404:
        return "gone" if isinstance(body, dict) and body.get("status") == 404 and "title" in body else None
    if status == 200 and isinstance(body, dict) and body.get("status") in ("EXITED", "TERMINATED"):
        return "ended"
    return None


def runpod_v2_stop_ok(status: int, text: str) -> str | None:
    """A stop: 200 with the pod is "updated pod" ("the pod moves to EXITED", openapi ``podAction``); a 409
    with v2's problem body (not valid for the status now) is a pod already EXITED: done."""
    body = _json(text)
    if status == 409 and isinstance(body, dict) and "title" in body:
        return "ended"
    if status == 200 and isinstance(body, dict) and body.get("id"):
        return "ended"
    return runpod_v2_ok(status, text)


def runpod_cluster_ok(status: int, text: str) -> str | None:
    """``DELETE /v2/clusters/{id}`` with a member's key: 204 deleted, v2's problem 404 gone (openapi
    ``deleteCluster``, ``ErrorResponse``); a 401/403 with v2's problem body (``title`` and ``status``, never a
    proxy's page, which is retried) is v2 refusing the pod key: "refused", final, for the laptop to delete
    the cluster (no source says a member's key may; environment-variables.mdx L89 "Pod-scoped API key")."""
    body = _json(text)
    if status in (401, 403) and isinstance(body, dict) and body.get("status") == status and "title" in body:
        return "refused"
    return runpod_v2_ok(status, text)


def runpod_graphql_ok(status: int, text: str) -> str | None:
    """"ended" / "gone" for a GraphQL answer that did it, None otherwise. RunPod answers errors with
    HTTP 200 and an ``errors`` list (providers.md 1.6), so the status alone proves nothing."""
    if not 200 <= status < 300:
        return "gone" if status == 404 and _gone(text) else None
    body = _json(text)
    if not isinstance(body, dict):
        return None
    errors = body.get("errors")
    if errors:
        return "gone" if _gone(json.dumps(errors)) else None
    data = body.get("data")
    return "ended" if isinstance(data, dict) and ("podStop" in data or "podTerminate" in data) else None


def rest_ok(status: int, text: str) -> str | None:
    """vast.ai: only a 2xx whose JSON body says ``"success": true`` did it (vast-cli reads
    ``r.json()["success"]``); a 200 that is not JSON, or ``{"success": false}``, did nothing. 404 counts
    only with the provider's own "no such instance" words: a wrong URL is a 404 too."""
    if status == 404:
        return "gone" if _gone(text) else None
    if not 200 <= status < 300:
        return None
    body = _json(text)
    return "ended" if isinstance(body, dict) and body.get("success") is True else None


def pod_calls(provider: str, on_end: str, env: dict[str, str]) -> tuple[list[tuple], str | None, str | None]:
    """The calls that end this pod, in order of preference, each (what, method, url, body, judge); plus
    the pod-scoped key and, when something is missing, why the pod cannot be ended."""
    terminate = on_end == "terminate"
    if provider == "runpod":
        pod, key = env.get("RUNPOD_POD_ID"), env.get("RUNPOD_API_KEY")
        if not pod or not key:
            return [], None, "RUNPOD_POD_ID / RUNPOD_API_KEY not in the pod environment: cannot stop the pod"
        base = _endpoint("GPUCLI_RUNPOD_API_BASE_URL", RUNPOD_API_BASE)
        action = {"action": "terminate" if terminate else "stop"}
        body = {"query": TERMINATE_MUTATION if terminate else STOP_MUTATION, "variables": {"podId": pod}}
        # REST v2 first (POST /v2/pods/{id}/action, migrate-from-v1.mdx); GraphQL as the fallback while
        # it lives (retired early 2027). Whether v2 takes a pod-scoped key is not documented.
        cluster = os.environ.get("GPUCLI_RUNPOD_CLUSTER_ID")  # rank 0 of an Instant Cluster (watchdog.env)
        if cluster:
            # Members "cannot be modified or deleted via the pod endpoints" (openapi Pod.cluster): the
            # cluster is deleted whole (DELETE /v2/clusters/{id}, 204), if the pod key may; else the laptop.
            # Its v2 endpoint is the one the launch rented it through (watchdog.env), else the pods' one.
            url = f"{_endpoint('GPUCLI_RUNPOD_CLUSTER_API_URL', base)}/v2/clusters/{cluster}"
            return [("REST v2 cluster", "DELETE", url, None, runpod_cluster_ok)], key, None
        return [("REST v2", "POST", f"{base}/v2/pods/{pod}/action", action,
                 runpod_v2_ok if terminate else runpod_v2_stop_ok),
                ("GraphQL", "POST", f"{base}/graphql", body, runpod_graphql_ok)], key, None
    if provider == "vast":
        cid, key = env.get("CONTAINER_ID"), env.get("CONTAINER_API_KEY")
        if not cid or not key:
            return [], None, "CONTAINER_ID / CONTAINER_API_KEY not in the instance environment: cannot stop it"
        url = f"{_endpoint('GPUCLI_VAST_URL', VAST_BASE)}/api/v0/instances/{cid}/"
        call = ("API", "DELETE", url, None, rest_ok) if terminate else ("API", "PUT", url, {"state": "stopped"}, rest_ok)
        return [call], key, None
    return [], None, None


def end_pod(provider: str, on_end: str, run_dir: Path, on_try: Callable[[str], None] | None = None) -> str | None:
    """Stop (or terminate) this pod through the provider's API with the pod-scoped key.

    This is the call that stops the money, so no answer is final: every failure (HTTP 403 from a
    proxy in front of the API included, and a vast.ai ``{"success": false}``) is logged and retried
    with backoff until ``GPUCLI_WATCHDOG_END_CAP_S`` (default 15 minutes). The one exception is a
    cluster's delete that v2 itself refuses to the pod key ("refused": its problem body): no retry makes
    the key allowed, and the laptop's watcher, ``ls``, ``status`` or ``down`` delete the cluster.
    Returns the path that ended it ("REST v2", "GraphQL", "API", "REST v2 cluster"), None when none did.
    ``on_try`` hears each path before its call: a stop or delete that works kills this process with the
    container, often before the answer is read, so the last path tried is what ended the pod."""
    calls, key, missing = pod_calls(provider, on_end, pod_environ())
    if missing:
        log(run_dir, missing)
    if not calls or key is None:
        return None
    try:
        cap_s = float(os.environ.get("GPUCLI_WATCHDOG_END_CAP_S") or END_CAP_S)
    except ValueError:
        cap_s = END_CAP_S
    delay = 2.0
    deadline = time.monotonic() + cap_s
    attempt = 0
    while True:
        attempt += 1
        for what, method, url, body, judge in calls:
            if on_try is not None:
                on_try(what)
            try:
                status, text = _request(method, url, key, body)
            except (urllib.error.URLError, OSError) as exc:
                log(run_dir, f"FAILED to {on_end} the pod ({provider} {what}, attempt {attempt}): "
                             f"{type(exc).__name__}: {exc}")
                continue
            verdict = judge(status, text)
            if verdict == "refused":
                log(run_dir, f"{provider} {what}: HTTP {status}: the provider refuses this pod's key "
                             f"{text.replace(key, '***')[:200]!r}; left to gpucli on your machine")
                calls = [c for c in calls if c[0] != what]
                continue
            if verdict is not None:
                log(run_dir, f"{provider} {on_end} ({what}): HTTP {status}"
                             + (": the pod no longer exists" if verdict == "gone" else ""))
                return what
            hint = ""
            if status == 403:
                hint = (" (a 403 'error code: 1010' is Cloudflare refusing the client's User-Agent; "
                        f"sent {user_agent()})")
            log(run_dir, f"FAILED to {on_end} the pod ({provider} {what}, attempt {attempt}): HTTP {status} "
                         f"{text.replace(key, '***')[:200]!r}{hint}")
        if not calls:
            return None
        if time.monotonic() + delay > deadline:
            log(run_dir, f"gave up ending the pod after {attempt} attempts ({cap_s:g} s)")
            return None
        log(run_dir, f"retrying in {delay:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 60.0)
