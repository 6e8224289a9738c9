"""The planner counts data preparation on the pod: tokens / (measured rate per core x the pod's cores)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from gpucli.plan.catalog import load_catalog
from gpucli.plan.estimate import prepare_estimate
from gpucli.plan.explain import explain_setup as explain
from gpucli.plan.planner import PlanRequest, make_plan
from tests.support.cli import cli


def test_seed_000_twenty_billion_tokens_on_a_16_core_pod():
    byte = prepare_estimate(20e9, "byte", 16)
    bpe = prepare_estimate(20e9, "bpe", 16)
    assert byte.hours == pytest.approx(20e9 / (12.6e6 * 16) / 3600)  # ~1.7 min
    assert bpe.hours == pytest.approx(20e9 / (0.55e6 * 16) / 3600)  # ~38 min
    assert 0.6 < bpe.hours < 0.65
    with pytest.raises(ValueError):
        prepare_estimate(float("nan"))
    with pytest.raises(ValueError):
        prepare_estimate(1e9, "sentencepiece")


def test_the_plan_and_explain_carry_preparation():
    cat = load_catalog()
    plan = make_plan(cat, PlanRequest(model=cat.model("1b"), today=dt.date(2026, 11, 23), tokens=20e9,
                                      tokenizer="bpe"))
    assert plan.prepare is not None and plan.prepare.tokens == 20e9 and plan.prepare.cores == 16
    assert any(n.startswith("data preparation on the pod") and "37.9 min" in n for n in plan.notes)
    e = plan.front[0]
    x = explain(cat, plan, e.setup.label)
    assert x.prepare_cost_usd == pytest.approx(plan.prepare.hours * e.setup.usd_per_hour)
    # Training time itself is unchanged: preparation is its own line (the environment's build is in it).
    assert e.hours == pytest.approx(plan.tokens / e.tokens_per_s / 3600 + cat.defaults.env_build_minutes / 60)


def test_plan_explain_shows_how_preparation_was_estimated(capsys):
    code, out, err = cli(capsys, "plan", "--model", "1b", "--tokens", "20B", "--explain", "8x H100 SXM", "--json")
    assert code == 0, err
    x = json.loads(out)
    assert x["prepare"]["cores"] == 16 and x["prepare"]["tokens_per_s_per_core"] == 12.6e6
    assert "bench_prepare.py" in x["prepare"]["source"]
