"""Ending what a run rented as one: its RunPod Instant Cluster, or its vast.ai instances and overlay.
Below the launch machinery, so that `status` and `ls`, which end the cluster of a run they see over
(no pod of it can), do not load what starts runs.
"""

from __future__ import annotations

from collections.abc import Callable

from gpucli.errors import GpucliError
from gpucli.providers.clusterend import cluster_of
from gpucli.providers.runpod.clusterrent import clusters_client, end_cluster
from gpucli.providers.vast.overlayrent import end_vast
from gpucli.runs.records import RunRecord


def end_rented(record: RunRecord, *, on_warn: Callable[[str], None]) -> bool:
    """Delete the run's cluster (vast: every instance and the overlay), if it has one; whether one was deleted."""
    cluster_id = cluster_of(record)
    if cluster_id is None:
        try:
            return end_vast(record)
        except GpucliError as exc:
            on_warn(str(exc))
            return False

    try:
        client = clusters_client()
        try:
            end_cluster(client, cluster_id, lambda m: None)
        finally:
            client.close()
    except GpucliError as exc:
        on_warn(str(exc))
        return False
    return True
