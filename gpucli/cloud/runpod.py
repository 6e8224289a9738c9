"""RunPod over its GraphQL API, with plain ``requests`` (no SDK: see providers.md §3).

Every document below passes its inputs as GraphQL *variables*; nothing is string-built, so quotes in
a run name or env value cannot break (or inject into) a request - the SDK's f-string pitfall.

Facts this relies on (providers.md §1): ``POST {base}/graphql`` with Bearer auth; errors usually come
back as HTTP 200 with an ``errors`` list; ``runtime`` is null until the image runs; the SSH endpoint
is the ``runtime.ports`` entry with ``privatePort == 22`` that is public TCP; the spot mutation is
``podRentInterruptable`` with ``bidPerGpu``; ``podTerminate`` on a gone pod says "pod not found to
terminate", which is success here.

GraphQL input type names are the ones the official clients send: ``PodFindAndDeployOnDemandInput!``
(runpod/runpodctl:api/pod.go ``createPod``), ``GpuLowestPriceInput!`` (api/cloud.go), and for one pod
a ``$podId: String!`` variable inside an inline ``input: {podId: $podId}`` (api/pod.go ``stopPod``,
``terminatePod``). ``PodRentInterruptableInput!`` is confirmed only by RunPod's schema page as cited
by SkyPilot (sky/provision/runpod/api/pods.py); no official client sends it. Stop and terminate fall
back to the REST API (``POST /pods/{id}/stop``, ``DELETE /pods/{id}``, runpod/runpodctl:
internal/api/pods.go) when the GraphQL call is refused for any reason other than "gone" or the key.

Spot: RunPod removed interruptible pods from its docs in 2026 (runpod/docs 8e5aebdb) but the schema
kept ``podRentInterruptable``. When it refuses, gpucli says so in one line and never rents on-demand
instead (:class:`SpotRefusedError`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucli.cloud.api import ApiProvider
from gpucli.cloud.base import (
    LABEL_PREFIX,
    CreateAnswerLost,
    Instance,
    InstanceNotFound,
    InstanceState,
    LaunchSpec,
    Offer,
    SpotRefusedError,
)
from gpucli.cloud.credentials import resolve_key, runpod_base_url, runpod_rest_url
from gpucli.cloud.http import AuthError, HttpClient, NetworkError, RequestMaybeSent
from gpucli.cloud.query import Query, as_number, sort_by_order
from gpucli.errors import NoCapacityError, ProviderError, UsageError

log = logging.getLogger(__name__)

SERVICE = "RunPod"
DEFAULT_GPU_COUNTS = (1, 2, 4, 8)

_POD_FIELDS = """id name desiredStatus costPerHr gpuCount imageName machineId
      runtime { uptimeInSeconds ports { ip isIpPublic privatePort publicPort type } }
      machine { gpuDisplayName podHostId }"""

GPU_TYPES_QUERY = """query GpuTypes($lowestPriceInput: GpuLowestPriceInput!) {
  gpuTypes {
    id displayName memoryInGb maxGpuCount securePrice communityPrice secureSpotPrice communitySpotPrice
    lowestPrice(input: $lowestPriceInput) {
      minimumBidPrice uninterruptablePrice minVcpu minMemory stockStatus maxUnreservedGpuCount
      availableGpuCounts
    }
  }
}"""

CREATE_ON_DEMAND = """mutation Deploy($input: PodFindAndDeployOnDemandInput!) {
  podFindAndDeployOnDemand(input: $input) { id imageName env machineId machine { podHostId } }
}"""

CREATE_SPOT = """mutation Rent($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id imageName env machineId machine { podHostId } }
}"""

POD_QUERY = "query Pod($podId: String!) {\n  pod(input: {podId: $podId}) { " + _POD_FIELDS + " }\n}"

PODS_QUERY = "query Pods {\n  myself { pods { " + _POD_FIELDS + " } }\n}"

#: ``clientBalance`` as runpodctl reads it (internal/api/gpu.go ``GetUser``); ``pubKey`` as the SDK
#: does (runpod/runpod-python:runpod/api/queries/user.py): newline-separated account keys.
USER_QUERY = "query Myself {\n  myself { id pubKey clientBalance }\n}"

STOP_MUTATION = """mutation stopPod($podId: String!) {
  podStop(input: {podId: $podId}) { id desiredStatus }
}"""

# runpod-python's own user query (runpod/api/queries/user.py) reads the volumes from ``myself``.
VOLUMES_QUERY = """query Volumes {
  myself { networkVolumes { id name size dataCenterId } }
}"""

# runpodctl's data-centre listing (internal/api/gpu.go ``ListDataCenters``): which GPU types each data
# centre has in stock; a new network volume goes where the chosen GPU is.
DATA_CENTERS_QUERY = """query DataCenters {
  dataCenters { id name location gpuAvailability { gpuTypeId stockStatus } }
}"""

#: RunPod's published network-volume price: "$0.07 per GB per month for the first 1TB, and $0.05 per GB
#: per month for additional storage beyond that" (docs.runpod.io/serverless/storage/network-volumes;
#: the pods page, runpod/docs pods/storage/create-network-volumes.mdx, gives the same $0.07/GB/month).
VOLUME_USD_PER_GB_MONTH = 0.07
VOLUME_USD_PER_GB_MONTH_OVER_1TB = 0.05
#: What ``POST /networkvolumes`` accepts as ``size`` (runpodctl ``network-volume create --size``: 1-4000 GB).
VOLUME_MAX_GB = 4000

TERMINATE_MUTATION = """mutation terminatePod($podId: String!) {
  podTerminate(input: {podId: $podId})
}"""

_NO_CAPACITY_PHRASES = (
    "no longer any instances available",
    "not enough free gpus",
    "no instances currently available",
)
_GONE_PHRASES = ("pod not found", "not found to terminate", "pod does not exist")
_BID_PHRASES = ("bid",)
_UNAVAILABLE_STOCK = (None, "", "None")
_STOCK_RANK = {"High": 0, "Medium": 1, "Low": 2}  # gpuhunt drops null; the API may also say the string "None"


class RunPodProvider(ApiProvider):
    """RunPod pods. Offers are GPU types at their lowest current price, one per GPU count."""

    name = "runpod"
    service = SERVICE

    def __init__(self, *, gpu_counts: tuple[int, ...] = DEFAULT_GPU_COUNTS, rest_url: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gpu_counts = gpu_counts
        self._rest_url = rest_url
        self._rest_client: HttpClient | None = None

    def default_base_url(self) -> str:
        return runpod_base_url()

    @property
    def rest(self) -> HttpClient:
        """The REST API client (same key), used only as the stop/terminate fallback."""
        if self._rest_client is None:
            key = self._api_key or resolve_key(self.name).value
            kwargs: dict[str, Any] = {"policy": self._policy, "read_timeout_s": self._read_timeout_s}
            if self._sleep is not None:
                kwargs["sleep"] = self._sleep
            self._rest_client = HttpClient(self._rest_url or runpod_rest_url(), api_key=key,
                                           service=SERVICE, **kwargs)
        return self._rest_client

    def _graphql(self, document: str, variables: Mapping[str, Any] | None, *, what: str,
                 idempotent: bool = True) -> dict[str, Any]:
        resp = self.http.request("POST", "/graphql", json_body={"query": document, "variables": variables or {}},
                                 idempotent=idempotent, what=what)
        body = resp.body
        if isinstance(body, Mapping) and body.get("errors"):
            raise graphql_error(body["errors"], what=what)
        if not resp.ok:
            raise ProviderError(f"RunPod {what}: HTTP {resp.status}", hint="try again later")
        if not isinstance(body, Mapping):
            raise ProviderError(f"RunPod {what}: the answer was not JSON")
        data = body.get("data")
        return dict(data) if isinstance(data, Mapping) else {}

    # -- offers ------------------------------------------------------------------------------------
    def search_offers(self, query: Query | None = None, *, spot: bool = False, limit: int = 50,
                      order: str = "dph_total", disk_gb: float | None = None) -> list[Offer]:
        # disk_gb: RunPod's GPU price does not include the container disk, so it changes nothing here.
        counts = _counts_for(query, self.gpu_counts)
        offers: list[Offer] = []
        for count in counts:
            data = self._graphql(GPU_TYPES_QUERY, {"lowestPriceInput": {"gpuCount": count}}, what="gpuTypes")
            for item in data.get("gpuTypes") or []:
                offer = parse_gpu_type(item, count)
                if offer is None or (spot and offer.spot_price_per_hour_usd is None):
                    continue
                if query is not None and not query.matches(offer.query_record()):
                    continue
                offers.append(offer)
        return sort_offers(offers, order)[: max(0, limit)]

    # -- lifecycle ---------------------------------------------------------------------------------
    def create(self, spec: LaunchSpec) -> Instance:
        pub = spec.ssh_public_key.strip()
        env = [{"key": k, "value": str(v)} for k, v in spec.env.items() if k not in ("PUBLIC_KEY", "SSH_PUBLIC_KEY")]
        # PUBLIC_KEY is what official images' /start.sh writes to authorized_keys (runpod/docs:
        # pods/references/environment-variables.mdx); SSH_PUBLIC_KEY is the documented per-pod
        # override (pods/configuration/use-ssh.mdx). Both, so either kind of image takes the key.
        env.append({"key": "PUBLIC_KEY", "value": pub})
        env.append({"key": "SSH_PUBLIC_KEY", "value": pub})
        payload: dict[str, Any] = {
            "name": spec.label,
            "imageName": spec.image,
            "cloudType": spec.cloud_type,
            "gpuTypeId": spec.gpu_name,
            "gpuCount": spec.gpu_count,
            "volumeInGb": 0,
            "containerDiskInGb": spec.disk_gb,
            "minVcpuCount": 1,
            "minMemoryInGb": 1,
            "startSsh": True,
            "supportPublicIp": True,
            "ports": ",".join(p.replace(" ", "") for p in spec.ports),
            "env": env,
        }
        if spec.network_volume_id:  # field names as runpod-python's pod deployment mutation sends them
            payload["networkVolumeId"] = spec.network_volume_id
            payload["dataCenterId"] = spec.data_center_id
        if spec.spot:
            payload["bidPerGpu"] = spec.bid_per_gpu_usd
            document, root = CREATE_SPOT, "podRentInterruptable"
        else:
            document, root = CREATE_ON_DEMAND, "podFindAndDeployOnDemand"
        try:
            data = self._graphql(document, {"input": payload}, what=root, idempotent=False)
        except RequestMaybeSent as exc:
            raise CreateAnswerLost(f"RunPod {root}: {exc.message}", label=spec.label) from None
        except (NoCapacityError, AuthError, NetworkError):
            raise
        except ProviderError as exc:
            if spec.spot and not any(p in exc.message.lower() for p in _BID_PHRASES):
                raise SpotRefusedError(
                    f"RunPod refused the spot (interruptible) pod: {exc.message}",
                    hint="launch on-demand (drop --spot) or use vast.ai bids (--provider vast --spot)") from None
            raise
        pod = data.get(root)
        if not isinstance(pod, Mapping) or not pod.get("id"):
            raise ProviderError(f"RunPod {root} returned no pod id")
        return Instance(provider=self.name, instance_id=str(pod["id"]), label=spec.label,
                        state=InstanceState.PENDING, ssh_host=None, ssh_port=None, ssh_user=self.ssh_user,
                        price_per_hour_usd=None, gpu_name=spec.gpu_name, gpu_count=spec.gpu_count,
                        raw_status="created")

    def get(self, instance_id: str) -> Instance:
        data = self._graphql(POD_QUERY, {"podId": instance_id}, what="pod")
        pod = data.get("pod")
        if not isinstance(pod, Mapping):
            raise InstanceNotFound(f"RunPod has no pod {instance_id}")
        return parse_pod(pod, ssh_user=self.ssh_user)

    def list_instances(self) -> list[Instance]:
        data = self._graphql(PODS_QUERY, None, what="myself.pods")
        me = data.get("myself") or {}
        pods = me.get("pods") if isinstance(me, Mapping) else None
        out = [parse_pod(p, ssh_user=self.ssh_user) for p in pods or [] if isinstance(p, Mapping)]
        return [i for i in out if i.label and i.label.startswith(LABEL_PREFIX)]

    def terminate(self, instance_id: str) -> None:
        try:
            self._graphql(TERMINATE_MUTATION, {"podId": instance_id}, what="podTerminate")
        except InstanceNotFound:
            log.info("RunPod pod %s already gone", instance_id)
        except (AuthError, NetworkError):
            raise
        except ProviderError as exc:
            log.warning("RunPod podTerminate failed (%s); trying the REST API", exc.message)
            self._rest_call("DELETE", f"/pods/{_safe_pod_id(instance_id)}", what="delete pod", gone_ok=True)

    def stop(self, instance_id: str) -> None:
        try:
            self._graphql(STOP_MUTATION, {"podId": instance_id}, what="podStop")
        except (InstanceNotFound, AuthError, NetworkError):
            raise
        except ProviderError as exc:
            log.warning("RunPod podStop failed (%s); trying the REST API", exc.message)
            self._rest_call("POST", f"/pods/{_safe_pod_id(instance_id)}/stop", what="stop pod", gone_ok=False)

    def _rest_call(self, method: str, path: str, *, what: str, gone_ok: bool) -> None:
        resp = self.rest.request(method, path, idempotent=True, what=what)
        if resp.status == 404:
            if gone_ok:
                return
            raise InstanceNotFound(f"RunPod REST {what}: no such pod")
        if not resp.ok:
            raise ProviderError(f"RunPod REST {what} failed: HTTP {resp.status} {_short(resp.text)}")

    # -- account (read-only) -----------------------------------------------------------------------
    def _myself(self) -> Mapping[str, Any]:
        me = self._graphql(USER_QUERY, None, what="myself").get("myself")
        return me if isinstance(me, Mapping) else {}

    def balance_usd(self) -> float | None:
        return as_number(self._myself().get("clientBalance"))

    def account_has_ssh_key(self, public_key: str) -> bool | None:
        keys = self._myself().get("pubKey")
        if not isinstance(keys, str):
            return None
        return same_key_in(public_key, keys.splitlines())

    def network_volumes(self) -> list[NetworkVolume]:
        """The account's network volumes (``myself.networkVolumes``)."""
        data = self._graphql(VOLUMES_QUERY, None, what="myself.networkVolumes")
        me = data.get("myself") or {}
        items = me.get("networkVolumes") if isinstance(me, Mapping) else None
        return [v for v in (parse_volume(i) for i in items or [] if isinstance(i, Mapping)) if v is not None]

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

    def data_center_for(self, gpu_type_id: str) -> str:
        """The data centre with the most of ``gpu_type_id`` in stock (High, then Medium, then Low; ties
        by id): where a new volume must be for a pod of that GPU to mount it."""
        data = self._graphql(DATA_CENTERS_QUERY, None, what="dataCenters")
        best: tuple[int, str] | None = None
        for dc in data.get("dataCenters") or []:
            if not isinstance(dc, Mapping) or not dc.get("id"):
                continue
            for avail in dc.get("gpuAvailability") or []:
                if not isinstance(avail, Mapping) or str(avail.get("gpuTypeId")) != gpu_type_id:
                    continue
                rank = _STOCK_RANK.get(str(avail.get("stockStatus")))
                if rank is not None and (best is None or (rank, str(dc["id"])) < best):
                    best = (rank, str(dc["id"]))
        if best is None:
            raise NoCapacityError(f"no RunPod data centre has {gpu_type_id} in stock for a new network volume",
                                  hint="try another GPU type, or create the volume in the console and pass its name")
        return best[1]

    def create_volume(self, name: str, size_gb: int, data_center_id: str) -> NetworkVolume:
        """``POST /networkvolumes`` with ``name``, ``size`` (GB) and ``dataCenterId``, the body runpodctl
        sends (internal/api/volumes.go ``CreateNetworkVolume``; docs.runpod.io api-reference
        network-volumes POST). A create whose answer was lost is looked up by name before giving up."""
        body = {"name": name, "size": int(size_gb), "dataCenterId": data_center_id}
        try:
            resp = self.rest.request("POST", "/networkvolumes", json_body=body, idempotent=False,
                                     what="create network volume")
        except RequestMaybeSent as exc:
            for v in self.network_volumes():
                if v.name == name and v.data_center_id == data_center_id:
                    return v
            raise ProviderError(f"RunPod create network volume: {exc.message}; no volume {name} was found after it",
                                hint="check the RunPod console (Storage) before launching again") from None
        if not resp.ok:
            detail = resp.body.get("error") if isinstance(resp.body, Mapping) else None
            raise ProviderError(f"RunPod refused to create network volume {name} ({size_gb} GB in "
                                f"{data_center_id}): HTTP {resp.status} {_short(str(detail or resp.text))}")
        volume = parse_volume(resp.body) if isinstance(resp.body, Mapping) else None
        if volume is None:
            raise ProviderError("RunPod create network volume returned no volume id")
        return volume


def same_key_in(public_key: str, lines: list[str]) -> bool:
    """Whether any OpenSSH key line has the same type and key material (comments ignored)."""
    want = public_key.split()[:2]
    return any(line.split()[:2] == want for line in lines if line.strip())


def _safe_pod_id(value: str) -> str:
    text = str(value)
    if not text or not all(c.isalnum() for c in text):
        raise ProviderError(f"'{text}' is not a RunPod pod id")
    return text


def _short(text: str, limit: int = 120) -> str:
    return " ".join((text or "").split())[:limit]


# ---------------------------------------------------------------------------------------------------
# Parsing: the only place RunPod's raw dicts are read.

def graphql_error(errors: Any, *, what: str) -> ProviderError:
    """The gpucli error for a GraphQL ``errors`` list (capacity, gone, or a plain provider error)."""
    first = errors[0] if isinstance(errors, list) and errors else {}
    message = str(first.get("message") if isinstance(first, Mapping) else first) or "unknown error"
    ext = first.get("extensions") if isinstance(first, Mapping) else None
    code = ext.get("code") if isinstance(ext, Mapping) else None
    low = message.lower()
    if code == "SUPPLY_CONSTRAINT" or any(p in low for p in _NO_CAPACITY_PHRASES):
        return NoCapacityError(f"RunPod has no capacity for this request: {message}",
                               hint="try another GPU type, count or cloud type")
    if any(p in low for p in _GONE_PHRASES):
        return InstanceNotFound(f"RunPod {what}: {message}")
    if code in ("FORBIDDEN", "UNAUTHENTICATED", "UNAUTHORIZED"):
        # A key that may not do this (e.g. a pod-scoped key on another pod): never retried elsewhere.
        return AuthError(f"RunPod refused the key for {what}: {message}")
    suffix = f" [{code}]" if code else ""
    return ProviderError(f"RunPod {what} failed: {message}{suffix}")


@dataclass(frozen=True)
class NetworkVolume:
    """A RunPod network volume: mounted at /workspace of a pod created with it, in its data centre."""

    volume_id: str
    name: str
    size_gb: int | None
    data_center_id: str | None
    created: bool = False  # created by this launch (it stays after the run: it holds the data)

    @property
    def usd_per_month(self) -> float | None:
        return None if self.size_gb is None else volume_usd_per_month(self.size_gb)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.volume_id, "name": self.name, "size_gb": self.size_gb,
                "data_center_id": self.data_center_id, "created": self.created}


def volume_usd_per_month(size_gb: float) -> float:
    """RunPod's monthly price of a network volume of ``size_gb`` (see VOLUME_USD_PER_GB_MONTH)."""
    first = min(size_gb, 1000.0)
    return first * VOLUME_USD_PER_GB_MONTH + max(0.0, size_gb - 1000.0) * VOLUME_USD_PER_GB_MONTH_OVER_1TB


def parse_volume(item: Mapping[str, Any]) -> NetworkVolume | None:
    if not item.get("id"):
        return None
    size = item.get("size")
    return NetworkVolume(volume_id=str(item["id"]), name=str(item.get("name") or item["id"]),
                         size_gb=size if isinstance(size, int) else None,
                         data_center_id=str(item["dataCenterId"]) if item.get("dataCenterId") else None)


def parse_gpu_type(item: Mapping[str, Any], count: int) -> Offer | None:
    """One ``gpuTypes`` entry at ``count`` GPUs -> an Offer, or None when it cannot be rented now."""
    lowest = item.get("lowestPrice")
    if not isinstance(lowest, Mapping):
        return None
    per_gpu = as_number(lowest.get("uninterruptablePrice"))
    if per_gpu is None or per_gpu <= 0 or not item.get("id"):
        return None
    # gpuhunt drops offers with a null stockStatus: RunPod lists a price but has nothing to rent. The
    # API can also answer the string "None" (providers.md §5); that is the same "nothing to rent".
    if "stockStatus" in lowest and lowest.get("stockStatus") in _UNAVAILABLE_STOCK:
        return None
    available = lowest.get("availableGpuCounts")
    if isinstance(available, list) and available and count not in available:
        return None
    max_count = item.get("maxGpuCount")
    if isinstance(max_count, int) and count > max_count:
        return None
    bid = as_number(lowest.get("minimumBidPrice"))
    gpu_id = str(item["id"])
    return Offer(
        provider="runpod", offer_id=f"{gpu_id}|{count}", gpu_name=gpu_id, gpu_count=count,
        vram_gb_per_gpu=float(as_number(item.get("memoryInGb")) or 0.0),
        price_per_hour_usd=per_gpu * count, price_per_gpu_hour_usd=per_gpu,
        spot_price_per_hour_usd=None if bid is None else bid * count,
        gpu_display_name=str(item.get("displayName") or gpu_id),
        stock=lowest.get("stockStatus") if isinstance(lowest.get("stockStatus"), str) else None,
    )


_STATES = {
    "CREATED": InstanceState.PENDING,
    "RESTARTING": InstanceState.PENDING,
    "EXITED": InstanceState.EXITED,
    "PAUSED": InstanceState.STOPPED,
    "TERMINATED": InstanceState.TERMINATED,
    "DEAD": InstanceState.FAILED,
}


def parse_pod(pod: Mapping[str, Any], *, ssh_user: str = "root") -> Instance:
    """A ``pod``/``myself.pods`` entry -> Instance. ``runtime: null`` means not up yet (PENDING)."""
    desired = pod.get("desiredStatus")
    runtime = pod.get("runtime")
    host: str | None = None
    port: int | None = None
    if isinstance(runtime, Mapping):
        for entry in runtime.get("ports") or []:
            if not isinstance(entry, Mapping):
                continue
            if entry.get("privatePort") == 22 and entry.get("isIpPublic") is True and \
                    str(entry.get("type", "tcp")).lower() == "tcp" and entry.get("ip") and entry.get("publicPort"):
                host, port = str(entry["ip"]), int(entry["publicPort"])
                break
    if desired == "RUNNING" or (desired is None and isinstance(runtime, Mapping)):
        state = InstanceState.RUNNING if isinstance(runtime, Mapping) else InstanceState.PENDING
    else:
        state = _STATES.get(str(desired), InstanceState.UNKNOWN)
    machine = pod.get("machine")
    gpu_display = machine.get("gpuDisplayName") if isinstance(machine, Mapping) else None
    runtime_word = "null" if runtime is None else ("up, no public ssh port" if host is None else "up")
    count = pod.get("gpuCount")
    return Instance(
        provider="runpod", instance_id=str(pod.get("id")), label=pod.get("name"), state=state,
        ssh_host=host, ssh_port=port, ssh_user=ssh_user, price_per_hour_usd=as_number(pod.get("costPerHr")),
        gpu_name=gpu_display, gpu_count=count if isinstance(count, int) else None,
        raw_status=f"desiredStatus={desired} runtime={runtime_word}",
    )


def _counts_for(query: Query | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """GPU counts worth asking about: an exact ``num_gpus=N`` narrows it to one request."""
    if query is not None:
        for field, ops in query.filters:
            if field == "num_gpus":
                for op, value in ops:
                    if op == "eq" and isinstance(value, str) and value.isdigit():
                        return (int(value),)
    return default


def sort_offers(offers: list[Offer], order: str) -> list[Offer]:
    """Sort by vastai-style order text over the offers' query records; unknown values sort last."""
    return sort_by_order(offers, order)
