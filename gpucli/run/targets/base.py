"""The one contract every place a run can live implements: this machine, an SSH host, a RunPod pod,
a vast.ai instance. Code outside ``gpucli/run/targets`` asks the registry (``get_target``) and never
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

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.run.records import RunRecord
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

    @property
    def max_price_per_hour_usd(self) -> float: ...

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

    def endpoint(self, host: str | None, identity_file: str | None) -> SshTarget | None:
        return None

    def provisioner(self, catalog: Catalog, run: str, gpu_id: str, n_gpus: int, *, spot: bool,
                    bid_per_gpu_usd: float | None, image: str | None, disk_gb: int,
                    ready_timeout_s: float, ask: OfferAsk | None = None) -> Provisioner | None:
        return None

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
