"""RunPod Instant Clusters against the emulator (strict routes of the v2 spec): the cluster is rented
and ended as one, and seeded faulty launches leave no member pod billing that no run owns."""

from __future__ import annotations

import os
import random

import pytest

from gpucli.cloud.clusters import RunPodClusters
from gpucli.errors import GpucliError
from gpucli.run.clusterrent import ClusterNotReady, cluster_strays, end_cluster, rent_cluster
from tests.support.emulators.common import PodBehaviour

# 100 in a long run (GPUCLI_FAULTY_LAUNCHES=100); a few here, each seed its own mix of faults.
LAUNCHES = int(os.environ.get("GPUCLI_FAULTY_LAUNCHES", "12"))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheEmulatorOnly gpucli"


def rent(client, name, nodes=2, timeout=3.0, owned=None, **kw):
    ids: list[str] = []
    return rent_cluster(client, name=name, gpu_type="NVIDIA H100 80GB HBM3", gpus_per_pod=8, nodes=nodes,
                        image="img", disk_gb=50, public_key=KEY, ready_timeout_s=timeout, poll_s=0.02,
                        on_cluster=(owned.add if owned is not None else ids.append), on_pods=lambda p: None,
                        on_event=lambda m: None, **kw)


def test_a_cluster_comes_up_whole_and_goes_as_one(cluster_emulator):
    client = RunPodClusters(cluster_emulator.api_key)
    owned: set[str] = set()
    cid, nodes = rent(client, "gpucli-c1", nodes=3, owned=owned)
    assert owned == {cid} and [n.rank for n in nodes] == [0, 1, 2]
    assert all(n.ssh_port and n.ip for n in nodes)
    body = next(b for m, p, b in cluster_emulator.requests if m == "POST")
    assert body["type"] == "TRAINING" and body["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3",
                                                              "gpuCountPerPod": 8, "podCount": 3}
    assert body["startSsh"] is True and body["env"]["PUBLIC_KEY"] == KEY
    assert len(cluster_emulator.billing_pods()) == 3
    assert cluster_strays(client, owned=set()) and not cluster_strays(client, owned={cid})
    end_cluster(client, cid, lambda m: None)
    assert not cluster_emulator.billing_pods()


def test_the_emulator_is_as_strict_as_the_spec(cluster_emulator):
    client = RunPodClusters(cluster_emulator.api_key)
    for body, needle in (({"name": "x", "type": "TRAINING", "compute": {"gpuTypeId": "NVIDIA H200",
                                                                           "gpuCountPerPod": 1, "podCount": 1}},
                          "podCount"),
                         ({"name": "x", "type": "TRAINING", "gpuCount": 2,
                           "compute": {"gpuTypeId": "NVIDIA H200", "gpuCountPerPod": 1, "podCount": 2}},
                          "unknown field")):
        resp = client.http.request("POST", "/v2/clusters", json_body=body)
        assert resp.status == 400 and needle in resp.body["detail"]
    assert not cluster_emulator.ledger.created()


def test_a_cluster_not_whole_in_time_is_deleted(cluster_emulator):
    cluster_emulator.behaviours.extend([PodBehaviour(pending_polls=0), PodBehaviour(stuck=True)])
    client = RunPodClusters(cluster_emulator.api_key)
    with pytest.raises(ClusterNotReady, match="1 of 2 pods ready"):
        rent(client, "gpucli-c2", timeout=0.5)
    assert len(cluster_emulator.ledger.created()) == 2 and not cluster_emulator.billing_pods()


FAULTS = [("rate_limit", "create_cluster"), ("server_error", "create_cluster"), ("lose_answer", "create_cluster"),
          ("no_capacity", "create_cluster"), ("server_error", "cluster_pods"), ("rate_limit", "cluster_pods"),
          ("server_error", "delete_cluster"), ("rate_limit", "list_clusters")]


def test_seeded_faulty_multi_node_launches_leave_nothing_billing(cluster_emulator):
    client = RunPodClusters(cluster_emulator.api_key)
    outcomes = {"up": 0, "failed": 0}
    for seed in range(LAUNCHES):
        rng = random.Random(seed)
        for kind, endpoint in rng.sample(FAULTS, rng.randint(0, 3)):
            cluster_emulator.faults.add(kind, endpoint)
        nodes = rng.choice([2, 3])
        behaviours = [PodBehaviour(pending_polls=rng.randint(0, 3),
                                   stuck=rng.random() < 0.15,
                                   exit_after_polls=1 if rng.random() < 0.1 else None, bad_state="ERROR")
                      for _ in range(nodes)]
        cluster_emulator.behaviours.extend(behaviours)
        owned: set[str] = set()
        try:
            cid, _ = rent(client, f"gpucli-seed{seed}", nodes=nodes, timeout=0.6, owned=owned)
        except GpucliError:
            outcomes["failed"] += 1
        else:
            outcomes["up"] += 1
            # every member pod bills under this run's cluster, and nothing else does
            members = set(cluster_emulator.clusters[cid].members)
            assert cluster_emulator.billing_pods() == members
            end_cluster(client, cid, lambda m: None)  # the run ends: down deletes the cluster
        cluster_emulator.behaviours.clear()
        cluster_emulator.faults.clear()
        assert not cluster_emulator.billing_pods(), f"seed {seed}: pods left billing"
    assert outcomes["up"] and outcomes["failed"], outcomes
