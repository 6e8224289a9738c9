"""vast.ai bills bandwidth (issue 27 items 3 and 8): data through an instance's SSH routes is billed per
byte at the offer's $/GB, download (data reaching the instance) at ``inet_down_cost`` - vast-ai/docs
guides/instances/pricing.mdx L68-70, search_offers.yaml L143-148, show_charges.yaml (``bwd``/``bwu``).
The emulator meters every route (tests/support/emulators/vastnet.py); gpucli's status and the cost
`down` records include what vast reports."""

from __future__ import annotations

import json
import os

import pytest

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, launch
from tests.support.cli import cli

UPLOAD_MB = 8
DOWN_USD_PER_GB = 5.0  # an expensive host, so the bandwidth is a visible part of the bill


def test_an_upload_is_billed_at_inet_down_cost_and_gpucli_agrees(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    emu.offers[-1]["inet_down_cost"] = DOWN_USD_PER_GB
    code, out, err = launch(capsys, tmp_path, "vast", "bw")
    assert code == 0, err
    (created,) = emu.ledger.created()
    pod_id = created.pod_id
    meter = emu.net.meters[pod_id]
    assert meter.to_pod > 0  # the launch's own upload (code, run files) went through a metered route

    data = tmp_path / "upload"
    data.mkdir()
    (data / "blob.bin").write_bytes(os.urandom(UPLOAD_MB * 10**6))  # random: nothing compresses it
    before_bytes, (before_usd, _) = meter.to_pod, emu.net.bandwidth_usd(pod_id)
    code, out, err = cli(capsys, "sync", "bw", str(data))
    assert code == 0, err
    moved = meter.to_pod - before_bytes
    assert UPLOAD_MB * 10**6 <= moved <= UPLOAD_MB * 10**6 * 1.1 + 2 * 10**6  # the file plus SSH's framing
    grown = emu.net.bandwidth_usd(pod_id)[0] - before_usd
    assert grown == pytest.approx(moved / 1e9 * DOWN_USD_PER_GB)
    assert grown == pytest.approx(UPLOAD_MB / 1e3 * DOWN_USD_PER_GB, rel=0.1)  # N MB / 1e9 x $/GB

    # gpucli's status shows vast's bill, bandwidth included, and counts it in the cost so far.
    code, out, err = cli(capsys, "status", "bw", "--json")
    assert code == 0, err
    st = json.loads(out)
    billed_bw = sum(emu.net.bandwidth_usd(pod_id))
    assert st["bandwidth_usd"] == pytest.approx(billed_bw, rel=0.02)
    assert st["bandwidth_usd"] >= UPLOAD_MB / 1e3 * DOWN_USD_PER_GB
    assert st["cost_usd"] >= st["bandwidth_usd"] and st["billed_usd"] >= st["bandwidth_usd"]
    code, out, err = cli(capsys, "status", "bw")
    assert code == 0 and "billed by vast" in out and "bandwidth" in out

    # down records the pod's cost with vast's final bill; a second down does not add it again.
    code, out, err = cli(capsys, "down", "bw")
    assert code == 0, err
    final = emu.net.charges_of(pod_id, *emu.net.contracts[pod_id])
    bandwidth = sum(i["amount"] for i in final["items"] if i["type"] in ("bwd", "bwu"))
    cost = runs.load("bw").cost_usd
    assert cost >= final["amount"] - 1e-6 and cost >= bandwidth
    assert runs.load("bw").launch["bandwidth_usd"] == pytest.approx(bandwidth)
    code, out, err = cli(capsys, "down", "bw")
    assert runs.load("bw").cost_usd == pytest.approx(cost)
    assert_nothing_running(emu)
