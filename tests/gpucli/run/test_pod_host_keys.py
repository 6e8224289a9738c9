"""Host keys per pod, not per host:port forever (real OpenSSH servers, one after another on one port).

vast.ai's proxies and RunPod's public ports are handed to the next pod: a new pod on an old address
must connect, while a changed key within one pod's life is refused. Nothing is written to gpucli's
global known_hosts for a pod.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpucli.errors import HostKeyError
from gpucli.providers.hostkeys import forget_pod_keys, pod_known_hosts, pod_known_hosts_for_ssh
from gpucli.providers.registry import open_host
from gpucli.runs.records import RunRecord
from gpucli.settings import home
from gpucli.ssh import SshTarget
from tests.support.sshd import SshServer, free_port


def pod_record(pod_id: str, port: int, key_path: str, provider: str = "vast") -> RunRecord:
    import getpass

    return RunRecord(name="keys", provider=provider, created_at="2026-01-01T00:00:00+00:00", profile="rtx4090",
                     phase="fast", model="tiny", n_gpus=1, gpu="rtx4090", workdir="w", status="running",
                     instance_id=pod_id, ssh=SshTarget(host="127.0.0.1", port=port, user=getpass.getuser(),
                                                       identity_file=key_path))


def connect(record: RunRecord) -> str:
    with open_host(record, connect_timeout_s=10) as host:
        assert host.run("echo ok", timeout_s=20).stdout.strip() == "ok"
        return host.host_key


@pytest.mark.parametrize("provider", ["vast", "runpod"])
def test_a_new_pod_on_a_reused_address_connects_a_changed_key_in_one_pod_does_not(provider, tmp_path, client_key):
    key_path, pub = client_key
    port = free_port()
    first = SshServer.start(tmp_path / "pod-a", [pub], port=port)
    try:
        pod_a = pod_record("1001", port, str(key_path), provider)
        seen_a = connect(pod_a)
        assert seen_a.split()[1] == first.host_key_pub.split()[1]
        pod_a = pod_a.with_(ssh=dataclasses.replace(pod_a.ssh, host_key=seen_a))  # what the launch records
    finally:
        first.stop()

    # The provider gives the same host:port to another pod, with its own host key.
    second = SshServer.start(tmp_path / "pod-b", [pub], port=port)
    try:
        pod_b = pod_record("1002", port, str(key_path), provider)
        seen_b = connect(pod_b)
        assert seen_b != seen_a and seen_b.split()[1] == second.host_key_pub.split()[1]
        # The first pod's own pin still holds: its record refuses the key now on its old address.
        with pytest.raises(HostKeyError):
            connect(pod_a)
    finally:
        second.stop()

    # Within the second pod's life its key changes (same pod id, no pin in the record yet): refused,
    # from the pod's own known_hosts file.
    third = SshServer.start(tmp_path / "pod-c", [pub], port=port)
    try:
        with pytest.raises(HostKeyError):
            connect(pod_b)
    finally:
        third.stop()

    # Nothing went to the global known_hosts; each pod has its own file.
    glob = home() / "known_hosts"
    assert not glob.exists() or f"[127.0.0.1]:{port}" not in glob.read_text()
    assert pod_known_hosts(pod_a) != pod_known_hosts(pod_b)
    assert seen_b.split()[1] in pod_known_hosts(pod_b).read_text()

    # `gpucli ssh` gets the pinned key in the pod's file; `down` forgets the pod's keys.
    assert seen_a.split()[1] in pod_known_hosts_for_ssh(pod_a).read_text()
    forget_pod_keys(pod_b.with_(previous_instances=("1001",)))
    assert not pod_known_hosts(pod_a).exists() and not pod_known_hosts(pod_b).exists()


def test_ssh_hosts_keep_the_global_pin(tmp_path, client_key):
    """``--provider ssh`` is a machine the user owns: its key stays pinned per host:port."""
    key_path, pub = client_key
    port = free_port()
    server = SshServer.start(tmp_path / "own", [pub], port=port)
    try:
        connect(pod_record("", port, str(key_path), "ssh").with_(instance_id=None))
    finally:
        server.stop()
    assert f"[127.0.0.1]:{port}" in (home() / "known_hosts").read_text()
