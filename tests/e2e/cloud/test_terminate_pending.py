"""A pod is gone only when the provider says so: an unconfirmed terminate leaves the run "terminate
pending", which `ls`, `status` and `down` show and retry; an unreadable pod list is never "no strays"."""

from __future__ import annotations

import json

from gpucli.providers.api import LaunchSpec
from gpucli.providers.clients import get_provider
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running
from tests.support.cli import cli


def _pod(client_key, name: str) -> str:
    rp = get_provider("runpod")
    offer = rp.search_offers(None, limit=1)[0]
    pod = rp.create(LaunchSpec(name=name, gpu_name=offer.gpu_name, gpu_count=offer.gpu_count, image="img",
                               disk_gb=10, ssh_public_key=client_key[1], offer_id=offer.offer_id)).instance_id
    runs.save(runs.RunRecord(name=name, provider="runpod", created_at=runs.now_iso(), profile="rtx4090",
                             phase="fast", model="tiny", n_gpus=1, gpu="rtx4090", workdir="/w", status="running",
                             instance_id=pod, label=f"gpucli-{name}"))
    return pod


def test_an_unconfirmed_terminate_is_pending_until_the_provider_says_gone(runpod_emulator, client_key, capsys):
    emu = runpod_emulator
    pod = _pod(client_key, "pend")
    emu.faults.add("not_json", "terminate")  # HTTP 200 with an HTML body: not the documented 204
    code, _, err = cli(capsys, "down", "pend")
    assert code != 0 and "terminate pending" in err and "Traceback" not in err
    assert pod in emu.ledger.alive()
    record = runs.load("pend")
    assert record.status == "terminate pending" and record.message
    code, out, _ = cli(capsys, "status", "pend", "--json")  # shows it, and retries: now confirmed
    assert code == 0
    assert runs.load("pend").status == "stopped" and emu.ledger.alive() == set()

    pod2 = _pod(client_key, "pend2")
    emu.faults.add("server_error", "terminate", times=10)
    code, _, err = cli(capsys, "down", "pend2")
    assert code != 0 and runs.load("pend2").status == "terminate pending" and pod2 in emu.ledger.alive()
    code, out, _ = cli(capsys, "ls", "--json")
    rows = {r["run"]: r for r in json.loads(out)}
    assert rows["pend2"]["state"] == "terminate pending"  # still failing: shown as such
    emu.faults.clear()
    code, out, err = cli(capsys, "down", "pend2")  # down retries it
    assert code == 0, err
    assert runs.load("pend2").status == "stopped"
    assert_nothing_running(emu)


def test_strays_on_an_unreadable_list_are_not_none(runpod_emulator, client_key, capsys):
    emu = runpod_emulator
    emu.faults.add("not_json", "list", times=3)
    code, out, err = cli(capsys, "down", "--strays")
    assert code != 0 and "no stray" not in (out + err).lower()
    err = " ".join(err.split())
    assert "could not read the pod list of runpod" in err and "vast" not in err.split("list of")[1][:20]
