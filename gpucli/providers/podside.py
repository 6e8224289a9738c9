"""What the pod-side watchdog gets from the launch, and how a run's own end is read on this side.

The watchdog (gpucli/pod/watchdog.py) is standard library only and cannot import gpucli: the launch
writes it a 0600 env file (``watchdog.env``) with gpucli's version (its User-Agent) and the API
endpoints this machine uses. Real pods carry no ``RUNPOD_API_BASE_URL`` / ``VAST_URL``, so without
the file a watchdog would always call the public endpoints - right for real pods, wrong for a test
emulator or a proxy the user configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucli import __version__
from gpucli.providers.registry import get_target
from gpucli.providers.runpod.clusters import v2_base_url

if TYPE_CHECKING:
    from gpucli.providers.target import Host


def watchdog_env(provider: str, cluster_id: str | None = None) -> dict[str, str]:
    """The watchdog's env file: gpucli's version and the target's API endpoints (no key: the watchdog
    uses the pod's own scoped key from the pod's PID 1 environment); for rank 0 of a RunPod Instant
    Cluster, the cluster's id (its watchdog tries to delete the cluster when the run is over)."""
    env = {"GPUCLI_VERSION": __version__, **get_target(provider).pod_api_env()}
    if cluster_id:  # its nodes run as "ssh" hosts: the cluster's v2 endpoint is said here (gpucli/pod/podend.py)
        env["GPUCLI_RUNPOD_CLUSTER_ID"] = cluster_id
        env["GPUCLI_RUNPOD_CLUSTER_API_URL"] = v2_base_url()
    return env


def write_watchdog_env(host: Host, workdir: str, provider: str, cluster_id: str | None = None) -> str:
    """Write ``<workdir>/watchdog.env`` on the host; returns its path (for ``start_detached``)."""
    path = f"{workdir}/watchdog.env"
    host.write_env_file(path, watchdog_env(provider, cluster_id))
    return path
