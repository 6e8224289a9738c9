"""The Atlas memory and the refinement steps in the fit check, and the memory's fp32 path in the speed."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from gpucli.plan.catalog import load_catalog
from gpucli.plan.estimate import (
    activation_bytes_per_token,
    choose_micro_batch,
    memory_activation_bytes_per_token,
    plain_block_bytes_per_token,
    speed_flops_per_token,
    train_memory,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def _measure_module():
    spec = importlib.util.spec_from_file_location("measure_saved", ROOT / "scripts" / "measure_saved.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("shape", [(64, 64, 64, 128, 16, 2, 256), (96, 64, 128, 64, 8, 3, 256)])
def test_the_memory_constant_matches_the_trainers_saved_tensors(shape):
    pytest.importorskip("torch")
    import torch

    torch.set_num_threads(1)
    d, dk, dv, chunk, window, poly, t = shape
    measured = _measure_module().memory_block(d, dk, dv, chunk, window, poly, t)
    # Fitted on scripts/measure_saved.py's grid; off it (the second shape) within a few percent, on the high side.
    assert 0.97 * measured <= memory_activation_bytes_per_token(d, dk, dv, chunk, window, poly) <= 1.08 * measured


def test_1b_atlas_does_not_fit_micro_batch_8_on_an_h100(cat):
    m, gpu = cat.model("1b-atlas"), cat.gpu("h100-sxm")
    fr = choose_micro_batch(m, cat.defaults, gpu.vram_gb, 1, 4096)
    assert fr.memory.micro_batch <= 2
    # Batch 4 at 4096 tokens: the memory's saved tensors alone are ~4x the plain blocks'.
    at4 = train_memory(m, cat.defaults, 4, 4096)
    assert at4.total_gb > 100
    plain = dataclasses.replace(m, memory=False)
    assert activation_bytes_per_token(m, 4096) > 4 * activation_bytes_per_token(plain, 4096)
    # Stage 2's smaller chunk keeps M and S per chunk: the fit checks every stage's chunk.
    both = choose_micro_batch(m, cat.defaults, 141, 1, 4096, chunks=(2048, 256))
    one = choose_micro_batch(m, cat.defaults, 141, 1, 4096, chunks=(2048,))
    assert both.memory.total_gb >= one.memory.total_gb or both.memory.micro_batch < one.memory.micro_batch


def test_refinement_steps_keep_a_pass_each(cat):
    m = cat.model("124m")
    r = dataclasses.replace(m, refine_steps=4, refine_layers=2)
    assert activation_bytes_per_token(r) - activation_bytes_per_token(m) == pytest.approx(
        8 * plain_block_bytes_per_token(m))


def test_the_memorys_fp32_path_slows_the_speed(cat):
    m = cat.model("1b-atlas")
    assert speed_flops_per_token(m, 4096) > 1.2 * m.train_flops_per_token(4096)
    plain = cat.model("1b")
    assert speed_flops_per_token(plain, 4096) == pytest.approx(plain.train_flops_per_token(4096))
