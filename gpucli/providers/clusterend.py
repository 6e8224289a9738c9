"""A RunPod Instant Cluster stops billing only when this machine deletes it.

RunPod gives a member pod no way to end its own billing: member pods "are managed through
``/v2/clusters/{id}`` ... and cannot be modified or deleted via the pod endpoints", and
``DELETE /v2/pods/{id}`` says "Pods that belong to a Cluster cannot be terminated here — delete the
cluster via ``DELETE /v2/clusters/{id}``" (runpod/docs api-reference-v2/openapi.json, schema
``Pod.cluster`` and operation ``DELETE /v2/pods/{id}``); ``POST /v2/pods/{id}/action`` ``terminate`` is
"equivalent to deletePod". A pod's ``RUNPOD_API_KEY`` is documented only as "Pod-scoped API key"
(pods/templates/environment-variables.mdx), with nothing granting it its cluster. So the nodes'
watchdogs stop the run, and the cluster is deleted from here, by three things a user does not have to
remember:

- the launch starts a small watcher on this machine (``gpucli watch RUN`` in its own session, output in
  ``GPUCLI_HOME/runs/RUN.watch.log``) that deletes the cluster the moment the run is over, then exits;
- any ``gpucli ls`` or ``gpucli status`` that sees the run ended deletes its cluster too (after a
  reboot, or with the watcher killed), and ``gpucli ls`` deletes any cluster RunPod still has of a run
  that is over here (a deletion that failed when it ended);
- ``gpucli down RUN``.
With this machine off, the cluster bills until one of them runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError
from gpucli.providers.runpod.clusterrent import clusters_client, end_cluster
from gpucli.runs.records import runs_dir

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord


def cluster_of(record: RunRecord) -> str | None:
    """The id of the cluster a run's nodes were rented as (None: not a rented cluster)."""
    return record.inputs.cluster_id or None


def watcher_log(name: str) -> str:
    return str(runs_dir() / f"{name}.watch.log")


def start_watcher(name: str) -> int | None:
    """Start ``gpucli watch NAME`` on this machine, detached in its own session (it outlives this
    command and the terminal); its pid (None: it could not start). It ends by itself once the run is
    over and its cluster deleted."""
    try:
        with open(watcher_log(name), "ab") as log, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen([sys.executable, "-m", "gpucli", "watch", name], stdin=devnull, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    except OSError:
        return None
    return proc.pid


def cluster_gone(record: RunRecord) -> bool:
    """Whether RunPod no longer has the run's cluster (False when it cannot be asked)."""
    cluster_id = cluster_of(record)
    if cluster_id is None:
        return False
    try:
        client = clusters_client()
        try:
            return client.pods(cluster_id) is None
        finally:
            client.close()
    except GpucliError:
        return False


def end_clusters_of_ended(records: list[RunRecord]) -> list[str]:
    """Delete every cluster RunPod still has whose run is over (a deletion that failed when the run
    ended, or a run seen over by no one until now): one listing of the account's clusters, and only when
    some run here had one. Returns the ids deleted; a key or API that cannot answer leaves it for later."""
    ended = {c: r.name for r in records if not r.active and (c := cluster_of(r))}
    if not ended:
        return []
    deleted = []
    try:
        client = clusters_client()
        try:
            for info in client.list():
                if info.cluster_id in ended:
                    end_cluster(client, info.cluster_id, lambda _m: None)
                    deleted.append(info.cluster_id)
        finally:
            client.close()
    except GpucliError:
        pass  # the next `gpucli ls`, `down --strays` or the console
    return deleted
