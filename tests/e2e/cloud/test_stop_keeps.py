"""`--on-end stop` keeps what it promises: a RunPod run folder on the pod's volume disk survives a stop
(the container disk is erased, pods/pricing.mdx L46), the pod starts again with its checkpoints, and
`status` says what the stopped pod bills per month."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from gpucli.providers.clients import get_provider
from gpucli.runs import records as runs
from gpucli.settings import home
from tests.e2e.cloud.test_cloud_launch import TINY, assert_nothing_running
from tests.support.cli import cli, wait_for


def test_runpod_stopped_and_started_keeps_its_checkpoints(runpod_emulator, capsys, tmp_path, monkeypatch):
    emu = runpod_emulator
    disk = tmp_path / "volume-disk"  # what the pod's volume disk at /workspace is on this machine
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(disk))
    name = "keeps"
    code, _, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--phase", "fast",
                       "--name", name, "--python", sys.executable, "--ready-timeout", "20", *TINY,
                       "--steps", "12", "--on-end", "stop")
    assert code == 0, err
    record = runs.load(name)
    pod_id = record.instance_id
    assert record.workdir == f"{disk}/gpucli-runs/{name}"  # the run folder is on the volume disk
    create = next(b for op, b in emu.calls if op == "createPod")
    assert create["mounts"]["persistent"]["path"] == "/workspace" and create["mounts"]["persistent"]["size"] >= 10

    # The run finishes; its watchdog stops the pod with the pod's own key (REST v2 action).
    ended = wait_for(lambda: emu.ledger.ended(pod_id), 180, "the pod to stop", interval=0.3)[0]
    assert (ended.event, ended.by) == ("stopped", "pod-key")
    checkpoints = sorted(p.name for p in (disk / "gpucli-runs" / name / "checkpoints").glob("step_*"))
    assert checkpoints
    assert list(emu.container_dir(pod_id).iterdir()) == []  # the container disk was erased by the stop

    # status of the stopped pod says what it bills per month: its volume disk at $0.20/GB/month
    volume_gb = create["mounts"]["persistent"]["size"]
    code, out, err = cli(capsys, "status", name, "--json")
    assert code == 0, err
    st = json.loads(out)
    assert st["kept_usd_per_month"] == round(volume_gb * 0.20, 2) and "stopped pod" in st["kept_note"]
    code, out, _ = cli(capsys, "status", name)
    assert "still billing" in " ".join(out.split())
    code, out, _ = cli(capsys, "ls")
    assert "/mo" in out

    # Started again: the same pod, the same checkpoints, read over SSH on the pod.
    client = get_provider("runpod")
    client.start(pod_id)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    inst = client.get(pod_id)
    while not inst.ssh_ready and time.monotonic() < deadline:
        time.sleep(0.1)
        inst = client.get(pod_id)
    assert inst.ssh_ready
    listing = subprocess.run(
        ["ssh", "-i", str(home() / "id_ed25519"), "-p", str(inst.ssh_port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         f"{inst.ssh_user}@{inst.ssh_host}", f"ls {record.workdir}/checkpoints"],
        capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0, listing.stderr
    assert sorted(x for x in listing.stdout.split() if x.startswith("step_")) == checkpoints

    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
