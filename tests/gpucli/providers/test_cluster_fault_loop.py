"""Randomized faults on RunPod Instant Clusters: every cluster launch ends with zero clusters and zero member
pods billing that no run owns (issue 41's fault loop, extended with cluster launches).

Faults (the emulator answers as api-reference-v2 says, tests/support/emulators/clusters.py): rate limits,
5xx and dropped connections on every cluster route; a create whose answer is lost (the cluster exists and
is found again by its name and deleted); no capacity; members that are slow to start, never start, or fail
(ERROR); a delete that fails (5xx) and is retried as ``gpucli down`` retries it; and a bare 404 (no problem
body: a proxy or a wrong URL) on the member list, which is never read as "gone" (openapi ErrorResponse).

``GPUCLI_FAULT_LAUNCHES`` sets the launches (default 25); ``GPUCLI_FAULT_SEED`` replays a draw (printed, and
in every assertion message).
"""

from __future__ import annotations

import os
import random
import time

from gpucli.errors import GpucliError
from gpucli.providers.http import HttpClient, RetryPolicy
from gpucli.providers.runpod.clusterrent import cluster_strays, end_cluster, rent_cluster
from gpucli.providers.runpod.clusters import RunPodClusters
from tests.support.emulators import PodBehaviour

LAUNCHES = int(os.environ.get("GPUCLI_FAULT_LAUNCHES") or 25)
DELETE_TRIES = 10  # what a user's repeated `gpucli down` of a cluster whose delete failed amounts to
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.0005, max_delay_s=0.002, deadline_s=5)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheEmulatorOnly gpucli"
FAULTS = [
    ("rate_limit", "create_cluster", {}), ("server_error", "create_cluster", {}), ("drop", "create_cluster", {}),
    ("lose_answer", "create_cluster", {}), ("no_capacity", "create_cluster", {}),
    ("server_error", "cluster_pods", {}), ("drop", "cluster_pods", {}), ("rate_limit", "cluster_pods", {}),
    ("server_error", "list_clusters", {}), ("server_error", "delete_cluster", {}), ("drop", "delete_cluster", {}),
]


def member(rng: random.Random) -> PodBehaviour:
    kind = rng.choice(["ok"] * 5 + ["slow", "slow", "stuck", "error"])
    if kind == "slow":
        return PodBehaviour(pending_polls=rng.randint(2, 5))
    if kind == "stuck":
        return PodBehaviour(stuck=True)
    if kind == "error":
        return PodBehaviour(pending_polls=1, exit_after_polls=1, bad_state="ERROR")
    return PodBehaviour(pending_polls=rng.randint(0, 1))


def client_of(emu) -> RunPodClusters:
    client = RunPodClusters(emu.api_key, emu.url)
    client.http = HttpClient(emu.url, api_key=emu.api_key, service="RunPod", policy=FAST)
    return client


def delete_for_sure(client: RunPodClusters, cluster_id: str, emu) -> int:
    """Delete until RunPod confirms (``gpucli down`` again after a failed delete); the tries."""
    for n in range(1, DELETE_TRIES + 1):
        try:
            end_cluster(client, cluster_id, lambda m: None)
            return n
        except GpucliError:
            continue
    raise AssertionError(f"cluster {cluster_id} could not be deleted in {DELETE_TRIES} tries")


def test_random_cluster_faults_leave_nothing_billing(cluster_emulator):
    seed = int(os.environ.get("GPUCLI_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"cluster fault loop seed: {seed}")
    rng = random.Random(seed)
    emu = cluster_emulator
    client = client_of(emu)
    counts = {"ok": 0, "failed": 0, "lost_answers": 0, "bare_404": 0, "deletes_faulted": 0, "delete_retries": 0,
              "strays_ended": 0}
    reasons: list[str] = []
    started = time.monotonic()
    for i in range(LAUNCHES):
        emu.faults.clear()
        emu.behaviours.clear()
        nodes = rng.choice([2, 2, 3])
        for _ in range(nodes):
            emu.behaviours.append(member(rng))
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            kind, endpoint, kw = rng.choice(FAULTS)
            emu.faults.add(kind, endpoint, times=rng.randint(1, 2), **kw)
            counts["lost_answers"] += kind == "lose_answer"
        bare = rng.random() < 0.15
        if bare:  # a proxy's 404 while the cluster starts: an error, never "the cluster is gone"
            emu.faults.add("server_error", "cluster_pods", status=404)  # an HTML 404, no problem body
        owned: list[str] = []
        try:
            cid, rented = rent_cluster(client, name=f"gpucli-cfl-{i}", gpu_type="NVIDIA H100 80GB HBM3",
                                       gpus_per_pod=1, nodes=nodes, image="img", disk_gb=20, public_key=KEY,
                                       ready_timeout_s=3.0, poll_s=0.01, on_cluster=owned.append,
                                       on_pods=lambda p: None, on_event=lambda m: None)
            counts["ok"] += 1
            assert owned == [cid] and [n.rank for n in rented] == list(range(nodes)), f"seed {seed}"
            emu.faults.clear()
            if rng.random() < 0.4:  # the run's end meets a failing delete
                emu.faults.add(rng.choice(["server_error", "drop"]), "delete_cluster", times=rng.randint(1, 6))
                counts["deletes_faulted"] += 1
            counts["delete_retries"] += delete_for_sure(client, cid, emu) - 1
        except GpucliError as exc:
            assert str(exc).strip(), f"seed {seed}: every failed launch says why"
            counts["failed"] += 1
            reasons.append(str(exc).splitlines()[0])
            counts["bare_404"] += bare
            # what the failed launch could not end, the user's `down` of the run (it owns the recorded id) does
            emu.faults.clear()
            for cid in owned:
                if not emu.clusters[cid].deleted:
                    counts["delete_retries"] += delete_for_sure(client, cid, emu)
            # a create whose answer was lost, when the search by name failed too: `gpucli down --strays`
            # finds it by its gpucli name (no run owns it) and ends it
            for cid, _name, _pods in cluster_strays(client, set()):
                counts["strays_ended"] += 1
                delete_for_sure(client, cid, emu)
        emu.faults.clear()
        live = [c.cluster_id for c in emu.clusters.values() if not c.deleted]
        assert live == [], f"seed {seed}: launch {i} left clusters billing: {live}"
        assert emu.billing_pods() == set(), f"seed {seed}: launch {i} left member pods billing"
    assert emu.running_sshd_count() == 0, f"seed {seed}"
    assert counts["ok"] + counts["failed"] == LAUNCHES
    assert counts["ok"] >= 2, f"seed {seed}: only {counts} launches came up: {reasons}"
    print(f"clusters: {counts}, {len(emu.clusters)} clusters created, {time.monotonic() - started:.1f} s")
