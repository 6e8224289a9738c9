"""The planner on the real catalogue, on the Pareto cost analysis's numbers through a test catalogue, and the $1000 8x H100 setup guide's budget."""

import datetime as dt
import shutil
from pathlib import Path

import pytest
import yaml

from gpucli.errors import NothingFitsError, UnknownNameError
from gpucli.plan.catalog import load_catalog
from gpucli.plan.estimate import Fit
from gpucli.plan.planner import PlanRequest, dominates, make_plan
from gpucli.settings import PACKAGE_CATALOG

TODAY = dt.date(2026, 11, 22)


def request(cat, model="1b", **kw):
    return PlanRequest(model=cat.model(model), today=TODAY, **kw)


def test_plan_1b_on_the_catalogue():
    cat = load_catalog()
    plan = make_plan(cat, request(cat))
    assert plan.tokens == pytest.approx(20 * 777_856_512)
    assert plan.front, "a 1B model fits somewhere"
    runnable = [e for e in plan.estimates if e.runs]
    for m in plan.front:
        assert not any(dominates(o.point, m.point) for o in runnable)
    for e, by in plan.dominated:
        assert dominates(by.point, e.point)
    # Every estimate is hours x price x GPUs.
    for e in plan.estimates:
        assert e.cost_usd == pytest.approx(e.hours * e.setup.price.usd_per_gpu_hour * e.setup.n_gpus)
        # training, plus the trainer's environment built once on the pod (gpus.yaml env_build_minutes)
        assert e.hours == pytest.approx(plan.tokens / e.tokens_per_s / 3600 + cat.defaults.env_build_minutes / 60)
    assert plan.picks.cheapest.cost_usd == min(e.cost_usd for e in runnable)
    assert plan.picks.fastest.hours == min(e.hours for e in runnable)
    assert plan.picks.best_value in plan.front
    # The 16 GB A4000 cannot hold 1b's 12.4 GB of training state plus a 4096-token micro-batch.
    assert any(e.setup.gpu.id == "a4000" and e.setup.n_gpus == 1 for e in plan.unfit)
    # Stale catalogue prices are said to be stale.
    assert any("stale" in n for n in plan.notes)


def test_budget_and_deadline_picks():
    cat = load_catalog()
    plan = make_plan(cat, request(cat, budget_usd=150, deadline_hours=48))
    runnable = [e for e in plan.estimates if e.runs]
    wb = plan.picks.within_budget
    assert wb.cost_usd <= 150 and wb.hours == min(e.hours for e in runnable if e.cost_usd <= 150)
    wd = plan.picks.within_deadline
    assert wd.hours <= 48 and wd.cost_usd == min(e.cost_usd for e in runnable if e.hours <= 48)
    both = plan.picks.within_both
    assert both.hours <= 48 and both.cost_usd <= 150


def test_seed_004_budget_buys_31_25_hours_of_8_h100_pcie():
    cat = load_catalog()
    plan = make_plan(cat, request(cat, "d64", gpus=("h100-pcie",), counts=(8,), price_per_gpu_hour=4.0,
                                  budget_usd=1000))
    (view,) = plan.budget_views
    assert view.hours == pytest.approx(31.25)  # $1000 / (8 x $4)
    assert view.tokens == pytest.approx(31.25 * 3600 * view.estimate.tokens_per_s)
    assert view.estimate.fit is Fit.SHARDED  # 12.9B parameters need their state sharded over 8x80 GB


def test_spot_plans_use_spot_prices():
    cat = load_catalog()
    plan = make_plan(cat, request(cat, spot=True))
    assert all(e.setup.price.kind == "spot" for e in plan.estimates)


def test_generation_workload_7b():
    cat = load_catalog()
    plan = make_plan(cat, request(cat, "7b", workload="generate", tokens=12_288_000, counts=(1, 4)))
    # 7B in fp16 needs ~16 GB: the 16 GB A4000 cannot hold it, 24 GB cards can.
    assert any(e.setup.gpu.id == "a4000" for e in plan.unfit)
    assert any(e.setup.gpu.id == "rtx3090" for e in plan.front + tuple(d for d, _ in plan.dominated))
    four = [e for e in plan.estimates if e.setup.n_gpus == 4 and e.setup.gpu.id == "h100-sxm"][0]
    one = [e for e in plan.estimates if e.setup.n_gpus == 1 and e.setup.gpu.id == "h100-sxm"][0]
    assert four.tokens_per_s == pytest.approx(one.tokens_per_s * 4 * 0.95)


def test_nothing_fits_is_said_plainly():
    cat = load_catalog()
    with pytest.raises(NothingFitsError, match="fits on none"):
        make_plan(cat, request(cat, "d64", gpus=("rtx4090",), max_gpus=1))


def test_unknown_gpu_in_request():
    cat = load_catalog()
    with pytest.raises(UnknownNameError):
        make_plan(cat, request(cat, gpus=("h1000",)))


# --------------------------------------------------------------------------------------------------
# The Pareto cost analysis through a test catalogue: its TPS per GPU (as calibration entries), its prices.

SEED_003_TPS = {"b200": 280, "h100-sxm": 190, "h100-pcie": 170, "a100-sxm-80": 130, "a100-40": 115,
                "rtx5090": 150, "rtx4090": 100, "rtx3090": 70}
SEED_003_SINGLE = {"b200": 4.00, "h100-sxm": 3.00, "h100-pcie": 2.50, "a100-sxm-80": 1.80, "a100-40": 1.30,
                   "rtx5090": 0.80, "rtx4090": 0.60, "rtx3090": 0.35}
SEED_003_FOUR = {"b200": 20.00, "h100-sxm": 12.00, "a100-sxm-80": 7.20, "a100-40": 5.20, "rtx5090": 3.20,
                 "rtx4090": 2.40, "rtx3090": 1.40}
# 4 models x 6,000 samples x 512 tokens (the Pareto cost analysis: "3,072,000 tokens" per model).
SEED_003_TOKENS = 4 * 6000 * 512


def seed_003_catalog(tmp_path: Path) -> Path:
    d = tmp_path / "seed003"
    shutil.copytree(PACKAGE_CATALOG, d)
    gpus = yaml.safe_load((d / "gpus.yaml").read_text())
    # The seed's table adds no load time or I/O overhead and divides tokens evenly over the copies.
    gpus["defaults"].update(decode_parallel_efficiency=1.0, decode_io_overhead_fraction=0.0,
                            decode_load_minutes=0.0)
    (d / "gpus.yaml").write_text(yaml.safe_dump(gpus))
    prices = [{"gpu": g, "per": "node", "count": 1, "usd_per_hour": p, "kind": "on-demand", "as_of": "2026-01",
               "source": "the Pareto cost analysis single"} for g, p in SEED_003_SINGLE.items()]
    prices += [{"gpu": g, "per": "node", "count": 4, "usd_per_hour": p, "kind": "on-demand", "as_of": "2026-01",
                "source": "the Pareto cost analysis 4x"} for g, p in SEED_003_FOUR.items()]
    (d / "prices.yaml").write_text(yaml.safe_dump({"prices": prices}))
    entries = [{"workload": "generate", "gpu": g, "model": "7b", "tokens_per_s": tps, "date": "2026-01",
                "source": "the Pareto cost analysis TPS table"} for g, tps in SEED_003_TPS.items()]
    (d / "calibration.yaml").write_text(yaml.safe_dump({"entries": entries}))
    return d


def test_seed_003_front_computed_exactly(tmp_path):
    cat = load_catalog(seed_003_catalog(tmp_path))
    plan = make_plan(cat, request(cat, "7b", workload="generate", tokens=SEED_003_TOKENS, counts=(1, 4)))
    assert len(plan.estimates) == 15  # the seed's 8 single and 7 four-GPU setups
    by_label = {e.setup.label: e for e in plan.estimates}
    # 4x RTX 3090: 12,288,000 / (4 x 70) s = 12.19 h at $1.40/h = $17.07.
    e = by_label["4x RTX 3090"]
    assert e.hours == pytest.approx(SEED_003_TOKENS / 280 / 3600)
    assert e.cost_usd == pytest.approx(SEED_003_TOKENS / 280 / 3600 * 1.40)
    front = {e.setup.label for e in plan.front}
    assert front == {"4x RTX 3090", "4x RTX 5090", "4x H100 SXM", "4x B200"}
    dominated_by = {e.setup.label: by.setup.label for e, by in plan.dominated}
    # The Pareto cost analysis lists "RTX 5090 (single)" and "4x A100 40GB" as Pareto optimal: both are dominated.
    assert dominated_by["1x RTX 5090"] == "4x RTX 3090"
    assert dominated_by["1x A100 PCIe 40GB"] == "4x RTX 3090"
    assert dominated_by["4x A100 PCIe 40GB"] == "4x RTX 5090"
    # Single RTX 5090 and 4x RTX 5090 cost exactly the same; the faster one wins, not float noise.
    assert by_label["1x RTX 5090"].cost_usd == pytest.approx(by_label["4x RTX 5090"].cost_usd)
    assert plan.picks.cheapest.setup.label == "4x RTX 3090"
    assert plan.picks.fastest.setup.label == "4x B200"
    assert all(e.speed_source.startswith("measured: the Pareto cost analysis") for e in plan.estimates)


def test_the_plan_counts_the_environment_build_and_says_what_blackwell_needs():
    cat = load_catalog()
    plan = make_plan(cat, request(cat, gpus=("b200", "h100-sxm")))
    for e in plan.estimates:  # the build is billed once, at the setup's price
        assert e.hours == pytest.approx(plan.tokens / e.tokens_per_s / 3600 + cat.defaults.env_build_minutes / 60)
        assert e.cost_usd == pytest.approx(e.hours * e.setup.usd_per_hour)
    assert any("min for the trainer's pinned environment" in n for n in plan.notes)
    if any(e.setup.gpu.id == "b200" for e in plan.front):
        assert any(n.startswith("B200 needs a host driver with CUDA 12.8+") for n in plan.notes), plan.notes
    assert not any("H100" in n and "needs a host driver" in n for n in plan.notes)


def test_a_gpu_no_pinned_torch_build_has_kernels_for_is_never_recommended():
    import dataclasses

    cat = load_catalog()
    # a GPU that needs a newer CUDA than cu130, the newest pinned build
    future = dataclasses.replace(cat.gpus["h100-sxm"], min_cuda="14.2")
    cat = dataclasses.replace(cat, gpus={**cat.gpus, "h100-sxm": future})
    plan = make_plan(cat, request(cat, gpus=("h100-sxm", "b200")))
    assert plan.estimates and all(e.setup.gpu.id != "h100-sxm" for e in plan.estimates)
    assert any(n.startswith("left out: H100 SXM: no kernels") for n in plan.notes), plan.notes
