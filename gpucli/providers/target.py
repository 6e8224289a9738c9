"""The one contract every place a run can live implements: this machine, an SSH host, a RunPod pod,
a vast.ai instance. Code outside ``gpucli/providers`` asks the registry (``get_target``) and never
compares provider names.

``Host`` is what an open target gives: the operations a run needs on its machine. ``LocalHost`` and
``gpucli.ssh.Remote`` both satisfy it, so ``--provider local`` exercises the very code path a pod uses.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpucli.errors import UsageError

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.plan.internode import Link
    from gpucli.providers.api import Billed, Offer
    from gpucli.providers.runpod.api import NetworkVolume
    from gpucli.runs.records import RunRecord
    from gpucli.ssh import CommandResult, DownloadStats, RemoteFile, SshTarget, SyncStats


class Host(Protocol):
    """A connected machine holding a run's folder."""

    host_key: str | None  # the SSH host key seen at connect ("ssh-ed25519 AAAA..."); None locally

    def __enter__(self) -> Host: ...
    def __exit__(self, *exc: object) -> None: ...
    def close(self) -> None: ...
    def run(self, cmd: str, *, timeout_s: float, check: bool = True, input: bytes | None = None) -> CommandResult: ...
    def start_detached(self, cmd: str, *, cwd: str, log_path: str, env_file: str | None = None,
                       timeout_s: float = 30.0) -> int: ...
    def is_running(self, pid: int, *, timeout_s: float = 15.0) -> bool: ...
    def signal(self, pid: int, sig: str = "TERM", *, timeout_s: float = 15.0) -> bool: ...
    def write_file(self, remote_path: str, data: bytes, mode: int = 0o600) -> None: ...
    def write_env_file(self, remote_path: str, env: Mapping[str, str]) -> None: ...
    def read_file(self, remote_path: str) -> bytes: ...
    def exists(self, remote_path: str) -> bool: ...
    def read_from(self, remote_path: str, offset: int, max_bytes: int = 8 << 20) -> tuple[bytes, int]: ...
    def list_files(self, remote_dir: str) -> dict[str, RemoteFile]: ...
    def sync_up(self, local_dir: str | os.PathLike[str], remote_dir: str, *, excludes: Any = None,
                progress: Any = None) -> SyncStats: ...
    def download(self, remote_path: str, local_path: str | os.PathLike[str], *, sha256: str | None = None,
                 progress: Any = None) -> DownloadStats: ...
    def download_files(self, items: Sequence[tuple[str, str | os.PathLike[str], str | None]], *,
                       progress: Any = None) -> list[DownloadStats]: ...


@dataclass(frozen=True)
class Capabilities:
    """What a target can do and how its machines behave, declared once by each target (with the provider
    document that says so) so that code outside ``gpucli/providers`` asks
    ``get_target(record.provider).caps`` instead of comparing provider names or probing attributes.
    ``cloud``, ``needs_gpu`` and ``bootstrap`` stay plain attributes of the target (they came first)."""

    #: The run's host is this machine: no tunnel to it, its disk and GPUs are checked here, its node
    #: agents take free ports here and meet on 127.0.0.1, and it has no SSH endpoint.
    this_machine: bool = False
    #: The user names the machine(s) up front (``--host``, ``--hosts``): several hosts for ``--nodes``,
    #: the link between them measured at launch (``--probe-link``), and ``--on`` reuses the host and key.
    endpoint_given: bool = False
    #: ``--volume``: a provider network volume mounted at the run folder's disk.
    network_volumes: bool = False
    #: Multi-node runs are one provider-managed cluster (RunPod Instant Clusters): its pods cannot be
    #: stopped one by one, so each node's watchdog stops only the run and gpucli deletes the cluster.
    clusters: bool = False
    #: Multi-node runs are separate instances on the provider's overlay network (vast.ai): the machines
    #: are chosen before anything is recorded, each node's address is read on its overlay interface (no
    #: address variables), gloo takes that interface too, and each node's own watchdog ends its instance.
    overlays: bool = False
    #: The most nodes one run may have here (None: no limit of gpucli's or the provider's), and what
    #: those nodes are, for the refusal ("node agents on this machine").
    max_nodes: int | None = None
    nodes_are: str = "nodes"
    #: The interface NCCL must use between nodes, as the provider's docs require (None: NCCL's choice).
    nccl_ifname: str | None = None
    #: Gbit/s between two nodes as the provider publishes it (None: not known, or measured at launch),
    #: and where that figure (or its absence) comes from.
    link_gbps: float | None = None
    link_source: str = ""
    #: A container started again (the provider restarting a stopped instance) runs the run's resume.sh
    #: and continues from its newest checkpoint by itself.
    in_place_resume: bool = False
    #: The provider bills data moved in or out of the pod (a ``--store``'s uploads then cost money);
    #: None: gpucli does not know (an SSH host's network is the user's).
    bills_transfer: bool | None = None
    #: The provider reports per pod what it has billed so far (bandwidth included), and ``billed``
    #: asks it; otherwise the cost is gpucli's meter (elapsed x price).
    provider_billing: bool = False
    #: What a stopped pod keeps and bills, in words (``kept_storage`` gives the figure for a run).
    kept_storage: str = ""
    #: What can still lose that kept disk, in words (shown with ``--on-end stop`` in the launch's plan).
    kept_storage_risk: str = ""
    #: ``--on-end stop`` exists: the pod can be stopped (billing only its disk) and started again.
    stop_supported: bool = False
    #: Spot (interruptible) pods can be rented with ``--spot``.
    spot: bool = False

    def link(self) -> Link:
        """The declared inter-node link (the planner's ``Link``); measured at launch where the machines are
        the user's own (``endpoint_given``)."""
        from gpucli.plan.internode import Link  # lazy: the planner's modules, for multi-node plans only

        return Link(self.link_gbps, self.link_source, probed=self.endpoint_given)


@dataclass(frozen=True)
class PodState:
    """What a cloud provider says about a run's pod, for ``status`` and ``watch`` when SSH cannot reach it."""

    state: str  # running | pending | preempted | exited | failed | gone | unknown
    detail: str  # the provider's own words

    @property
    def over(self) -> bool:
        """The pod no longer runs the run (taken away, exited, failed or deleted)."""
        return self.state in ("preempted", "exited", "failed", "gone")

    @property
    def describe(self) -> str:
        what = {
            "preempted": "pod stopped by the provider (preempted or outbid)",
            "exited": "pod exited",
            "failed": "pod failed on its host",
            "gone": "pod no longer exists",
            "pending": "pod is starting",
            "running": "pod is running but SSH does not answer",
        }.get(self.state, "pod state unknown")
        text = f"{self.state}: {what} ({self.detail})"
        if self.state != "gone":
            text += "; `gpucli down` terminates it"
        return text


@dataclass(frozen=True)
class OfferAsk:
    """What a launch asks of the cloud offers beyond the GPU: its own filters (``--query``, vast query
    words replacing gpucli's default filter of each field they name), the run's planned hours and
    transfer ``(GB up, GB down)`` to rank offers on what the whole run costs, and ``--force`` (keep a
    pod billed more than 5 % above its quote)."""

    query: str | None = None
    hours: float | None = None  # None: ranked on one hour
    transfer_gb: tuple[float, float] = (0.0, 0.0)
    force: bool = False
    offer_id: str | None = None  # this one offer only (a launch across providers tries them one by one)


@dataclass(frozen=True)
class Stray:
    """A gpucli-labelled pod that no active run owns."""

    provider: str
    instance_id: str
    label: str | None
    state: str
    price_per_hour_usd: float | None


class Provisioner(Protocol):
    """A cloud launch's offers and bid, fixed before anything is created; calling it creates the pod
    (``on_created`` gets every pod id before any wait) and returns its SSH endpoint."""

    volume: NetworkVolume | None  # the network volume the pod mounts (--volume), None without one

    @property
    def max_price_per_hour_usd(self) -> float: ...

    @property
    def offers(self) -> Sequence[Offer]:
        """The offers this launch may rent, best first (their $/GB prices the planned bandwidth)."""
        ...

    @property
    def billed_usd_per_hour(self) -> float | None:
        """What the created pod bills per hour, as the provider said right after create (None before)."""
        ...

    def with_workdir(self, workdir: str) -> Provisioner:
        """The same launch knowing the run folder (an in-place resume's start hook runs the run's resume.sh there)."""
        ...

    def __call__(self, *, on_created: Callable[[str], None], on_event: Callable[[str], None],
                 cancelled: Callable[[], bool] = ...) -> SshTarget:
        """``cancelled``: asked before each create and at each poll; True (the run was ended by `gpucli
        down` meanwhile) ends every pod this call made and raises."""
        ...


class Target(Protocol):
    """Where a run lives, and what that place can do for it."""

    name: str  # local | ssh | runpod | vast: the --provider value and the record's provider
    describe: str  # where a run of this target is, in words ("this machine", "a runpod pod")
    cloud: bool  # rents a pod that bills until it is ended
    bootstrap: bool  # the host needs setup_pod.sh (Python packages) before the trainer starts
    needs_gpu: bool  # only GPU profiles can run here
    caps: Capabilities  # what it can do: asked instead of its name
    default_image: str  # the image a pod starts from ("" where nothing is rented)
    min_cuda: str | None  # the CUDA the default image needs of a host's driver (None: no image)

    def default_workdir(self, run: str) -> str: ...
    def default_python(self) -> str: ...
    def open(self, record: RunRecord, *, connect_timeout_s: float = 20.0) -> Host: ...

    def endpoint(self, host: str | None, identity_file: str | None) -> SshTarget | None:
        """The SSH endpoint a launch names up front (``--host``); None where there is none yet or at all.
        Raises a UsageError for a missing or malformed ``--host`` where one is needed."""
        ...

    def interactive_shell(self, record: RunRecord) -> tuple[list[str], str | None]:
        """The argv of an interactive shell in the run's folder, and the folder to start it in locally."""
        ...

    def provisioner(self, catalog: Catalog, run: str, gpu_id: str, n_gpus: int, *, spot: bool,
                    bid_per_gpu_usd: float | None, image: str | None, disk_gb: int,
                    ready_timeout_s: float, ask: OfferAsk | None = None) -> Provisioner | None:
        """None where there is nothing to rent (local, ssh)."""
        ...

    def choose_offers(self, catalog: Catalog, gpu_id: str, n_gpus: int, *, spot: bool, limit: int = 5,
                      disk_gb: int | None = None, hours: float | None = None,
                      transfer_gb: tuple[float, float] = (0.0, 0.0), query: str | None = None) -> list[Offer]:
        """Live offers of exactly ``n_gpus`` of that GPU, ranked on what the run would cost on each
        (``cloud`` targets); a UsageError where nothing is rented."""
        ...

    def balance_usd(self) -> float | None:
        """The account's balance as the provider reports it; None where it reports none (or nothing is
        rented). API errors propagate as ProviderError."""
        ...

    def with_volume(self, provision: Provisioner, name_or_id: str, *, size_gb: int | None = None,
                    volume_id: str | None = None) -> Provisioner:
        """``--volume`` (``caps.network_volumes``): the provisioner creating its pod with that network
        volume, looked up (or, with ``size_gb``, created) now; ``volume_id``: the one an earlier launch of
        the run used (a resume). A UsageError where there are no network volumes."""
        ...

    def cluster_volume(self, name_or_id: str, *, size_gb: int | None, gpu_type: str, gpus_per_pod: int,
                       volume_id: str | None = None) -> NetworkVolume:
        """The network volume every node of a rented cluster mounts (``caps.clusters``): ``volume_id``'s
        while it exists, else the account's of that name or id, else one created with ``size_gb``. A
        UsageError where nodes are not rented as one cluster."""
        ...

    def terminate(self, record: RunRecord) -> bool:
        """End the run's pod and any other pod carrying its label; False where there is no pod."""
        ...

    def terminate_alive(self, record: RunRecord) -> list[str]:
        """After a failed launch: end what is left of the run's pods; the ids ended."""
        ...

    def pod_state(self, record: RunRecord) -> PodState | None:
        """The provider's view of the run's pod; None where there is none. API errors propagate."""
        ...

    def strays(self, owned: set[str]) -> list[Stray]:
        """gpucli-labelled pods of this provider whose ids are not in ``owned``."""
        ...

    def end_stray(self, instance_id: str) -> None: ...

    def pod_api_env(self) -> dict[str, str]:
        """The API endpoints the pod-side watchdog calls, as its env file's variables ({} without a pod)."""
        ...

    def billed(self, record: RunRecord) -> Billed | None:
        """What the provider says the run's pod has billed so far; None where it does not say."""
        ...

    def contract_note(self, record: RunRecord, *, now_epoch_s: float) -> str | None:
        """The live pod's rental end and price changes in one line; None where there are no such terms."""
        ...

    def kept_storage(self, record: RunRecord) -> tuple[float, str] | None:
        """What the run's ended pod or volume keeps billing per month, and what; None: nothing kept."""
        ...


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_file_text(env: Mapping[str, str]) -> bytes:
    """``KEY='value'`` lines for a 0600 env file that a shell sources with ``set -a``."""
    lines = []
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"not an environment variable name: {key!r}")
        lines.append(f"{key}={shlex.quote(value)}\n")
    return "".join(lines).encode()


class NoPod:
    """The cloud half of the contract for targets that rent nothing (local, ssh)."""

    cloud = False
    needs_gpu = False
    default_image = ""
    min_cuda: str | None = None

    def endpoint(self, host: str | None, identity_file: str | None) -> SshTarget | None:
        return None

    def provisioner(self, catalog: Catalog, run: str, gpu_id: str, n_gpus: int, *, spot: bool,
                    bid_per_gpu_usd: float | None, image: str | None, disk_gb: int,
                    ready_timeout_s: float, ask: OfferAsk | None = None) -> Provisioner | None:
        return None

    def choose_offers(self, catalog: Catalog, gpu_id: str, n_gpus: int, *, spot: bool, limit: int = 5,
                      disk_gb: int | None = None, hours: float | None = None,
                      transfer_gb: tuple[float, float] = (0.0, 0.0), query: str | None = None) -> list[Offer]:
        raise UsageError("offers are a cloud provider's: nothing is rented here")

    def balance_usd(self) -> float | None:
        return None

    def with_volume(self, provision: Provisioner, name_or_id: str, *, size_gb: int | None = None,
                    volume_id: str | None = None) -> Provisioner:
        raise UsageError("--volume is a cloud provider's network volume: nothing is rented here")

    def cluster_volume(self, name_or_id: str, *, size_gb: int | None, gpu_type: str, gpus_per_pod: int,
                       volume_id: str | None = None) -> NetworkVolume:
        raise UsageError("nothing is rented here: the nodes are this machine or your own hosts")

    def terminate(self, record: RunRecord) -> bool:
        return False

    def terminate_alive(self, record: RunRecord) -> list[str]:
        return []

    def pod_state(self, record: RunRecord) -> PodState | None:
        return None

    def strays(self, owned: set[str]) -> list[Stray]:
        return []

    def end_stray(self, instance_id: str) -> None:
        return None

    def pod_api_env(self) -> dict[str, str]:
        return {}

    def billed(self, record: RunRecord) -> Billed | None:
        return None

    def contract_note(self, record: RunRecord, *, now_epoch_s: float) -> str | None:
        return None

    def kept_storage(self, record: RunRecord) -> tuple[float, str] | None:
        return None
