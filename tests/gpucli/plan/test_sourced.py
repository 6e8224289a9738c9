"""Calibrated where measured, sourced where not: a provider's own price, a roofline MFU for a GPU without
a measurement (said to be an estimate), and every constant of --explain with a source or marked."""

from __future__ import annotations

import datetime as dt

from gpucli.plan.catalog import load_catalog
from gpucli.plan.explain import explain_setup
from gpucli.plan.planner import PlanRequest, choose_price, make_plan
from gpucli.run.inputs.launch import LaunchRequest, resolve

TODAY = dt.date(2026, 11, 22)


def test_a_plan_for_one_provider_uses_its_price():
    cat = load_catalog()
    prices = cat.prices_for("h100-pcie")
    assert choose_price(prices, 8, "on-demand", "runpod").provider == "runpod"
    assert choose_price(prices, 8, "on-demand", "vast").provider == "vast"
    plan = make_plan(cat, PlanRequest(model=cat.model("d24"), today=TODAY, gpus=("h100-pcie",), counts=(8,),
                                      provider="runpod"))
    (e,) = plan.estimates
    assert e.setup.price.provider == "runpod" and e.setup.price.usd_per_gpu_hour == 4.0
    # A provider without a price of its own: the surveys', never another provider's.
    q = choose_price(cat.prices_for("a100-40"), 1, "on-demand", "runpod")
    assert q is not None and q.provider is None
    # The launch on RunPod prices the machine with RunPod's quote.
    r = resolve(cat, LaunchRequest(profile="8xH100-PCIe", provider="runpod", model="d24").checked(), run_name="p")
    assert r.price_per_hour_usd == 32.0


def test_a_gpu_without_a_measurement_gets_a_roofline_estimate():
    cat = load_catalog()
    plan = make_plan(cat, PlanRequest(model=cat.model("1b"), today=TODAY, gpus=("a100-sxm-80", "l40s"), counts=(1,)))
    by = {e.setup.gpu.id: e for e in plan.estimates}
    for e in by.values():
        assert "estimated for" in e.speed_source and "roofline" in e.speed_source
    # Less bandwidth for its FLOPs: a lower MFU (864 GB/s for 362 TFLOP/s against 2039 for 312).
    assert by["l40s"].mfu < by["a100-sxm-80"].mfu


def test_every_constant_has_a_source_or_is_marked_an_assumption():
    cat = load_catalog()
    for model, workload, tokens in (("1b", "train", None), ("7b", "generate", 1e6)):
        plan = make_plan(cat, PlanRequest(model=cat.model(model), today=TODAY, workload=workload, tokens=tokens,
                                          gpus=("h100-sxm",), counts=(8,)))
        x = explain_setup(cat, plan, "8x H100 SXM")
        assert len(x.constants) >= 8
        for name, value, source in x.constants:
            assert name and value and source
        assert any(src.startswith("assumption") for _, _, src in x.constants)
