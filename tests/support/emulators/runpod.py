"""A RunPod GraphQL emulator: the subset gpucli uses, with RunPod's shapes and quirks.

Faithful to providers.md §1: ``POST /graphql`` with Bearer auth (401 otherwise); errors are HTTP 200
with an ``errors`` list and ``data.<root>: null``; ``gpuTypes`` with ``lowestPrice``; create via
``podFindAndDeployOnDemand`` / ``podRentInterruptable`` (``bidPerGpu``); ``pod(input:{podId})`` with
``runtime: null`` until the image is up; ``myself { pods }``; ``podStop`` -> ``EXITED``;
``podTerminate`` with no selection and "pod not found to terminate" for a gone pod.

Strictness (each switchable): an inline ``input: {...}`` may hold only ``$variables`` (no literal
values: how the tests prove gpucli never string-builds GraphQL); variable types must be the names the
official clients send (``KNOWN_TYPES``; anything else is HTTP 400 ``GRAPHQL_VALIDATION_FAILED`` as a
GraphQL server answers an unknown type), and a create input with an unknown field is HTTP 400 too;
a missing or Python-default User-Agent is 403 "error code: 1010" (common.py). ``spot_refused`` makes
``podRentInterruptable`` answer an error (the message is this emulator's). The REST API runpodctl uses
(``POST /v1/pods/{id}/stop``, ``DELETE /v1/pods/{id}``) is served on the same port under ``/v1``.
``myself`` answers ``pubKey`` (account keys, newline-separated) and ``clientBalance``. What ``pod`` returns for an unknown id is not recorded anywhere; this emulator answers
``{"pod": null}``. The bid-too-low message is invented.

Pods: each pod's environment carries ``RUNPOD_POD_ID``, a pod-scoped ``RUNPOD_API_KEY`` (a fresh
random key; RunPod documents both as set in every pod); ``RUNPOD_API_BASE_URL`` only with the
``pod_env_has_base_url`` switch (off: real pods leave it unset, the watchdog reads its endpoint from
its own env file). That key may run ``podStop`` and ``podTerminate`` (and the REST stop/delete) for its
own pod only; anything else gets a GraphQL ``FORBIDDEN`` error at HTTP 200 (RunPod's error convention;
the exact message is this emulator's). Whether real RunPod's REST API takes a pod-scoped key is not
documented.

Network volumes (``create_volume``): listed by ``myself { networkVolumes { id name size dataCenterId } }``
(runpod-python's user query); a create with ``networkVolumeId`` must name one and its ``dataCenterId``
(the messages are this emulator's). Each volume's store is a folder that stands for the /workspace of
every pod created with it. ``POST /v1/networkvolumes`` with ``name``, ``size`` and ``dataCenterId`` creates
one (runpodctl internal/api/volumes.go sends that body); as strict as RunPod documents it: a name of
1-255 characters, a whole size of 1-4000 GB (runpodctl ``network-volume create --size``), a data centre
that ``dataCenters`` lists, no other field; anything else is HTTP 400 ``{"error": ...}`` (the messages and
the 400 are this emulator's). ``query { dataCenters { id name location gpuAvailability { gpuTypeId
stockStatus } } }`` (runpodctl internal/api/gpu.go) says which data centre has which GPU in stock.
"""

from __future__ import annotations

import random
import re
import string
from pathlib import Path
from typing import Any

from tests.support.emulators.common import EmulatorBase, EmuPod, Reply

NO_CAPACITY_MESSAGE = ("There are no longer any instances available with the requested specifications. "
                       "Please refresh and try again.")

GPU_TYPES: list[dict[str, Any]] = [
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "maxGpuCount": 8,
     "securePrice": 0.69, "communityPrice": 0.34, "secureSpotPrice": 0.35, "communitySpotPrice": 0.2,
     "price": 0.34, "bid": 0.2, "stock": "High", "counts": [1, 2, 4, 8]},
    {"id": "NVIDIA A100 80GB PCIe", "displayName": "A100 PCIe", "memoryInGb": 80, "maxGpuCount": 8,
     "securePrice": 1.64, "communityPrice": 1.19, "secureSpotPrice": 0.82, "communitySpotPrice": 0.6,
     "price": 1.19, "bid": 0.6, "stock": "Low", "counts": [1, 2, 4]},
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80, "maxGpuCount": 8,
     "securePrice": 2.99, "communityPrice": 2.69, "secureSpotPrice": 1.75, "communitySpotPrice": 1.5,
     "price": 2.69, "bid": 1.5, "stock": "Medium", "counts": [1, 2, 4, 8]},
    {"id": "NVIDIA RTX A4000", "displayName": "RTX A4000", "memoryInGb": 16, "maxGpuCount": 4,
     "securePrice": 0.35, "communityPrice": 0.2, "secureSpotPrice": 0.18, "communitySpotPrice": 0.1,
     "price": 0.35, "bid": 0.2, "stock": None, "counts": []},  # listed, nothing in stock
]

_ROOT = re.compile(r"\{\s*([A-Za-z_][A-Za-z0-9_]*)")
_INLINE_INPUT = re.compile(r"\(\s*input\s*:\s*\{([^}]*)\}")
_VAR_DECL = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([A-Za-z_\[\]!]+)")
_REST_POD = re.compile(r"^/v1/pods/([A-Za-z0-9]+)(/stop)?$")

#: Data centres and the GPU types each has in stock (ids in RunPod's XX-XX-N form; the stock is invented).
DATA_CENTERS: list[dict[str, Any]] = [
    {"id": "EU-RO-1", "name": "EU-RO-1", "location": "Romania",
     "gpuAvailability": [{"gpuTypeId": "NVIDIA GeForce RTX 4090", "stockStatus": "Medium"},
                         {"gpuTypeId": "NVIDIA A100 80GB PCIe", "stockStatus": "Low"}]},
    {"id": "US-KS-2", "name": "US-KS-2", "location": "United States",
     "gpuAvailability": [{"gpuTypeId": "NVIDIA GeForce RTX 4090", "stockStatus": "High"},
                         {"gpuTypeId": "NVIDIA H100 80GB HBM3", "stockStatus": "Medium"}]},
    {"id": "EU-SE-1", "name": "EU-SE-1", "location": "Sweden",
     "gpuAvailability": [{"gpuTypeId": "NVIDIA H100 80GB HBM3", "stockStatus": None}]},
]
VOLUME_FIELDS = frozenset({"name", "size", "dataCenterId"})

#: Variable types confirmed by official clients: runpod/runpodctl api/pod.go (PodFindAndDeployOnDemandInput!,
#: String! podId), api/cloud.go (GpuLowestPriceInput!); PodRentInterruptableInput! by RunPod's schema
#: page as cited in SkyPilot's sky/provision/runpod/api/pods.py (no official client sends it).
KNOWN_TYPES = frozenset({"PodFindAndDeployOnDemandInput!", "PodRentInterruptableInput!", "GpuLowestPriceInput!",
                         "GpuLowestPriceInput", "String!", "String"})

#: Create inputs the official SDK sends (runpod/runpod-python:runpod/api/mutations/pods.py) plus dstack's
#: minCudaVersion / containerRegistryAuthId and the spot bid.
CREATE_FIELDS = frozenset({
    "name", "imageName", "cloudType", "startSsh", "startJupyter", "gpuTypeId", "supportPublicIp", "gpuCount",
    "volumeInGb", "minVcpuCount", "minMemoryInGb", "allowedCudaVersions", "dataCenterId", "countryCode",
    "dockerArgs", "containerDiskInGb", "ports", "volumeMountPath", "env", "templateId", "networkVolumeId",
    "minDownload", "minUpload", "minCudaVersion", "containerRegistryAuthId", "volumeKey", "instanceId",
})
SPOT_FIELDS = CREATE_FIELDS | {"bidPerGpu"}


def _bad_request(message: str) -> Reply:
    return Reply(400, {"errors": [{"message": message, "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"}}]})


def _pod_id(variables: dict[str, Any]) -> str:
    """``$podId`` as runpodctl sends it, or ``$input.podId`` (older clients)."""
    if "podId" in variables:
        return str(variables["podId"])
    return str((variables.get("input") or {}).get("podId"))


def _gql_error(message: str, root: str | None, code: str | None = None) -> Reply:
    err: dict[str, Any] = {"message": message}
    if root:
        err["path"] = [root]
    if code:
        err["extensions"] = {"code": code}
    return Reply(200, {"errors": [err], "data": {root: None} if root else None})


class RunPodEmulator(EmulatorBase):
    provider = "runpod"

    def __init__(self, root: Any, api_key: str = "rp-test-key") -> None:
        super().__init__(root, api_key)
        self.gpu_types = [dict(g) for g in GPU_TYPES]
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (root field, variables)
        self._rng = random.Random(5)
        self.strict_graphql = True
        self.spot_refused = False
        self.account_keys: list[str] = []  # myself.pubKey lines
        self.balance_usd: float | None = 25.0
        self.volumes: dict[str, dict[str, Any]] = {}  # network volumes: id -> {id, name, size, dataCenterId}
        self.pod_volumes: dict[str, str] = {}  # pod id -> the network volume it was created with
        self.data_centers = [dict(dc) for dc in DATA_CENTERS]
        self.volume_ids: list[str] = []  # ids the next REST-created volumes get (a test knows its store up front)

    def unauthorized(self) -> Reply:
        return Reply(401, text="Unauthorized")

    def forbidden(self, endpoint: str) -> Reply:
        if endpoint.startswith("rest_"):
            return Reply(403, {"error": "this API key is scoped to one pod"})
        return _gql_error("This API key is scoped to one pod: it can only stop or terminate that pod.",
                          endpoint if endpoint not in ("other", "") else None, "FORBIDDEN")

    def pod_environment(self, pod: EmuPod) -> dict[str, str]:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "RUNPOD_POD_ID": pod.pod_id, "RUNPOD_API_KEY": pod.scoped_key,
                "RUNPOD_GPU_COUNT": str(pod.gpu_count), "RUNPOD_POD_HOSTNAME": f"{pod.pod_id}-64410065"}
        if self.pod_env_has_base_url:
            env["RUNPOD_API_BASE_URL"] = self.url
        return env

    def pod_key_allows(self, pod_id: str, method: str, path: str, body: Any, endpoint: str) -> bool:
        if endpoint in ("rest_stop", "rest_terminate"):
            match = _REST_POD.match(path)
            return match is not None and match.group(1) == pod_id
        if endpoint not in ("stop", "terminate") or not isinstance(body, dict):
            return False
        variables = body.get("variables") or {}
        return isinstance(variables, dict) and _pod_id(variables) == pod_id

    def classify(self, method: str, path: str, body: Any) -> str:
        rest = _REST_POD.match(path)
        if rest is not None:
            if rest.group(2) and method == "POST":
                return "rest_stop"
            return "rest_terminate" if method == "DELETE" and not rest.group(2) else "other"
        if method != "POST" or path.rstrip("/") != "/graphql" or not isinstance(body, dict):
            return "other"
        match = _ROOT.search(str(body.get("query") or ""))
        root = match.group(1) if match else ""
        return {"podFindAndDeployOnDemand": "create", "podRentInterruptable": "create", "pod": "get",
                "myself": "list", "podTerminate": "terminate", "podStop": "stop",
                "gpuTypes": "search"}.get(root, root)

    # -- dispatch --------------------------------------------------------------------------------
    def handle(self, method: str, path: str, query: dict[str, str], body: Any, endpoint: str, *,
               no_capacity: bool, by: str) -> Reply:
        if path.rstrip("/") == "/v1/networkvolumes":
            return self._volumes_rest(method, body)
        if path.startswith("/v1/"):
            return self._rest(method, path, by)
        if method != "POST" or path.rstrip("/") != "/graphql":
            return Reply(404, text="Not Found")
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return Reply(400, {"errors": [{"message": "Must provide query string.",
                                           "extensions": {"code": "BAD_REQUEST"}}]})
        document = body["query"]
        variables = body.get("variables") or {}
        match = _ROOT.search(document)
        root = match.group(1) if match else ""
        with self.lock:
            self.calls.append((root, variables))
        strict = self.strict_graphql and (by != "pod-key" or self.strict_pod_calls)
        for inline in _INLINE_INPUT.finditer(document):
            values = [v.split(":", 1)[-1].strip() for v in inline.group(1).split(",") if v.strip()]
            if any(not v.startswith("$") for v in values):
                return _bad_request("emulator: pass inputs as variables, not literals")
        if strict:
            for _name, type_name in _VAR_DECL.findall(document):
                if type_name not in KNOWN_TYPES:
                    return _bad_request(f'Unknown type "{type_name.strip("[]!")}".')
            if root in ("podFindAndDeployOnDemand", "podRentInterruptable"):
                allowed = SPOT_FIELDS if root == "podRentInterruptable" else CREATE_FIELDS
                type_name = "PodRentInterruptableInput" if root == "podRentInterruptable" else \
                    "PodFindAndDeployOnDemandInput"
                for key in (variables.get("input") or {}):
                    if key not in allowed:
                        return _bad_request(f'Field "{key}" is not defined by type "{type_name}".')
        if root == "gpuTypes":
            return Reply(200, {"data": {"gpuTypes": self._gpu_types(variables)}})
        if root == "dataCenters":
            return Reply(200, {"data": {"dataCenters": [dict(dc) for dc in self.data_centers]}})
        if root in ("podFindAndDeployOnDemand", "podRentInterruptable"):
            return self._create(root, variables.get("input") or {}, no_capacity)
        if root == "pod":
            pod_id = _pod_id(variables)
            with self.lock:
                pod = self.pods.get(pod_id)
                if pod is None:
                    return Reply(200, {"data": {"pod": None}})
                pod.polls += 1
                return Reply(200, {"data": {"pod": self._render(pod, advance=True)}})
        if root == "myself":
            with self.lock:
                pods = [self._render(p, advance=False) for p in self.pods.values()]
                volumes = [dict(v) for v in self.volumes.values()]
            return Reply(200, {"data": {"myself": {"id": "user_emu", "pods": pods,
                                                   "pubKey": "\n".join(self.account_keys),
                                                   "clientBalance": self.balance_usd,
                                                   "networkVolumes": volumes}}})
        if root == "podStop":
            pod_id = _pod_id(variables)
            if self.end_pod(pod_id, "stopped", by) is None:
                return _gql_error("pod not found", root)
            return Reply(200, {"data": {"podStop": {"id": pod_id, "desiredStatus": "EXITED"}}})
        if root == "podTerminate":
            pod_id = _pod_id(variables)
            if self.end_pod(pod_id, "terminated", by) is None:
                return _gql_error("pod not found to terminate", root)
            return Reply(200, {"data": {"podTerminate": None}})
        return _gql_error(f'Cannot query field "{root}" on type "Query".', None, "GRAPHQL_VALIDATION_FAILED")

    def _rest(self, method: str, path: str, by: str) -> Reply:
        match = _REST_POD.match(path)
        if match is None:
            return Reply(404, {"error": "not found"})
        pod_id = match.group(1)
        if method == "POST" and match.group(2):
            if self.end_pod(pod_id, "stopped", by) is None:
                return Reply(404, {"error": "pod not found"})
            return Reply(200, {"id": pod_id, "desiredStatus": "EXITED"})
        if method == "DELETE" and not match.group(2):
            if self.end_pod(pod_id, "terminated", by) is None:
                return Reply(404, {"error": "pod not found"})
            return Reply(204, text="")
        return Reply(405, {"error": "method not allowed"})

    def _volumes_rest(self, method: str, body: Any) -> Reply:
        if method == "GET":
            with self.lock:
                return Reply(200, [dict(v) for v in self.volumes.values()])
        if method != "POST":
            return Reply(405, {"error": "method not allowed"})
        if not isinstance(body, dict):
            return Reply(400, {"error": "request body must be a JSON object"})
        unknown = sorted(set(body) - VOLUME_FIELDS)
        if unknown:
            return Reply(400, {"error": f"unknown field(s): {', '.join(unknown)}"})
        name, size, dc = body.get("name"), body.get("size"), body.get("dataCenterId")
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            return Reply(400, {"error": "name: must be a string of 1 to 255 characters"})
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 4000:
            return Reply(400, {"error": f"size: must be a whole number of GB from 1 to 4000, got {size!r}"})
        if dc not in {d["id"] for d in self.data_centers}:
            return Reply(400, {"error": f"dataCenterId: unknown data center {dc!r}"})
        with self.lock:
            volume_id = self.volume_ids.pop(0) if self.volume_ids else None
        volume_id = self.create_volume(name, dc, size, volume_id=volume_id)
        return Reply(200, dict(self.volumes[volume_id]))

    # -- operations ------------------------------------------------------------------------------
    def _gpu_types(self, variables: dict[str, Any]) -> list[dict[str, Any]]:
        wanted = (variables.get("gpuTypesInput") or {}).get("id")
        count = int((variables.get("lowestPriceInput") or {}).get("gpuCount") or 1)
        out = []
        for g in self.gpu_types:
            if wanted and g["id"] != wanted:
                continue
            in_stock = g["stock"] is not None and count in g["counts"]
            item = {k: g[k] for k in ("id", "displayName", "memoryInGb", "maxGpuCount", "securePrice",
                                      "communityPrice", "secureSpotPrice", "communitySpotPrice")}
            item["lowestPrice"] = {
                "minimumBidPrice": g["bid"] if in_stock else None,
                "uninterruptablePrice": g["price"] if in_stock else None,
                "minVcpu": 2 * count, "minMemory": 8 * count,
                "stockStatus": g["stock"] if in_stock else None,
                "maxUnreservedGpuCount": max(g["counts"] or [0]),
                "availableGpuCounts": list(g["counts"]),
            }
            out.append(item)
        return out

    def _create(self, root: str, spec: dict[str, Any], no_capacity: bool) -> Reply:
        gpu = next((g for g in self.gpu_types if g["id"] == spec.get("gpuTypeId")), None)
        count = int(spec.get("gpuCount") or 1)
        if gpu is None:
            return _gql_error(f"GPU type {spec.get('gpuTypeId')!r} not found", root)
        if no_capacity or gpu["stock"] in (None, "None") or count not in gpu["counts"]:
            return _gql_error(NO_CAPACITY_MESSAGE, root)
        volume_id = spec.get("networkVolumeId")
        if volume_id is not None:
            volume = self.volumes.get(str(volume_id))
            if volume is None:
                return _gql_error(f"network volume {volume_id} not found", root)
            if spec.get("dataCenterId") != volume["dataCenterId"]:  # a volume is reachable only in its DC
                return _gql_error(f"network volume {volume_id} is in {volume['dataCenterId']}, "
                                  f"not {spec.get('dataCenterId')}", root)
        spot = root == "podRentInterruptable"
        if spot and self.spot_refused:
            return _gql_error("Interruptible pods are not available for this account.", root)
        bid = spec.get("bidPerGpu")
        if spot and (not isinstance(bid, int | float) or bid < gpu["bid"]):
            return _gql_error(f"Your bid of {bid} is below the current minimum bid of {gpu['bid']}.", root)
        pod_id = "".join(self._rng.choice(string.ascii_lowercase + string.digits) for _ in range(14))
        env = {e.get("key"): e.get("value") for e in spec.get("env") or [] if isinstance(e, dict)}
        price = (bid if spot else gpu["price"]) * count
        pod = EmuPod(pod_id=pod_id, label=spec.get("name"), gpu_name=gpu["displayName"], gpu_count=count,
                     image=str(spec.get("imageName")), price_per_hour=price, spot=spot,
                     bid=bid if spot else None, behaviour=self.next_behaviour())
        for var in ("PUBLIC_KEY", "SSH_PUBLIC_KEY"):
            for line in str(env.get(var) or "").splitlines():
                pod.add_key(line)
        self.add_pod(pod)
        if volume_id is not None:
            self.pod_volumes[pod_id] = str(volume_id)
        self.ledger.record(pod_id, "created", label=pod.label, spot=spot, bid=bid if spot else None)
        machine = "".join(self._rng.choice(string.ascii_lowercase) for _ in range(12))
        return Reply(200, {"data": {root: {
            "id": pod_id, "imageName": pod.image,
            "env": [f"{k}={v}" for k, v in env.items()],
            "machineId": machine, "machine": {"podHostId": f"{pod_id}-64410065"}}}})

    def _render(self, pod: EmuPod, *, advance: bool) -> dict[str, Any]:
        b = pod.behaviour
        if advance and b.exit_after_polls is not None and pod.polls > b.exit_after_polls:
            pod.exited = True
            pod.stop_sshd()
        desired = "EXITED" if (pod.stopped or pod.exited) else "RUNNING"
        runtime = None
        if desired == "RUNNING" and not b.stuck and pod.polls > b.pending_polls:
            sshd = self.boot(pod) if advance or pod.sshd else None
            if sshd is not None:
                runtime = {
                    "uptimeInSeconds": int(max(0, pod.polls - b.pending_polls)),
                    "ports": [
                        {"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22,
                         "publicPort": sshd.port, "type": "tcp"},
                        {"ip": "100.65.0.101", "isIpPublic": False, "privatePort": 8888,
                         "publicPort": 60141, "type": "http"},
                    ],
                    "gpus": [{"id": f"GPU-{pod.pod_id}-{i}", "gpuUtilPercent": 0, "memoryUtilPercent": 0}
                             for i in range(pod.gpu_count)],
                    "container": {"cpuPercent": 0, "memoryPercent": 0},
                }
        return {
            "id": pod.pod_id, "name": pod.label, "desiredStatus": desired, "costPerHr": pod.price_per_hour,
            "gpuCount": pod.gpu_count, "imageName": pod.image, "machineId": "hpvdausak8xb",
            "runtime": runtime, "machine": {"gpuDisplayName": pod.gpu_name, "podHostId": f"{pod.pod_id}-1"},
        }

    # -- test controls ---------------------------------------------------------------------------
    def create_volume(self, name: str, data_center_id: str = "EU-RO-1", size_gb: int = 50, *,
                      volume_id: str | None = None) -> str:
        """A network volume: its store is a folder of this emulator, what the volume's pods see at
        /workspace (the pods are this machine, so gpucli is pointed at it with GPUCLI_VOLUME_MOUNT)."""
        volume_id = volume_id or "".join(self._rng.choice(string.ascii_lowercase + string.digits) for _ in range(10))
        self.volumes[volume_id] = {"id": volume_id, "name": name, "size": size_gb, "dataCenterId": data_center_id}
        self.volume_dir(volume_id).mkdir(parents=True, exist_ok=True)
        return volume_id

    def volume_dir(self, volume_id: str) -> Path:
        return Path(self.root) / "volumes" / volume_id

    def preempt(self, pod_id: str) -> None:
        """A spot pod stopped without notice mid-run (RunPod's behaviour per providers.md §4)."""
        if self.end_pod(pod_id, "preempted", "preemption") is None:
            raise KeyError(pod_id)
