"""Two-stage runs (the Atlas 1B build plan's TNT): a phase states each stage's steps and memory chunk size; launch writes
them and plans each stage, plan checks the fit at each chunk; without --steps both stages run."""

from __future__ import annotations

import datetime as dt

from gpucli.plan.catalog import load_catalog
from gpucli.plan.planner import PlanRequest, make_plan
from gpucli.run.inputs.launch import LaunchRequest, resolve


def _resolve(**kw):
    return resolve(load_catalog(), LaunchRequest(**kw).checked(), run_name="t")


def test_the_tnt_phase_is_seed_000s_two_stages():
    r = _resolve(profile="h200", provider="runpod", model="1b-atlas", phase="tnt",
                 extra=("--training.batch_size=2", "--training.grad_accum_steps=64", "--data.tokenizer=bpe"))
    t = r.trainer_config["training"]
    assert (t["stage1_steps"], t["stage2_steps"], t["max_steps"]) == (80000, 8000, 88000)
    assert (t["stage1_chunk_size"], t["stage2_chunk_size"], t["seq_len"]) == (2048, 256, 4096)
    assert r.steps == 88000 and r.limits.max_steps == 88000
    # Stage 2's smaller chunks cost more a token than stage 1's alone would.
    one = _resolve(profile="h200", provider="runpod", model="1b-atlas",
                   extra=("--training.batch_size=2", "--training.grad_accum_steps=64", "--data.tokenizer=bpe",
                          "--training.max_steps=88000"))
    assert r.planned.tokens_per_s != one.planned.tokens_per_s


def test_stages_set_by_hand_are_not_cut_to_the_phases_iterations():
    r = _resolve(profile="cpu", provider="local", model="tiny",
                 extra=("--training.stage1_steps=30", "--training.stage2_steps=10"))
    assert r.steps == 40 and r.trainer_config["training"]["max_steps"] == 40
    # --steps still wins.
    r = _resolve(profile="cpu", provider="local", model="tiny", extra=("--training.stage1_steps=30",
                                                                       "--training.stage2_steps=10"),
                 limits=__import__("gpucli.runs.limits", fromlist=["Limits"]).Limits(max_steps=12))
    assert r.steps == 12


def test_a_plain_model_in_a_two_stage_phase_gets_no_chunk_sizes():
    r = _resolve(profile="8xH100", provider="runpod", model="1b", phase="tnt")
    t = r.trainer_config["training"]
    assert t["stage1_steps"] == 80000 and "stage1_chunk_size" not in t


def test_plan_checks_the_fit_at_each_stages_chunk():
    cat = load_catalog()
    today = dt.date(2026, 11, 22)
    stages = cat.phase("tnt").stages.shares()
    base = make_plan(cat, PlanRequest(model=cat.model("1b-atlas"), today=today, gpus=("h100-sxm",), counts=(1,)))
    two = make_plan(cat, PlanRequest(model=cat.model("1b-atlas"), today=today, gpus=("h100-sxm",), counts=(1,),
                                     stages=stages))
    (b,), (s,) = base.estimates, two.estimates
    assert s.micro_batch < b.micro_batch  # stage 2 keeps M and S every 256 tokens
    assert s.tokens_per_s != b.tokens_per_s
