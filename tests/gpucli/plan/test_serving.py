"""Generation as a serving engine: the batch the VRAM holds after the weights, the weights read once a
step for the whole batch, the roofline's knee, several models side by side or in turn."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from gpucli.errors import UsageError
from gpucli.plan.catalog import load_catalog
from gpucli.plan.planner import PlanRequest, make_plan
from gpucli.plan.serving import generate_run, kv_bytes_per_token, serve_speed
from tests.support.cli import cli

TODAY = dt.date(2026, 11, 22)


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_the_batch_is_what_the_vram_left_after_the_weights_holds(cat):
    m, gpu = cat.model("7b"), cat.gpu("rtx3090")
    s = serve_speed(m, gpu, cat.defaults)
    kv_seq = kv_bytes_per_token(m, 2) * 512
    room = gpu.vram_gb * 1e9 * 0.9 - m.num_params() * 2 - cat.defaults.cuda_overhead_gb * 1e9
    assert s.batch == int(room // kv_seq) and s.fits
    # More VRAM holds more sequences, and more sequences are more tokens/s: VRAM helps.
    big = serve_speed(m, cat.gpu("a100-sxm-80"), cat.defaults)
    small = serve_speed(m, cat.gpu("a100-40"), cat.defaults)
    assert big.batch > small.batch and big.tokens_per_s > small.tokens_per_s
    # A 16 GB card cannot hold 14.6 GB of weights, the overhead and one sequence.
    assert not serve_speed(m, cat.gpu("a4000"), cat.defaults).fits


def test_weights_are_read_once_a_step_for_the_whole_batch(cat):
    m, gpu = cat.model("7b"), cat.gpu("h100-sxm")
    one = serve_speed(m, gpu, cat.defaults, max_sequences=1)
    eight = serve_speed(m, gpu, cat.defaults, max_sequences=8)
    # Eight sequences cost one weight read plus eight KV reads: far more than 1x, less than 8x.
    assert 6 < eight.tokens_per_s / one.tokens_per_s < 8
    assert one.bound == "memory"


def test_past_the_knee_the_step_is_compute_bound(cat):
    # Grouped-query attention (1 KV head) makes the cache small: the knee is reached within the cap.
    m = dataclasses.replace(cat.model("7b"), n_kv_heads=1)
    s = serve_speed(m, cat.gpu("rtx3090"), cat.defaults, max_sequences=4096)
    assert s.knee_batch < s.batch and s.bound == "compute"
    under = serve_speed(m, cat.gpu("rtx3090"), cat.defaults, max_sequences=int(s.knee_batch) - 1)
    assert under.bound == "memory"
    # Past the knee more batch adds no tokens/s beyond the compute ceiling.
    ceiling = cat.gpu("rtx3090").bf16_dense_tflops * 1e12 * 0.5 / (2 * m.param_count().flop_params)
    assert s.tokens_per_s == pytest.approx(ceiling)


def test_several_models_side_by_side_or_in_turn(cat):
    m = cat.model("7b")
    models = [dataclasses.replace(m, name=f"7b-{t}") for t in "abcd"]
    gpu = cat.gpu("rtx3090")
    one = serve_speed(m, gpu, cat.defaults).tokens_per_s
    par = generate_run(models, gpu, 4, 12_288_000, cat.defaults, order="parallel")
    seq = generate_run(models, gpu, 4, 12_288_000, cat.defaults, order="sequence")
    d = cat.defaults
    share = 12_288_000 / 4 / (one * d.decode_parallel_efficiency) / 3600
    assert par.hours == pytest.approx(share * (1 + d.decode_io_overhead_fraction) + d.decode_load_minutes / 60)
    # In turn: the same generation, but every model is loaded (on every GPU) before its turn.
    assert seq.hours == pytest.approx(share * (1 + d.decode_io_overhead_fraction) + 4 * d.decode_load_minutes / 60)
    # Fewer GPUs than models: the models queue on them.
    two = generate_run(models, gpu, 2, 12_288_000, cat.defaults)
    assert two.hours > par.hours * 1.9


def test_seed_003_job_is_about_one_gpu_hour_not_nineteen(cat):
    req = PlanRequest(model=cat.model("7b"), today=TODAY, workload="generate", tokens=12_288_000, counts=(1, 4),
                      gpus=("rtx3090", "h100-sxm"))
    plan = make_plan(cat, req)
    by = {e.setup.label: e for e in plan.estimates}
    assert by["1x H100 SXM"].hours < 1.0 and by["4x RTX 3090"].hours < 2.0
    assert by["4x RTX 3090"].micro_batch == serve_speed(cat.model("7b"), cat.gpu("rtx3090"), cat.defaults).batch
    assert any("bandwidth" in n for n in plan.notes) and any("max_num_seqs" in n for n in plan.notes)


def test_several_models_are_for_generation_only(cat):
    with pytest.raises(UsageError, match="generate only"):
        make_plan(cat, PlanRequest(model=cat.model("1b"), today=TODAY, more_models=(cat.model("1b"),)))


def test_plan_takes_several_models_and_a_count(capsys):
    code, out, err = cli(capsys, "plan", "--model", "7b", "--model", "7b-b", "--workload", "generate",
                         "--tokens", "12.288M", "--gpu", "rtx3090", "--max-gpus", "4", "--json")
    assert code == 0, err
    code2, out2, err2 = cli(capsys, "plan", "--model", "7b", "--models", "2", "--workload", "generate",
                            "--tokens", "12.288M", "--gpu", "rtx3090", "--max-gpus", "4", "--json")
    assert code2 == 0, err2
    import json

    a, b = json.loads(out), json.loads(out2)
    assert [e["hours"] for e in a["front"]] == pytest.approx([e["hours"] for e in b["front"]])
    code, _, err = cli(capsys, "plan", "--model", "7b", "--order", "sideways", "--workload", "generate",
                       "--tokens", "1M")
    assert code == 2 and "unknown order" in err
