"""The KV cache against the model's own forward pass: same logits at every step, rows of different
lengths in one step, and a finished row replaced by the last one, for every architecture the presets
name (learned and rotary positions, grouped KV heads, QK-norm, each MLP, soft-capped and untied heads,
the Atlas memory across chunk ends, refinement steps); sampling parameters."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.infer.kvcache import KVCache, SamplingParams, sample
from trainer.model.gpt import GPT
from trainer.spec.modelspec import ModelSpec
from trainer.spec.presets import MODELS, modern


def _tiny(spec: ModelSpec, **over: object) -> ModelSpec:
    """``spec``'s architecture at a width that runs in milliseconds."""
    mem = {"d_key": 24, "d_value": 16, "context_window": 3} if spec.memory else {}
    return dataclasses.replace(spec, d_model=64, n_layers=2, n_heads=4, d_ff=96, vocab_size=97, max_seq_len=80,
                               **{**mem, **over})  # type: ignore[arg-type]


def _architectures() -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for name, spec in MODELS.items():
        arch = _tiny(spec)
        if arch not in out.values():  # ModelSpec compares by architecture, not by name
            out[name] = arch
    rope = MODELS["7b"]
    out["7b-gqa"] = _tiny(rope, n_kv_heads=2)
    out["d24-gqa"] = _tiny(MODELS["d24"], n_kv_heads=1)
    out["1.31b-modern-gqa"] = _tiny(modern(MODELS["1.31b"]), n_kv_heads=2)
    out["tiny-refine"] = _tiny(MODELS["tiny"], refine_steps=2, refine_layers=1)
    out["1b-atlas-refine-gqa"] = _tiny(MODELS["1b-atlas"], refine_steps=2, n_kv_heads=2)
    return out


ARCHS = _architectures()


def _random_model(spec: ModelSpec) -> GPT:
    """Weights away from the init (zero projections and heads would make every logit equal)."""
    torch.manual_seed(0)
    model = GPT(spec).eval()
    model.set_memory_options(chunk_size=8)  # chunk ends fall inside prompts and decoding alike
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(std=p.shape[1] ** -0.5)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("name", sorted(ARCHS))
@torch.no_grad()
def test_every_architecture_decodes_with_the_cache_as_the_full_forward(name):
    model = _random_model(ARCHS[name])
    cache = KVCache(model, 4, device="cpu", dtype=torch.float32)
    seqs = [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [11, 3], [40] * 7]
    worst = 0.0
    for s in seqs:
        _, logits = cache.prefill(s)
        worst = max(worst, float((logits - model(torch.tensor([s]))[0]).abs().max()))
    gen = torch.Generator().manual_seed(1)
    nxt = torch.randint(0, 97, (4,), generator=gen).tolist()
    for step in range(32):
        logits = cache.decode(nxt)
        for i in range(cache.n):
            seqs[i] = seqs[i] + [nxt[i]]
            full = model(torch.tensor([seqs[i]]))[0]
            worst = max(worst, float((logits[i] - full).abs().max()))
        nxt = logits.argmax(-1).tolist()
        if step == 12:  # row 1 finishes: the last row (its keys, values and memory) moves into it
            assert cache.release(1) == 3
            seqs[1], nxt[1] = seqs.pop(), nxt.pop()
    assert cache.lengths[: cache.n] == [len(s) for s in seqs]
    assert float(logits.std()) > 0.1  # logits that differ, so equal ones mean something
    assert worst <= 1e-5, f"{name}: cached logits differ from the full forward by {worst:.2e}"


def test_cached_batched_decoding_equals_full_forward():
    torch.manual_seed(0)
    model = GPT(MODELS["tiny"]).eval()
    cache = KVCache(model, 4, device="cpu", dtype=torch.float32)
    seqs = [[1, 2, 3], [5, 6, 7, 8, 9, 10], [11]]
    for s in seqs:
        _, logits = cache.prefill(s)
        torch.testing.assert_close(logits, model(torch.tensor([s]))[0])
    nxt = [4, 11, 12]
    for step in range(6):
        logits = cache.decode(nxt)
        assert logits.shape == (len(nxt), model.shape.vocab_size)
        for i in range(cache.n):
            seqs[i] = seqs[i] + [nxt[i]]
            torch.testing.assert_close(logits[i], model(torch.tensor([seqs[i]]))[0], rtol=1e-4, atol=1e-5)
        nxt = [t + 1 for t in nxt]
        if step == 1:  # row 0 finishes: the last row moves into it
            assert cache.release(0) == 2
            seqs[0], nxt[0] = seqs.pop(), nxt.pop()
    assert cache.lengths[: cache.n] == [len(s) for s in seqs]


def test_sampling_rows_follow_their_own_parameters():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9]] * 4)
    gen = torch.Generator().manual_seed(0)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=2.0, top_k=1),
              SamplingParams(temperature=1.0, top_p=0.01), SamplingParams(temperature=1.0, top_k=2)]
    for _ in range(50):
        a, b, c, d = sample(logits, params, gen)
        assert a == b == c == 1
        assert d in (1, 3)
