"""A RunPod Instant Cluster stops billing when its run ends, although no member pod may end it (the v2
spec: member pods "cannot be modified or deleted via the pod endpoints"; the emulator refuses a pod's
key the same way): the launch's watcher on this machine deletes it with no gpucli command run after the
launch; with the watcher killed, the first `gpucli ls` that sees the run over deletes it."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.lifecycle.test_nodes import group, nothing_running
from tests.support.cli import cli, wait_for


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.1")
    monkeypatch.setenv("GPUCLI_WATCH_POLL_S", "1")  # the launch's watcher inherits it


def launch(capsys, tmp_path, name: str, seconds: float) -> tuple[runs.RunRecord, int, str]:
    code_dir = tmp_path / "mine"
    code_dir.mkdir(exist_ok=True)
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "h100", "--nodes", "2",
                         "--name", name, "--code", str(code_dir), "--python", sys.executable,
                         "--workdir", str(tmp_path / "pod" / name), "--run", f"sleep {seconds:g}")
    assert code == 0, err
    said = out + err
    m = re.search(r"a watcher here \(pid (\d+), log ([^)]+)\)", said)
    assert m and "RunPod lets no pod end its cluster" in said, said
    return runs.load(name), int(m.group(1)), m.group(2)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_launch_watcher_deletes_the_cluster_when_the_run_ends(capsys, runpod_emulator, cluster_emulator,
                                                                  tmp_path, quick):
    record, pid, log = launch(capsys, tmp_path, "ends", 3)
    try:
        assert len(cluster_emulator.billing_pods()) == 2 and alive(pid)
        # no gpucli command from here on: only the nodes and the watcher
        wait_for(lambda: not cluster_emulator.billing_pods(), 180, "the cluster to be deleted")
        wait_for(lambda: not alive(pid), 60, "the watcher to exit")
        assert runs.load("ends").status == "finished"
        assert f"deleted its cluster {record.launch['cluster_id']}" in Path(log).read_text()
        wait_for(lambda: nothing_running(record), 60, "the nodes' processes to end")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_with_the_watcher_gone_ls_deletes_the_cluster_of_a_run_that_ended(capsys, runpod_emulator,
                                                                          cluster_emulator, tmp_path, quick):
    record, pid, _ = launch(capsys, tmp_path, "orphaned", 2)
    os.kill(pid, signal.SIGKILL)  # this machine's side is gone (a reboot, a killed process)
    wait_for(lambda: not alive(pid), 30, "the watcher to die")
    wait_for(lambda: nothing_running(record) and not group(pid), 120, "the run to end on both nodes")
    assert len(cluster_emulator.billing_pods()) == 2  # no pod can end its cluster: it still bills
    code, out, err = cli(capsys, "ls")
    assert code == 0, err
    assert not cluster_emulator.billing_pods()
    assert runs.load("orphaned").status == "finished"
    # rank 0's watchdog could not end the cluster (v2 refuses its key here): the record says so
    assert runs.load("orphaned").ended_by == "none"
    code, out, err = cli(capsys, "status", "orphaned")
    assert code == 0, err
    assert "ended by" in out and "nothing on the pod" in " ".join(out.split()), out


def test_with_the_watcher_gone_rank_0s_watchdog_deletes_the_cluster_where_its_key_may(
        capsys, runpod_emulator, cluster_emulator, tmp_path, quick):
    """Issue 41 rule 3: where v2 lets a member's key delete its cluster, rank 0's watchdog ends the
    billing with this machine's side gone, its path in watchdog.json; and where v2 refuses the key (the
    test above), the watchdog says so once and exits instead of retrying a refusal for 15 minutes."""
    cluster_emulator.pod_key_deletes_cluster = True
    record, pid, _ = launch(capsys, tmp_path, "bykey", 2)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 30, "the watcher to die")
    wait_for(lambda: not cluster_emulator.billing_pods(), 120, "rank 0's watchdog to delete the cluster")
    state = json.loads((Path(record.workdir) / "watchdog.json").read_text())
    # the delete kills the watchdog with its pod, often before the answer: the path it was trying is said
    assert state.get("ended_by", state.get("trying")) == "REST v2 cluster", state
    members = cluster_emulator.clusters[record.launch["cluster_id"]].members
    assert len(members) == 2 and all(e.by == "pod-key" for p in members for e in cluster_emulator.ledger.ended(p))


def test_ls_deletes_a_cluster_still_billing_for_a_run_that_is_over(capsys, cluster_emulator):
    from gpucli.providers.runpod.clusters import RunPodClusters
    from tests.e2e.cloud.test_clusters import rent

    client = RunPodClusters(cluster_emulator.api_key)
    cid, nodes = rent(client, "gpucli-left")
    kept, _ = rent(client, "gpucli-live")
    base = dict(provider="runpod", created_at=runs.now_iso(), profile="8xH100", phase="fast", model="124m",
                n_gpus=8, gpu="h100-sxm", workdir="w")
    # its deletion failed when it ended (the API was down): the record says finished, RunPod still bills
    runs.save(runs.RunRecord(name="left", status="finished", launch={"cluster_id": cid}, **base))
    runs.save(runs.RunRecord(name="live", status="running", launch={"cluster_id": kept}, **base,
                             ssh=None, instance_id=None))
    code, out, err = cli(capsys, "ls")
    assert code == 0, err
    assert not (cluster_emulator.billing_pods() & {n.pod_id for n in nodes})
    assert len(cluster_emulator.billing_pods()) == 2  # the running run's cluster is left alone
