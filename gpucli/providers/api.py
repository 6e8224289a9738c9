"""The provider contract: what every cloud client gives the launcher, and what it promises.

A provider is one file (``runpod.py``, ``vast.py``, later ``local.py``/``ssh.py``) with one class that
subclasses :class:`Provider`, plus one line in the registry (``providers/__init__.py``).

Contract (every implementation keeps these promises; the launcher relies on them):

* **Typed values only.** Methods take and return the frozen dataclasses below. Raw API dicts never
  leave the provider module that parsed them; units are in the field names.
* **create() does not wait.** It returns as soon as the provider has given an id, so the caller can
  record the id *before* any wait (a crash or Ctrl-C after that can still find and end the pod).
* **Every pod is labelled** ``gpucli-<run>`` (:attr:`LaunchSpec.label`) so strays can be listed with
  :meth:`Provider.list_instances` and recovered with :meth:`Provider.find_by_label` when a create
  call's answer was lost.
* **gpucli's own SSH key reaches the pod** at create time (RunPod ``PUBLIC_KEY`` and
  ``SSH_PUBLIC_KEY``; vast.ai: the key is registered on the account before creating, because new
  instances take the account's keys, with a per-instance attach retried as a second path).
* **A bid is never silently turned into on-demand billing.** ``spot=True`` without a bid is an error,
  and a spot create always sends the bid (vast ``price``, RunPod ``bidPerGpu``).
* **terminate() is idempotent and returns ASAP.** "Already gone" answers are success; it never waits
  for the pod to disappear.
* **Errors are the gpucli family.** Capacity problems raise ``NoCapacityError``; an answer that may
  have been lost after the provider acted raises :class:`CreateAnswerLost`; everything else from the
  API is a ``ProviderError`` whose message never contains a key.
* **Ambiguity is resolved by the caller.** Providers never retry a non-idempotent create on their own
  (that is how duplicate paid pods happen); :mod:`gpucli.providers.provision` does the bounded
  retry/cleanup loop.
"""

from __future__ import annotations

import enum
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpucli.errors import NotFoundError, ProviderError, UsageError

if TYPE_CHECKING:
    from gpucli.providers.query import Query

LABEL_PREFIX = "gpucli-"
#: The disk a launch creates unless told otherwise (``gpucli launch --disk``). Searches that are not
#: told the disk price storage at this size, so a default launch is never under-quoted on vast.ai.
DEFAULT_LAUNCH_DISK_GB = 50
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class InstanceState(enum.Enum):
    """Provider-neutral lifecycle state. Each provider maps its own status words onto these."""

    PENDING = "pending"  # accepted, image pulling / scheduling; not yet reachable
    RUNNING = "running"  # container up (ssh endpoint may still be missing: check Instance.ssh_ready)
    STOPPED = "stopped"  # stopped by us, preempted, or outbid; storage may still bill
    EXITED = "exited"  # container ended on its own (crash)
    FAILED = "failed"  # host offline/unhealthy; will not recover
    TERMINATED = "terminated"  # gone
    UNKNOWN = "unknown"  # no heartbeat / a status word we do not know

    @property
    def is_dead(self) -> bool:
        """States from which a pod never becomes usable for this launch: terminate and move on."""
        return self in (InstanceState.STOPPED, InstanceState.EXITED, InstanceState.FAILED,
                        InstanceState.TERMINATED, InstanceState.UNKNOWN)


@dataclass(frozen=True)
class Offer:
    """One rentable machine shape at the moment of the search (prices are quotes, not promises)."""

    provider: str
    offer_id: str
    gpu_name: str  # the provider's own name, as create() needs it ("NVIDIA GeForce RTX 4090", "RTX 4090")
    gpu_count: int
    vram_gb_per_gpu: float
    price_per_hour_usd: float  # whole machine, on-demand
    price_per_gpu_hour_usd: float
    spot_price_per_hour_usd: float | None = None  # minimum bid for the whole machine
    reliability: float | None = None  # 0..1
    inet_down_mbps: float | None = None
    inet_up_mbps: float | None = None
    location: str | None = None
    dlperf: float | None = None
    cuda_max: float | None = None
    #: The newest CUDA the host's driver runs, as the provider wrote it ("12.8"; RunPod's strings may read
    #: "12.10", above "12.4" though not as a decimal): compare with :func:`cuda_at_least`.
    cuda_version: str | None = None
    disk_gb: float | None = None
    gpu_display_name: str | None = None  # short marketing name ("RTX 4090") used by queries
    machine_id: str | None = None  # vast machine id; RunPod has none at search time
    host_id: str | None = None
    stock: str | None = None  # RunPod availability ("HIGH", "LOW", ...)
    verified: bool | None = None
    cloud_type: str | None = None  # RunPod SECURE | COMMUNITY: pinned at create (prices differ per cloud)
    data_center_id: str | None = None  # RunPod: the data centre with the GPU count in stock, pinned at create
    storage_usd_per_hour: float = 0.0  # disks, already inside price_per_hour_usd (and the spot quote)
    inet_up_usd_per_gb: float | None = None  # vast inet_up_cost: data leaving the host (checkpoints home)
    inet_down_usd_per_gb: float | None = None  # vast inet_down_cost: data reaching the host (code, data)

    def transfer_usd(self, up_gb: float, down_gb: float) -> float:
        """What moving ``up_gb`` to the host and ``down_gb`` back costs on this offer ($/GB prices)."""
        return up_gb * (self.inet_down_usd_per_gb or 0.0) + down_gb * (self.inet_up_usd_per_gb or 0.0)

    @property
    def spot_price_per_gpu_hour_usd(self) -> float | None:
        if self.spot_price_per_hour_usd is None or self.gpu_count <= 0:
            return None
        return self.spot_price_per_hour_usd / self.gpu_count

    def query_record(self) -> dict[str, Any]:
        """This offer in vast.ai's field vocabulary and units, for :meth:`Query.matches`.

        Only known values are included, so a query on a field this provider does not report is
        skipped rather than failing every offer (see ``Query.matches(missing_ok=...)``).
        """
        vram_mb = self.vram_gb_per_gpu * 1024  # vast gpu_ram is MiB-ish ("24576" for 24 GB)
        rec: dict[str, Any] = {
            "gpu_name": self.gpu_display_name or self.gpu_name,
            "num_gpus": self.gpu_count,
            "gpu_ram": vram_mb,
            "gpu_total_ram": vram_mb * self.gpu_count,
            "dph_total": self.price_per_hour_usd,
        }
        optional = {
            "min_bid": self.spot_price_per_hour_usd, "reliability": self.reliability,
            "inet_down": self.inet_down_mbps, "inet_up": self.inet_up_mbps,
            "geolocation": self.location, "dlperf": self.dlperf, "cuda_max_good": self.cuda_version or self.cuda_max,
            "disk_space": self.disk_gb, "verified": self.verified,
            "machine_id": self.machine_id, "host_id": self.host_id,
        }
        rec.update({k: v for k, v in optional.items() if v is not None})
        if self.dlperf is not None and self.price_per_hour_usd > 0:
            rec["dlperf_per_dphtotal"] = self.dlperf / self.price_per_hour_usd
        return rec


@dataclass(frozen=True)
class LaunchSpec:
    """What to create. ``env`` is for non-secret values only: it is visible in the provider console."""

    name: str  # the run name; the pod's label becomes gpucli-<name>
    gpu_name: str  # provider's GPU name (RunPod gpuTypeId); vast uses offer_id instead
    gpu_count: int
    image: str
    disk_gb: int
    ssh_public_key: str
    spot: bool = False
    bid_per_gpu_usd: float | None = None
    offer_id: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    ports: tuple[str, ...] = ("22/tcp",)
    cloud_type: str | None = None  # RunPod: SECURE | COMMUNITY (the offer's: never left to RunPod)
    network_volume_id: str | None = None  # RunPod: a network volume mounted at mount_path
    data_center_id: str | None = None  # RunPod: the offer's (or the volume's) data centre
    volume_gb: int | None = None  # RunPod: the volume disk holding the run folder (kept by a stop)
    mount_path: str = "/workspace"  # where the volume disk or network volume is mounted, always sent
    min_cuda: str | None = None  # the lowest host CUDA version the image needs ("12.4")
    onstart: str | None = None  # run at every container start (vast onstart, RunPod args): resume.sh
    boot_guard: str | None = None  # a sh line run first at container start: gpucli.providers.bootguard

    def __post_init__(self) -> None:
        if not _RUN_NAME.match(self.name):
            raise UsageError(f"run name '{self.name}' must be 1-63 letters, digits, '.', '_' or '-'")
        if self.gpu_count < 1:
            raise UsageError(f"gpu_count must be at least 1, got {self.gpu_count}")
        if self.disk_gb < 1:
            raise UsageError(f"disk_gb must be at least 1, got {self.disk_gb}")
        if not self.ssh_public_key.strip().startswith(("ssh-", "ecdsa-", "sk-")):
            raise UsageError("ssh_public_key must be an OpenSSH public key line")
        if self.spot and (self.bid_per_gpu_usd is None or self.bid_per_gpu_usd <= 0):
            # The money-safety rule: a spot request without a bid must never become on-demand.
            raise UsageError("a spot launch needs a bid per GPU (bid_per_gpu_usd > 0)")
        if not self.spot and self.bid_per_gpu_usd is not None:
            raise UsageError("bid_per_gpu_usd is only meaningful with spot=True")

    @property
    def label(self) -> str:
        return LABEL_PREFIX + self.name

    @property
    def bid_per_hour_usd(self) -> float | None:
        """The whole-machine bid (vast ``price``), or None for on-demand."""
        return None if self.bid_per_gpu_usd is None else self.bid_per_gpu_usd * self.gpu_count


@dataclass(frozen=True)
class SshRoute:
    """One way to reach a pod's sshd: vast.ai gives an instance a direct route (its public IP and
    mapped port) and a proxy route (``sshN.vast.ai``), tried in that order."""

    host: str
    port: int
    via: str  # "direct" | "proxy": for messages

    def __str__(self) -> str:
        return f"{self.via} {self.host}:{self.port}"


@dataclass(frozen=True)
class Instance:
    """A pod as the provider reports it right now. ``ssh_host``/``ssh_port`` is the route in use:
    the first of ``ssh_routes`` until a readiness wait found which one answers."""

    provider: str
    instance_id: str
    label: str | None
    state: InstanceState
    ssh_host: str | None
    ssh_port: int | None
    ssh_user: str
    price_per_hour_usd: float | None
    gpu_name: str | None
    gpu_count: int | None
    raw_status: str  # the provider's own status words, for messages ("status=RUNNING runtime=null")
    data_center_id: str | None = None
    cloud_type: str | None = None
    stopped_usd_per_month: float | None = None  # what it bills per month while stopped (its kept disk)
    ssh_routes: tuple[SshRoute, ...] = ()  # every route the provider offers, best first (vast: direct, proxy)
    #: The container runs and the provider publishes no SSH port for it (RunPod: ``runtime`` up without a
    #: public 22/tcp): a host without a public IP, which full SSH needs (pods/configuration/use-ssh.mdx).
    ssh_unexposed: bool = False

    def routes(self) -> tuple[SshRoute, ...]:
        """The routes to try: the provider's list, else the one endpoint it gave."""
        if self.ssh_routes:
            return self.ssh_routes
        if self.ssh_host and self.ssh_port:
            return (SshRoute(self.ssh_host, self.ssh_port, "ssh"),)
        return ()

    def via(self, route: SshRoute) -> Instance:
        """This pod reached through ``route``."""
        return replace(self, ssh_host=route.host, ssh_port=route.port)

    @property
    def ssh_ready(self) -> bool:
        """Running and with a public SSH endpoint (SSH itself may still refuse for a moment)."""
        return self.state is InstanceState.RUNNING and bool(self.ssh_host) and bool(self.ssh_port)

    @property
    def is_ours(self) -> bool:
        return bool(self.label) and str(self.label).startswith(LABEL_PREFIX)


@dataclass(frozen=True)
class Billed:
    """What the provider says a pod has been billed so far (vast.ai's charges: compute, storage and
    the bandwidth it bills per byte)."""

    total_usd: float
    bandwidth_usd: float = 0.0  # data moved in and out, inside total_usd


@dataclass(frozen=True)
class Contract:
    """A rental's terms that can change under a run: when it ends (vast stops an instance at its rental
    end date, faq/instances.mdx L13) and a higher price the host asks that is not accepted (vast-cli
    vastai/api/price_increase.py: pending increases are accepted per contract, never by gpucli)."""

    ends_at_epoch_s: float | None = None
    price_increase: str | None = None  # "GPU $0.400/h -> $0.520/h", not accepted


class InstanceNotFound(ProviderError):
    """The provider does not know this instance id (never created, or already gone)."""

    exit_code = NotFoundError.exit_code


class CreateAnswerLost(ProviderError):
    """A create request was sent but its answer was lost: the pod may exist. Find it by label."""

    def __init__(self, message: str, *, label: str | None = None) -> None:
        super().__init__(message, hint="gpucli looks the pod up by its label before creating another")
        self.label = label


class TerminatePending(ProviderError):
    """A terminate the provider did not confirm: the pod may still bill. The run's record says
    "terminate pending"; ``gpucli ls``, ``status`` and ``down`` show it and ``down`` retries it."""

    def __init__(self, message: str, *, instance_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint="the pod may still bill: `gpucli down RUN` tries again "
                                       "(or end it in the provider console)")
        self.instance_ids = instance_ids


#: The record status of a run whose pod's terminate was not confirmed by the provider.
TERMINATE_PENDING = "terminate pending"  # gpucli.runs.records.RunState.TERMINATE_PENDING: a run whose pod is not yet confirmed gone


class SpotRefusedError(ProviderError):
    """The provider refused an interruptible (spot) pod outright. Never turned into on-demand."""


class UnsupportedOperation(ProviderError):
    """The provider cannot do this (e.g. stop on a provider without stop)."""


class Provider(ABC):
    """One cloud. Subclasses implement the abstract methods and keep the module docstring's promises."""

    name: str = ""

    @abstractmethod
    def search_offers(self, query: Query | None = None, *, spot: bool = False, limit: int = 50,
                      order: str = "dph_total", disk_gb: float | None = None) -> list[Offer]:
        """Live offers matching ``query`` (vast.ai query language), best first by ``order``.

        ``order`` uses the vastai ``--order`` syntax (``dph_total``, ``dlperf_usd-``). gpucli's default
        is cheapest first (the vastai CLI's is ``score-``). ``spot`` asks for interruptible pricing.
        ``disk_gb`` is the disk the launch will create: where the provider prices storage into the
        hourly rate (vast ``allocated_storage``) the quote then equals what is billed.
        """

    @abstractmethod
    def create(self, spec: LaunchSpec) -> Instance:
        """Create one pod and return as soon as it has an id. Never waits for it to be up.

        Raises ``NoCapacityError`` when the offer is gone, :class:`CreateAnswerLost` when the request
        may have created a pod whose id we did not get, ``ProviderError`` otherwise.
        """

    @abstractmethod
    def get(self, instance_id: str) -> Instance:
        """The pod's current state. Raises :class:`InstanceNotFound` when the provider has no such pod."""

    @abstractmethod
    def list_instances(self) -> list[Instance]:
        """All pods of this account labelled ``gpucli-*`` (ours); other pods are never returned."""

    def find_by_label(self, label: str) -> Instance | None:
        """The newest of our pods carrying exactly ``label``, or None. Used after a lost create answer."""
        found = [i for i in self.list_instances() if i.label == label and i.state is not InstanceState.TERMINATED]
        return found[-1] if found else None

    @abstractmethod
    def terminate(self, instance_id: str) -> None:
        """End the pod and its billing. Idempotent (an unknown/gone pod is success); returns ASAP."""

    def stop(self, instance_id: str) -> None:
        """Stop without deleting (storage may still bill). Not every provider supports it."""
        raise UnsupportedOperation(f"{self.name} cannot stop pods; use terminate")

    def start(self, instance_id: str) -> Instance | None:
        """Start a stopped pod again on its host (its start command runs again). Returns as soon as the
        provider took the call; the caller waits for SSH. Not every provider supports it."""
        raise UnsupportedOperation(f"{self.name} cannot start stopped pods")

    def billed(self, instance_id: str, since_epoch_s: float) -> Billed | None:
        """What the pod created at ``since_epoch_s`` has been billed so far, where the provider reports
        it per pod (None: it does not). Read-only."""
        return None

    def contract(self, instance_id: str) -> Contract | None:
        """The pod's rental terms where they can end or change under a run (vast), else None. Read-only."""
        return None

    def balance_usd(self) -> float | None:
        """The account's credit in USD where the API reports it, else None. Read-only."""
        return None

    def account_has_ssh_key(self, public_key: str) -> bool | None:
        """Whether the account's SSH keys include ``public_key`` (None: the API does not say). Read-only."""
        return None

    def __repr__(self) -> str:  # never show keys or sessions
        return f"<{type(self).__name__} {self.name}>"


def cuda_at_least(version: str | float | None, floor: str | None) -> bool:
    """Whether a host CUDA version reaches ``floor``, compared per component ("12.10" > "12.4"); an
    unknown version or no floor passes (the provider's own filter was asked for it)."""
    if version is None or not floor:
        return True
    have = tuple(int(p) for p in re.findall(r"\d+", str(version)))
    want = tuple(int(p) for p in re.findall(r"\d+", floor))
    return have >= want


def offer_host(offer: Offer) -> str | None:
    """The machine behind an offer, as narrowly as its provider names it, or None when it names none: a
    vast offer its ``machine_id`` (search_offers.yaml); a RunPod offer names no machine, so its GPU type,
    cloud and data centre (the offer id gpucli composes from REST v2 ``gpuTypeIds``, ``cloudType`` and
    ``dataCenterIds``), the narrowest group a create can avoid."""
    if offer.machine_id:
        return offer.machine_id
    if offer.provider == "runpod" and offer.offer_id.count("|") == 3:
        gpu, _count, cloud, dc = offer.offer_id.split("|")
        return f"{gpu}|{cloud}|{dc}"
    return None
