"""One node of a run as data: its rank, its folder on its machine, and how the others reach it; and what
renting and measuring the nodes read of a launch (Protocols the launch's own types satisfy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpucli.plan.catalog import ModelShape
    from gpucli.runs.limits import Limits
    from gpucli.runs.records import PlannedSpeed
    from gpucli.ssh import SshTarget


@dataclass(frozen=True)
class NodeSpec:
    rank: int
    workdir: str
    ssh: SshTarget | None
    address: str  # where the other nodes reach this one


def node_workdir(workdir: str, rank: int) -> str:
    return workdir if rank == 0 else f"{workdir}-node{rank}"


class NodesRequest(Protocol):
    """What a run over several machines reads of the launch as asked (:class:`gpucli.run.inputs.launch.LaunchRequest`,
    which sits above this module: typed by what is read, checked against it wherever one is passed)."""

    @property
    def provider(self) -> str: ...
    @property
    def nodes(self) -> int: ...
    @property
    def hosts(self) -> tuple[str, ...]: ...
    @property
    def host(self) -> str | None: ...
    @property
    def identity(self) -> str | None: ...
    @property
    def link_gbps(self) -> float | None: ...
    @property
    def probe_link(self) -> bool: ...
    @property
    def spot(self) -> bool: ...
    @property
    def volume(self) -> str | None: ...
    @property
    def image(self) -> str | None: ...
    @property
    def disk_gb(self) -> int | None: ...
    @property
    def query(self) -> str | None: ...
    @property
    def ready_timeout_s(self) -> float | None: ...


class NodesResolved(Protocol):
    """What it reads of the launch as resolved (:class:`gpucli.run.inputs.launch.ResolvedLaunch`)."""

    @property
    def name(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def gpu_id(self) -> str | None: ...
    @property
    def n_gpus(self) -> int: ...
    @property
    def python(self) -> str: ...
    @property
    def model(self) -> ModelShape: ...
    @property
    def micro_batch(self) -> int: ...
    @property
    def grad_accum(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def planned(self) -> PlannedSpeed: ...
    @property
    def planned_one(self) -> PlannedSpeed | None: ...
    @property
    def label(self) -> str: ...
    @property
    def pod_disk_gb(self) -> int: ...
    @property
    def price_per_hour_usd(self) -> float | None: ...


class NodesPrepared(Protocol):
    """A launch ready to go, as renting and measuring the nodes read it (:class:`gpucli.run.life.lifecycle.PreparedLaunch`)."""

    @property
    def request(self) -> NodesRequest: ...
    @property
    def resolved(self) -> NodesResolved: ...
