"""What a launch asks of the offers: ``--force`` keeps a pod billed above its quote, ``--query``
replaces the launch's default offer filters field by field (``GPUCLI_OFFER_QUERY`` still works), and
offers are ranked on the run's planned hours and transfer rather than one hour and no transfer.
"""

from __future__ import annotations

import dataclasses

import pytest

from gpucli.providers.cloudtarget import run_cost
from gpucli.run.inputs.launch import LaunchRequest
from gpucli.run.life import lifecycle
from gpucli.runs import records as runs
from gpucli.runs.limits import Limits
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, error_lines, launch
from tests.support.cli import cli


# --- --force and the billed price ------------------------------------------------------------------------
def test_force_keeps_a_pod_billed_above_its_quote_and_says_so(request, capsys, tmp_path):
    emu = emulator_for(request, "runpod")
    emu.billed_markup = {dc["id"]: 1.2 for dc in emu.data_centers}  # every pod bills 20 % over its quote

    code, out, err = launch(capsys, tmp_path, "runpod", "overbilled")
    assert code != 0
    (line,) = error_lines(err)
    assert "more than 5% above the quote" in line and "Traceback" not in err
    assert len(emu.ledger.created()) >= 2  # each mismatched pod was ended and the next offer tried
    assert_nothing_running(emu)

    code, out, err = launch(capsys, tmp_path, "runpod", "kept", "--force")
    assert code == 0, err
    said = " ".join((out + err).split())  # the step lines wrap at the console's width
    assert said.count("kept (--force)") == 1, out + err
    assert "more than 5% above the quote" in said.split("kept (--force)")[0].rsplit("pod ", 1)[-1]
    record = runs.load("kept")
    pod = emu.pods[record.instance_id]
    assert record.price_per_hour_usd == pytest.approx(pod.price_per_hour)  # the billed price, not the quote
    assert "force" not in (record.launch or {}).get("request", {})
    code, _, err = cli(capsys, "down", "kept")
    assert code == 0, err
    assert_nothing_running(emu)


# --- --query ---------------------------------------------------------------------------------------------
def _searches(emu) -> list[dict]:
    return [body for _, path, body in emu.requests if path.rstrip("/").endswith("/bundles")]


def _prepare(req: LaunchRequest):
    from gpucli.plan.catalog import load_catalog

    prepared = lifecycle.prepare(load_catalog(), req)
    runs.release_name(prepared.resolved.name)  # nothing is launched here
    return prepared


def test_query_overrides_the_default_filters_field_by_field(request, monkeypatch):
    from tests.support.emulators.vast import _offer

    emu = emulator_for(request, "vast")
    shaky = _offer(2001, "RTX 4090", 1, 24564, 0.30, 0.15, 0.92, 900.0, "Lille, FR", 29.0)  # reliability 0.92
    slow = _offer(2002, "RTX 4090", 1, 24564, 0.31, 0.15, 0.99, 150.0, "Nantes, FR", 29.0)  # 150 Mbit/s down
    emu.offers += [shaky, slow]

    default = _prepare(LaunchRequest(profile="rtx4090", provider="vast", disk_gb=80))
    body = _searches(emu)[-1]
    assert body["reliability"] == {"gte": "0.95"} and body["inet_down"] == {"gte": "100"}
    assert [o.offer_id for o in default.provision.plan.offers][:1] == ["2002"]  # the shaky host is filtered out

    asked = LaunchRequest(profile="rtx4090", provider="vast", disk_gb=80,
                          query="reliability>=0.9 inet_down>=200")
    prepared = _prepare(asked)
    body = _searches(emu)[-1]
    assert body["reliability"] == {"gte": "0.9"} and body["inet_down"] == {"gte": "200"}
    assert body["disk_space"] == {"gte": "80"} and body["cuda_max_good"] == {"gte": "12.8"}  # kept
    ids = [o.offer_id for o in prepared.provision.plan.offers]
    assert ids[0] == "2001" and "2002" not in ids
    # The query is in the record's request, and reads back; a record from before --query still loads.
    data = prepared.inputs
    assert data["request"]["query"] == "reliability>=0.9 inet_down>=200"
    assert LaunchRequest.from_json(data).query == asked.query
    old = LaunchRequest(profile="rtx4090", provider="vast").to_json()
    assert "query" not in old["request"] and LaunchRequest.from_json(old).query is None

    # The environment variable still works, and --query wins over it for the fields it names.
    monkeypatch.setenv("GPUCLI_OFFER_QUERY", "reliability>=0.8 inet_down>=50")
    _prepare(LaunchRequest(profile="rtx4090", provider="vast", query="inet_down>=300"))
    body = _searches(emu)[-1]
    assert body["reliability"] == {"gte": "0.8"} and body["inet_down"] == {"gte": "300"}
    assert emu.ledger.created() == []  # nothing was rented


def test_query_filters_runpod_offers_too(request):
    emu = emulator_for(request, "runpod")
    every = _prepare(LaunchRequest(profile="rtx4090", provider="runpod")).provision.plan.offers
    assert {o.cloud_type for o in every} == {"COMMUNITY", "SECURE"}  # Community ~$0.35/h, Secure ~$0.70/h
    capped = _prepare(LaunchRequest(profile="rtx4090", provider="runpod", query="dph<=0.5")).provision.plan.offers
    assert [o.cloud_type for o in capped] == ["COMMUNITY"] and capped[0].price_per_hour_usd <= 0.5
    assert emu.ledger.created() == []


def test_a_bad_query_is_one_line_before_anything_is_searched(request, capsys):
    emu = emulator_for(request, "vast")
    code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "rtx4090", "--query", "relability>=0.9")
    assert code != 0
    (line,) = error_lines(err)
    assert "unknown query field 'relability'" in line and "Traceback" not in err
    assert _searches(emu) == [] and emu.ledger.created() == []


# --- ranking on the run's hours and transfer -------------------------------------------------------------
def test_offers_are_ranked_on_the_planned_hours_and_transfer(request, tmp_path):
    from tests.support.emulators.vast import _offer

    emu = emulator_for(request, "vast")
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "a.txt").write_text("hello world. " * 40000)
    req = LaunchRequest(profile="rtx4090", provider="vast", data=str(data), disk_gb=80, mirror=True,
                        limits=Limits(max_steps=40000))

    def ranked(up_cost_a: float) -> tuple[list[str], lifecycle.OfferAsk]:
        cheap = dict(_offer(3001, "RTX 4090", 1, 24564, 0.40, 0.2, 0.99, 900.0, "Paris, FR", 29.0),
                     inet_up_cost=up_cost_a, inet_down_cost=0.0)
        dear = dict(_offer(3002, "RTX 4090", 1, 24564, 0.50, 0.2, 0.99, 900.0, "Rome, IT", 29.0),
                    inet_up_cost=0.0, inet_down_cost=0.0)
        emu.offers[:] = [cheap, dear]
        prepared = _prepare(req)
        return [o.offer_id for o in prepared.provision.plan.offers], lifecycle.offer_ask(req, prepared.resolved)

    _, ask = ranked(0.0)
    resolved = _prepare(req).resolved
    assert ask.hours == pytest.approx(resolved.planned.hours) and ask.hours > 2  # the plan's hours, not 1
    up, down = ask.transfer_gb
    assert up == pytest.approx(len("hello world. ") * 40000 / 1e9, abs=1e-3)  # the data folder goes up
    # --mirror-checkpoints: each checkpoint written is pulled home once
    assert down == pytest.approx(resolved.disk.written * resolved.disk.checkpoints.checkpoint_gb, abs=1e-3)
    assert down > 0.1
    gap = 0.10  # $/h the cheaper host saves
    # Its bandwidth home costs more than the hours save: the dearer host wins (1 h, 0 GB would pick the cheap one).
    ids, _ = ranked(2 * gap * ask.hours / down)
    assert ids[0] == "3002"
    # Costlier than one hour's saving but cheaper than the planned hours' saving: the cheap host wins.
    ids, _ = ranked(gap * (1 + ask.hours) / 2 / down)
    assert ids[0] == "3001"
    capped = dataclasses.replace(req, limits=Limits(max_steps=40000, max_hours=1.5))
    assert lifecycle.offer_ask(capped, _prepare(capped).resolved).hours == 1.5  # --hours caps the plan
    offers = _prepare(req).provision.plan.offers
    assert run_cost(offers[0], spot=False, hours=ask.hours, transfer_gb=ask.transfer_gb) <= \
        run_cost(offers[1], spot=False, hours=ask.hours, transfer_gb=ask.transfer_gb)
    assert emu.ledger.created() == []


# --- the host's driver against the torch build the GPU needs ---------------------------------------------
def test_a_blackwell_gpu_is_only_rented_on_a_host_whose_driver_runs_cuda_12_8(request):
    from tests.support.emulators.vast import _offer

    emu = emulator_for(request, "vast")
    # two RTX 5090 hosts (sm_120): the cheaper one's driver stops at CUDA 12.6, which no cu128 build runs on
    emu.offers += [_offer(3001, "RTX 5090", 1, 32607, 0.30, 0.15, 0.99, 900.0, "Lille, FR", 50.0, cuda=12.6),
                   _offer(3002, "RTX 5090", 1, 32607, 0.45, 0.20, 0.99, 900.0, "Nantes, FR", 50.0, cuda=12.8)]
    prepared = _prepare(LaunchRequest(profile="1xRTX5090", provider="vast", disk_gb=80))
    assert _searches(emu)[-1]["cuda_max_good"] == {"gte": "12.8"}  # asked of vast itself
    plan = prepared.provision.plan
    assert [o.offer_id for o in plan.offers] == ["3002"] and plan.min_cuda == "12.8"
    # B300 (sm_103) needs CUDA 12.9; the pin file's oldest build at or above it is cu130: a 13.0 driver
    from gpucli.plan.catalog import load_catalog

    target = prepared.provision.target
    assert target.required_cuda(load_catalog().gpus["b300"]) == "13.0"
    assert target.required_cuda(load_catalog().gpus["rtx4090"]) == "12.8"  # the image's floor


def test_runpod_cuda_versions_compare_per_component(request):
    emu = emulator_for(request, "runpod")
    prepared = _prepare(LaunchRequest(profile="h100", provider="runpod", disk_gb=40))
    # H100s are in US-KS-2 (hosts on "12.10": above 12.8 per component, below it as a decimal) and EU-SE-1
    # ("12.4", too old for the image): only US-KS-2 is offered, and the pod is created asking for 12.8+
    offers = prepared.provision.plan.offers
    assert offers and {o.data_center_id for o in offers} == {"US-KS-2"}
    assert {o.cuda_version for o in offers} == {"12.10"}
    reads = [q for op, q in emu.calls if op == "listGpuTypes"]
    assert reads and all(q.get("minCudaVersion") == "12.8" for q in reads)
