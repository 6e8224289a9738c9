"""RunPod through its REST API v2 (``https://api.runpod.io/v2``), with plain ``requests``.

Why v2: "REST API v1 will be retired on November 15, 2026" and "The GraphQL API will be retired in
early 2027" (runpod/docs release-notes.mdx, 2026-08-18). Every call gpucli makes goes through v2
(api-reference-v2/openapi.json) except the one v2 has no equivalent for, each marked ``V2 GAP``:

* ``balance_usd``: GraphQL ``myself { clientBalance }`` (runpodctl internal/api/gpu.go ``GetUser``);
  v2 has billing *history* (``GET /v2/billing``) but no balance.

No v1 call is made anywhere. Answers prove success only when they say success (openapi.json):
``DELETE /v2/pods/{id}`` -> 204, ``POST /v2/pods/{id}/action`` stop -> 200 with the pod, create -> 201
with the pod, lists -> their wrapper object. A pod is gone only when ``GET /v2/pods/{id}`` answers the
v2 404 problem body for that id; any other answer (a 404 without it, HTML, a 200 that is not JSON) is
a failure the caller retries and reports.

Spot: RunPod removed interruptible pods in 2026 (runpod/docs 8e5aebdb dropped spot; a RunPod
maintainer on runpodctl PR #267: "podRentInterruptable ... is being removed from the runpod api"); v2
has no spot field. A spot launch is refused before anything is searched (:class:`SpotRefusedError`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpucli.errors import NoCapacityError, ProviderError, UsageError
from gpucli.providers.api import (
    LABEL_PREFIX,
    CreateAnswerLost,
    Instance,
    InstanceNotFound,
    LaunchSpec,
    Offer,
    SpotRefusedError,
)
from gpucli.providers.bootguard import RUNPOD_IMAGES, start_args
from gpucli.providers.credentials import runpod_base_url
from gpucli.providers.http import AuthError, HttpResponse, PoolRefusedError, RequestMaybeSent
from gpucli.providers.httpapi import ApiProvider
from gpucli.providers.query import Query, as_number, sort_by_order
from gpucli.providers.runpod.v2 import (
    CONTAINER_DISK_GB,
    MIN_VOLUME_DISK_GB,
    VOLUME_MAX_GB,
    VOLUME_TYPE,
    NetworkVolume,
    best_data_center,
    is_problem_404,
    next_page,
    parse_gpu_type,
    parse_pod,
    parse_volume,
    problem_detail,
    storage_usd_per_hour,
    volume_usd_per_month,
)

log = logging.getLogger(__name__)

__all__ = ["VOLUME_MAX_GB", "NetworkVolume", "RunPodProvider", "SPOT_REFUSED", "same_key_in", "volume_usd_per_month"]

SERVICE = "RunPod"
DEFAULT_GPU_COUNTS = (1, 2, 4, 8)
MAX_POD_PAGES = 200  # far beyond any account gpucli serves; a cursor that never ends is an error
CLOUDS = ("SECURE", "COMMUNITY")  # openapi ``Cloud``; network volumes are Secure Cloud only
#: The CUDA the default image is built for (runpod/pytorch:1.0.2-cu1281-...: gpucli/providers/runpod/target.py):
#: the catalogue's availability is read for hosts at or above it.
DEFAULT_MIN_CUDA = "12.8"

SPOT_REFUSED = ("RunPod has no spot (interruptible) pods any more (removed in 2026; REST API v2 has no "
                "bid): use vast.ai bids with --provider vast --spot, or drop --spot")

#: V2 GAP: no balance in REST v2 (only billing history); GraphQL until it is retired in early 2027.
BALANCE_QUERY = "query Myself {\n  myself { id clientBalance }\n}"

#: What RunPod says when nothing can be placed: the GraphQL-era wording, the wording live
#: ``podRentInterruptable`` attempts returned in runpodctl PR #267 (2026-04-08), and v2's 400 whose
#: ``detail`` is the only sign of capacity exhaustion (openapi.json ``createPod``).
_NO_CAPACITY_PHRASES = (
    "no longer any instances available",
    "no instances available with the request",
    "not enough free gpus",
    "no instances currently available",
    "could not be placed",
    "no capacity",
)


class RunPodProvider(ApiProvider):
    """RunPod pods over REST v2. Offers are GPU types per cloud and GPU count, pinned to a data centre."""

    name = "runpod"
    service = SERVICE
    #: Every call gpucli makes to RunPod and the API it goes through (``gpucli doctor`` prints it).
    API_CALLS = (
        ("offers", "REST v2 GET /v2/catalog/gpus"), ("create", "REST v2 POST /v2/pods"),
        ("status", "REST v2 GET /v2/pods/{id}"), ("list", "REST v2 GET /v2/pods"),
        ("stop/start", "REST v2 POST /v2/pods/{id}/action"), ("terminate", "REST v2 DELETE /v2/pods/{id}"),
        ("volumes", "REST v2 /v2/network-volumes"), ("SSH keys", "REST v2 GET /v2/account/ssh-keys"),
        ("balance", "GraphQL myself.clientBalance (no v2 equivalent; GraphQL retires early 2027)"),
        ("clusters", "REST v2 POST/GET /v2/clusters, GET /v2/clusters/{id}/pods, DELETE /v2/clusters/{id}"),
        ("pod watchdog", "pod key: REST v2 POST /v2/pods/{id}/action stop|terminate, then GraphQL "
                         "podStop/podTerminate (v2 with a pod key: undocumented; see watchdog.log ended_by)"),
        ("cluster watchdog", "rank 0's pod key: REST v2 DELETE /v2/clusters/{id} (undocumented; else the laptop)"),
        ("boot guard", "pod key, create args at every container start: REST v2 POST /v2/pods/{id}/action "
                       "terminate + DELETE /v2/pods/{id} (its own launch) or stop (a restart), then GraphQL"),
    )

    def __init__(self, *, gpu_counts: tuple[int, ...] = DEFAULT_GPU_COUNTS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpu_counts = gpu_counts

    def default_base_url(self) -> str:
        return runpod_base_url()

    # -- plumbing ----------------------------------------------------------------------------------
    def _v2(self, method: str, path: str, *, what: str, json_body: Any = None, params: Mapping[str, Any] | None = None,
            idempotent: bool | None = None) -> HttpResponse:
        kwargs: dict[str, Any] = {"what": what}
        if json_body is not None:
            kwargs["json_body"] = json_body
        if params:
            kwargs["params"] = dict(params)
        if idempotent is not None:
            kwargs["idempotent"] = idempotent
        return self.http.request(method, "/v2" + path, **kwargs)

    def _expect(self, resp: HttpResponse, status: int, *, what: str) -> Any:
        """The body of an answer with the documented ``status``; anything else is a ProviderError."""
        if resp.status != status:
            raise ProviderError(f"RunPod {what}: HTTP {resp.status} {problem_detail(resp.body, resp.text)}")
        if status != 204 and not isinstance(resp.body, Mapping):
            raise ProviderError(f"RunPod {what}: HTTP {resp.status} but the answer was not the documented JSON")
        return resp.body

    # -- offers ------------------------------------------------------------------------------------
    def catalog(self, count: int, cloud: str, *, min_cuda: str | None = DEFAULT_MIN_CUDA) -> list[Mapping[str, Any]]:
        """``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=C[&minCudaVersion=V]``."""
        params: dict[str, Any] = {"include": "AVAILABILITY", "product": "POD", "count": count, "cloud": cloud}
        if min_cuda:
            params["minCudaVersion"] = min_cuda
        body = self._expect(self._v2("GET", "/catalog/gpus", params=params, what="list GPU types"), 200,
                            what="list GPU types")
        gpus = body.get("gpus")
        if not isinstance(gpus, list):
            raise ProviderError("RunPod list GPU types: no 'gpus' list in the answer")
        return [g for g in gpus if isinstance(g, Mapping)]

    def search_offers(self, query: Query | None = None, *, spot: bool = False, limit: int = 50,
                      order: str = "dph_total", disk_gb: float | None = None) -> list[Offer]:
        """One offer per GPU type, count and cloud, with the data centre that has that count in stock.
        The quote is the GPU rate plus the container disk and the volume disk (``disk_gb``, where the
        run folder lives) at their running rates (pods/pricing.mdx L46-47)."""
        if spot:
            raise SpotRefusedError(SPOT_REFUSED)
        volume_gb = max(MIN_VOLUME_DISK_GB, int(disk_gb or MIN_VOLUME_DISK_GB))
        storage = storage_usd_per_hour(CONTAINER_DISK_GB, volume_gb)
        offers: list[Offer] = []
        for count in _counts_for(query, self.gpu_counts):
            for cloud in CLOUDS:
                for item in self.catalog(count, cloud):
                    offer = parse_gpu_type(item, count, cloud, storage_per_hour=storage)
                    if offer is None or (query is not None and not query.matches(offer.query_record())):
                        continue
                    offers.append(offer)
        return sort_by_order(offers, order)[: max(0, limit)]

    # -- lifecycle ---------------------------------------------------------------------------------
    def create(self, spec: LaunchSpec) -> Instance:
        """``POST /v2/pods`` pinned to the offer's cloud and data centre, with the run folder's disk
        mounted at ``spec.mount_path`` (a network volume's path has "no default - must be specified",
        openapi ``NetworkMount``) and the lowest CUDA version the image needs."""
        if spec.spot:
            raise SpotRefusedError(SPOT_REFUSED)
        pub = spec.ssh_public_key.strip()
        env = {k: str(v) for k, v in spec.env.items() if k not in ("PUBLIC_KEY", "SSH_PUBLIC_KEY")}
        # startSsh injects PUBLIC_KEY only "unless the request already sets one" (openapi CreatePodRequest);
        # gpucli's own key, so no account key is needed. SSH_PUBLIC_KEY: the per-pod override
        # (pods/configuration/use-ssh.mdx).
        env["PUBLIC_KEY"] = pub
        env["SSH_PUBLIC_KEY"] = pub
        gpu: dict[str, Any] = {"id": spec.gpu_name, "count": spec.gpu_count}
        if spec.min_cuda:
            gpu["minCudaVersion"] = spec.min_cuda
        body: dict[str, Any] = {
            "name": spec.label, "image": spec.image, "gpu": gpu, "disk": CONTAINER_DISK_GB,
            "ports": [p.replace(" ", "") for p in spec.ports], "env": env, "startSsh": True,
        }
        if spec.boot_guard and spec.image.startswith(RUNPOD_IMAGES):
            body["args"] = start_args(spec.boot_guard, spec.onstart)
        cloud, dc = _pinned(spec)
        if spec.network_volume_id:
            # Network volumes are Secure Cloud only (storage/network-volumes.mdx L98), in their data centre.
            body["cloud"] = "SECURE"
            body["mounts"] = {"network": [{"volumeId": spec.network_volume_id, "path": spec.mount_path}]}
            if spec.data_center_id:
                body["dataCenterIds"] = [spec.data_center_id]
        else:
            if cloud:
                body["cloud"] = cloud
            if dc:
                body["dataCenterIds"] = [dc]
            size = max(MIN_VOLUME_DISK_GB, spec.volume_gb or spec.disk_gb)
            body["mounts"] = {"persistent": {"size": size, "path": spec.mount_path}}
        try:
            resp = self._v2("POST", "/pods", json_body=body, what="create pod", idempotent=False)
        except RequestMaybeSent as exc:
            raise CreateAnswerLost(f"RunPod create pod: {exc.message}", label=spec.label) from None
        except AuthError as exc:
            if exc.status == 403:  # createPod: "cannot access the requested pool ... Skip this candidate"
                raise PoolRefusedError(f"RunPod: this account cannot use the pool of offer {spec.offer_id or '?'} "
                                       f"(HTTP 403 {exc.detail})".rstrip(), hint="the next offer is tried") from None
            raise
        if resp.status in (400, 404) and _no_capacity(resp):
            raise NoCapacityError(f"RunPod has no capacity for this request: {problem_detail(resp.body, resp.text)}",
                                  hint="try another GPU type, count or data centre")
        if resp.status == 402:
            raise ProviderError(f"RunPod: insufficient balance ({problem_detail(resp.body, resp.text)})",
                                hint="add credit in the RunPod console")
        pod = self._expect(resp, 201, what="create pod")
        if not pod.get("id"):
            raise ProviderError("RunPod create pod returned no pod id")
        return parse_pod(pod, ssh_user=self.ssh_user)

    def get(self, instance_id: str) -> Instance:
        """``GET /v2/pods/{id}``; :class:`InstanceNotFound` only on v2's own 404 for that id."""
        resp = self._v2("GET", f"/pods/{_safe_pod_id(instance_id)}", what="get pod")
        if resp.status == 404 and is_problem_404(resp.body):
            raise InstanceNotFound(f"RunPod has no pod {instance_id}")
        return parse_pod(self._expect(resp, 200, what="get pod"), ssh_user=self.ssh_user)

    def list_instances(self) -> list[Instance]:
        """``GET /v2/pods`` -> ``{"pods": [...]}``, read to its last page; any other answer is an error,
        never "no pods". The spec shows no paging (openapi ``listPods``), but v2 clients page it
        (gipper 0.5.0: "pod listing walks every page"; SkyPilot PR#10846 follows a cursor) and RunPod's
        own v2 client reads ``truncated`` + ``nextCursor`` envelopes (runpod/runpod-mcp PR#46): a
        continuation is followed, and a page that says it is cut short without one is an error, so a
        stray sweep never takes one page for the account."""
        out: list[Instance] = []
        cursor: str | None = None
        for _ in range(MAX_POD_PAGES):
            body = self._expect(self._v2("GET", "/pods", params={"cursor": cursor} if cursor else None,
                                         what="list pods"), 200, what="list pods")
            pods = body.get("pods")
            if not isinstance(pods, list):
                raise ProviderError("RunPod list pods: no 'pods' list in the answer")
            out += [parse_pod(p, ssh_user=self.ssh_user) for p in pods if isinstance(p, Mapping)]
            cursor, more = next_page(body)
            if cursor is None:
                if more:
                    raise ProviderError("RunPod list pods: the answer says it is cut short but gives no cursor "
                                        "to read the rest", hint="list the pods in the RunPod console")
                break
        else:
            raise ProviderError(f"RunPod list pods: still more after {MAX_POD_PAGES} pages")
        return [i for i in out if i.label and i.label.startswith(LABEL_PREFIX)]

    def terminate(self, instance_id: str) -> None:
        """``DELETE /v2/pods/{id}`` (204). A 404 counts only when ``GET`` then answers v2's 404 for the
        id; everything else raises, so the caller keeps the pod as "terminate pending" and retries."""
        pod_id = _safe_pod_id(instance_id)
        resp = self._v2("DELETE", f"/pods/{pod_id}", what="terminate pod")
        if resp.status == 204:
            return
        if resp.status == 404 and is_problem_404(resp.body):
            try:
                self.get(pod_id)
            except InstanceNotFound:
                log.info("RunPod pod %s already gone", pod_id)
                return
            raise ProviderError(f"RunPod terminate pod {pod_id}: DELETE said 404 but the pod is still listed")
        raise ProviderError(f"RunPod terminate pod {pod_id}: HTTP {resp.status} "
                            f"{problem_detail(resp.body, resp.text)}")

    def stop(self, instance_id: str) -> None:
        """``POST /v2/pods/{id}/action {"action": "stop"}`` -> 200 with the pod (EXITED)."""
        pod_id = _safe_pod_id(instance_id)
        resp = self._v2("POST", f"/pods/{pod_id}/action", json_body={"action": "stop"}, what="stop pod",
                        idempotent=True)
        if resp.status == 404 and is_problem_404(resp.body):
            raise InstanceNotFound(f"RunPod has no pod {pod_id}")
        if resp.status == 409 and self.get(pod_id).state.value in ("exited", "stopped"):
            return  # already stopped: "Action not valid for current pod status"
        pod = self._expect(resp, 200, what="stop pod")
        if str(pod.get("status")) not in ("EXITED", "STOPPING", "TERMINATED"):
            raise ProviderError(f"RunPod stop pod {pod_id}: the pod says {pod.get('status')!r}, not stopped")

    def start(self, instance_id: str) -> Instance:
        """``POST /v2/pods/{id}/action {"action": "start"}`` -> 200 with the pod."""
        pod_id = _safe_pod_id(instance_id)
        resp = self._v2("POST", f"/pods/{pod_id}/action", json_body={"action": "start"}, what="start pod",
                        idempotent=True)
        return parse_pod(self._expect(resp, 200, what="start pod"), ssh_user=self.ssh_user)

    # -- account -----------------------------------------------------------------------------------
    def verify_key(self) -> str:
        """The key checked against REST v2 (``GET /v2/pods``, read-only); returns what accepted it."""
        self.list_instances()
        return "REST v2 (GET /v2/pods)"

    def balance_usd(self) -> float | None:
        # V2 GAP: REST v2 has no balance; GraphQL ``myself.clientBalance`` until GraphQL is retired.
        resp = self.http.request("POST", "/graphql", json_body={"query": BALANCE_QUERY, "variables": {}},
                                 idempotent=True, what="myself (GraphQL: no v2 balance)")
        body = resp.body
        if not resp.ok or not isinstance(body, Mapping) or body.get("errors"):
            raise ProviderError(f"RunPod balance (GraphQL): HTTP {resp.status} {problem_detail(body, resp.text)}")
        me = (body.get("data") or {}).get("myself") if isinstance(body.get("data"), Mapping) else None
        return as_number(me.get("clientBalance")) if isinstance(me, Mapping) else None

    def account_ssh_keys(self) -> list[str]:
        """``GET /v2/account/ssh-keys`` -> ``{"keys": [...]}``."""
        body = self._expect(self._v2("GET", "/account/ssh-keys", what="list SSH keys"), 200, what="list SSH keys")
        keys = body.get("keys")
        if not isinstance(keys, list):
            raise ProviderError("RunPod list SSH keys: no 'keys' list in the answer")
        return [str(k) for k in keys]

    def account_has_ssh_key(self, public_key: str) -> bool | None:
        return same_key_in(public_key, self.account_ssh_keys())

    # -- network volumes ---------------------------------------------------------------------------
    def network_volumes(self) -> list[NetworkVolume]:
        """``GET /v2/network-volumes`` -> ``{"networkVolumes": [...]}``."""
        body = self._expect(self._v2("GET", "/network-volumes", what="list network volumes"), 200,
                            what="list network volumes")
        items = body.get("networkVolumes")
        if not isinstance(items, list):
            raise ProviderError("RunPod list network volumes: no 'networkVolumes' list in the answer")
        return [v for v in (parse_volume(i) for i in items if isinstance(i, Mapping)) if v is not None]

    def find_volume(self, name_or_id: str) -> NetworkVolume:
        """A volume by id or name; a UsageError naming the account's volumes when there is none."""
        volumes = self.network_volumes()
        for v in volumes:
            if name_or_id in (v.volume_id, v.name):
                return v
        have = ", ".join(f"{v.name} ({v.data_center_id})" for v in volumes) or "none"
        raise UsageError(f"--volume {name_or_id}: no RunPod network volume of that name or id (yours: {have})",
                         hint="add --volume-size GB to create it, or create one in the RunPod console "
                              "(Storage > Network Volumes) in a data centre with the GPU you want")

    def data_center_for(self, gpu_type_id: str, count: int = 1) -> str:
        """The Secure Cloud data centre with the most of ``count`` x ``gpu_type_id`` free (catalog
        ``dataCenters`` are scoped by ``count`` and ``cloud``, openapi ``GpuType``): where a new volume
        must be for a pod of that size to mount it."""
        for item in self.catalog(count, "SECURE"):
            if str(item.get("id")) == gpu_type_id:
                dc = best_data_center(item)
                if dc is not None:
                    return dc
        raise NoCapacityError(f"no RunPod Secure Cloud data centre has {count}x {gpu_type_id} free for a new "
                              "network volume", hint="try another GPU type or count, or create the volume in "
                                                     "the console and pass its name")

    def create_volume(self, name: str, size_gb: int, data_center_id: str) -> NetworkVolume:
        """``POST /v2/network-volumes {name, size, dataCenter, type: STANDARD}`` -> 201 (migrate-from-v1.mdx: v1's
        ``dataCenterId`` is ``dataCenter`` in v2). A lost answer is looked up by name before giving up."""
        body = {"name": name, "size": int(size_gb), "dataCenter": data_center_id, "type": VOLUME_TYPE}
        try:
            resp = self._v2("POST", "/network-volumes", json_body=body, idempotent=False, what="create network volume")
        except RequestMaybeSent as exc:
            for v in self.network_volumes():
                if v.name == name and v.data_center_id == data_center_id:
                    return v
            raise ProviderError(f"RunPod create network volume: {exc.message}; no volume {name} was found after it",
                                hint="check the RunPod console (Storage) before launching again") from None
        if resp.status != 201:
            raise ProviderError(f"RunPod refused to create network volume {name} ({size_gb} GB in "
                                f"{data_center_id}): HTTP {resp.status} {problem_detail(resp.body, resp.text)}")
        volume = parse_volume(resp.body) if isinstance(resp.body, Mapping) else None
        if volume is None:
            raise ProviderError("RunPod create network volume returned no volume id")
        return volume

    def delete_volume(self, volume_id: str) -> None:
        """``DELETE /v2/network-volumes/{id}`` -> 204."""
        self._expect(self._v2("DELETE", f"/network-volumes/{_safe_pod_id(volume_id)}", what="delete network volume"),
                     204, what="delete network volume")


def _pinned(spec: LaunchSpec) -> tuple[str | None, str | None]:
    """The cloud and data centre the offer was quoted for: from the spec, else from the offer id."""
    cloud, dc = spec.cloud_type, spec.data_center_id
    parts = (spec.offer_id or "").split("|")
    if len(parts) == 4:
        cloud = cloud or parts[2] or None
        dc = dc or parts[3] or None
    return cloud, dc


def _no_capacity(resp: HttpResponse) -> bool:
    low = problem_detail(resp.body, resp.text).lower()
    return any(p in low for p in _NO_CAPACITY_PHRASES)


def same_key_in(public_key: str, lines: list[str]) -> bool:
    """Whether any OpenSSH key line has the same type and key material (comments ignored)."""
    want = public_key.split()[:2]
    return any(line.split()[:2] == want for line in lines if line.strip())


def _safe_pod_id(value: str) -> str:
    text = str(value)
    if not text or not all(c.isalnum() or c == "_" for c in text):
        raise ProviderError(f"'{text}' is not a RunPod id")
    return text


def _counts_for(query: Query | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """GPU counts worth asking about: an exact ``num_gpus=N`` narrows it to one request per cloud."""
    if query is not None:
        for field, ops in query.filters:
            if field == "num_gpus":
                for op, value in ops:
                    if op == "eq" and isinstance(value, str) and value.isdigit():
                        return (int(value),)
    return default
