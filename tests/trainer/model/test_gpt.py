"""The GPT's parts in process: the fused loss, parameter counts against the planner, every architecture choice."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from trainer.model.gpt import GPT, chunked_cross_entropy
from trainer.spec.config import ConfigError
from trainer.spec.load import load_config
from trainer.spec.modelspec import SpecError, unsupported_fields
from trainer.spec.presets import MODELS
from trainer.spec.resolve import resolve_shape


def _tiny(**kw):
    return dataclasses.replace(MODELS["tiny"], **kw)



def test_fused_chunked_loss_matches_reference_loss_and_grads():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    tgt = torch.randint(0, 50, (37,))
    tgt[:5] = -1  # ignored positions
    loss = chunked_cross_entropy(h, w, tgt, chunk_rows=8)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = F.cross_entropy(h @ w.t(), tgt, ignore_index=-1)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)
    with torch.no_grad():  # the eval path computes no gradients but the same loss
        assert torch.allclose(chunked_cross_entropy(h, w, tgt, 8), ref, atol=1e-5)



def test_model_hidden_states_and_param_counts():
    shape = resolve_shape("tiny", data_vocab_size=257)
    assert shape.vocab_size == 320  # padded to a multiple of 64
    m = GPT(shape)
    loss, hidden = m(torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16)), return_hidden=True)
    assert loss.ndim == 0 and len(hidden) == shape.n_layers + 1 and hidden[-1].shape == (2, 16, 64)
    # The nanoGPT benchmark shape: 124M params with the tied head counted once, positions excluded.
    big = resolve_shape("124m", vocab_size=50304)
    n = 12 * (4 * 768 * 768 + 2 * 768 * 3072 + 2 * 768) + 50304 * 768 + 768
    with torch.device("meta"):
        g = GPT(big)
    assert g.num_params() == n
    assert g.flops_per_token(1024) == 6 * n + 12 * 12 * 768 * 1024
    with pytest.raises(ValueError, match="smaller than the data"):
        resolve_shape("tiny", data_vocab_size=257, vocab_size=100)



@pytest.mark.parametrize("name", list(MODELS))
def test_every_preset_builds_the_parameter_count_the_planner_prices(name):
    """One description: the planner's count for a preset is the built model's, exactly, and the trainer
    builds every preset as described (no substitution)."""
    from gpucli.plan.catalog import load_catalog
    from gpucli.plan.estimate import count_params

    spec = MODELS[name]
    planned = count_params(load_catalog().model(name))
    assert planned == spec.param_count()
    assert unsupported_fields(spec) == []
    with torch.device("meta"):
        g = GPT(spec)
    assert g.num_params(exclude_position=False) == planned.total == spec.num_params()
    assert g.num_params() == planned.total - planned.position  # the trainer's count leaves out a table
    assert g.flops_per_token(spec.max_seq_len) == spec.train_flops_per_token()
    assert (g.wpe is None) == (spec.pos_embedding == "rope") and (g.lm_head is None) == spec.tied_embeddings
    assert g.blocks[0].mlp.kind == spec.mlp and (g.blocks[0].attn.q_norm is not None) == spec.qk_norm



def test_model_description_checks_and_the_trainer_builds_each_choice():
    with pytest.raises(SpecError, match="n_kv_heads: n_heads 12 is not divisible by n_kv_heads 5"):
        dataclasses.replace(MODELS["124m"], n_kv_heads=5)
    with pytest.raises(SpecError, match="mlp: must be one of gelu, swiglu, relu2"):
        dataclasses.replace(MODELS["124m"], mlp="tanh")
    with pytest.raises(SpecError, match="logit_softcap"):
        dataclasses.replace(MODELS["124m"], logit_softcap=float("nan"))
    gqa = dataclasses.replace(MODELS["124m"], mlp="relu2", norm="rmsnorm", qk_norm=True, n_kv_heads=4,
                              logit_softcap=15.0)
    assert unsupported_fields(gqa) == []
    # Counted by hand: GQA shrinks k and v to 4 heads of 64; parameter-free norms count nothing.
    p = gqa.param_count()
    assert p.attention == 12 * (2 * 768 * 768 + 2 * 768 * 256) and p.norms == 0
    assert MODELS["7b"].param_count().mlp == 32 * 3 * 4096 * 11008
    assert MODELS["124m"] == dataclasses.replace(MODELS["124m"], name="x")  # 124m stays GPT-2
    assert (MODELS["124m"].mlp, MODELS["124m"].norm, MODELS["124m"].pos_embedding) == ("gelu", "layernorm", "learned")
    d24 = MODELS["d24"]
    assert (d24.mlp, d24.norm, d24.qk_norm, d24.logit_softcap, d24.tied_embeddings) == ("relu2", "rmsnorm", True,
                                                                                        15.0, False)



def test_softcapped_fused_loss_matches_the_reference():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    tgt = torch.randint(0, 50, (37,))
    tgt[:3] = -1
    loss = chunked_cross_entropy(h, w, tgt, chunk_rows=8, softcap=5.0)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = F.cross_entropy(5.0 * torch.tanh((h @ w.t()) / 5.0), tgt, ignore_index=-1)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(chunked_cross_entropy(h, w, tgt, 8, softcap=5.0), ref, atol=1e-5)



def test_gqa_equals_multi_head_attention_with_repeated_kv_heads():
    """A grouped-query model is the plain multi-head model whose key/value heads are repeated."""
    torch.manual_seed(0)
    gqa = GPT(_tiny(n_heads=4, n_kv_heads=2, pos_embedding="rope"))
    mha = GPT(_tiny(n_heads=4, pos_embedding="rope"))
    sd = gqa.state_dict()
    for i in range(2):
        w = sd[f"blocks.{i}.attn.qkv.weight"]
        q, k, v = w.split([64, 32, 32])
        rep = [t.view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64) for t in (k, v)]
        sd[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q, *rep])
    mha.load_state_dict(sd)
    x = torch.randint(0, 256, (2, 24))
    assert torch.allclose(gqa(x, x), mha(x, x), atol=1e-5)



def test_rope_attends_by_relative_position_and_init_suits_each_architecture():
    from trainer.model.gpt import apply_rotary, rotary_tables

    cos, sin = rotary_tables(64, 16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return float((apply_rotary(q, cos[i : i + 1], sin[i : i + 1]) * apply_rotary(k, cos[j : j + 1], sin[j : j + 1])).sum())

    assert score(5, 3) == pytest.approx(score(40, 38), abs=1e-4) and score(5, 3) != pytest.approx(score(5, 4), abs=1e-3)
    torch.manual_seed(0)
    modern = GPT(dataclasses.replace(MODELS["d24"], d_model=64, n_layers=2, n_heads=2, d_ff=256, vocab_size=256,
                                     max_seq_len=64))
    assert modern.wpe is None and "rope_cos" not in modern.state_dict()
    x = torch.randint(0, 256, (2, 32))
    # nanochat's init: zero head, so the first prediction is uniform.
    assert float(modern(x, x).detach()) == pytest.approx(math.log(256), abs=1e-5)
    assert float(modern.blocks[0].attn.proj.weight.detach().abs().sum()) == 0.0
    for spec in (_tiny(mlp="swiglu", n_kv_heads=1), _tiny(norm="rmsnorm", qk_norm=True, logit_softcap=30.0),
                 _tiny(pos_embedding="rope", qk_norm=True, tied_embeddings=False)):
        m = GPT(spec)
        loss = m(x, x)
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in m.parameters())
        assert m(x).shape == (2, 256)
    with torch.device("meta"):  # FSDP builds on meta, then to_empty + reset_parameters fill the tables
        late = GPT(_tiny(pos_embedding="rope"))
    late.to_empty(device="cpu")
    late.reset_parameters()
    assert torch.allclose(late.rope_cos, rotary_tables(256, 32)[0])



def test_fp8_is_refused_where_it_cannot_run():
    from trainer.loop.dist import Dist, build_model
    from trainer.model.fp8 import fp8_problem
    from trainer.spec.config import Config

    assert "this run is on cpu" in fp8_problem(torch.device("cpu"))
    cfg = load_config(None, ["--training.max_steps=5", "--hardware.fp8=true", "--hardware.device=cpu"])
    with pytest.raises(ConfigError, match="hardware.fp8 needs a CUDA GPU of compute capability >= 8.9") as e:
        build_model(cfg, Dist(0, 0, 1, torch.device("cpu")), MODELS["tiny"], amp=False)
    assert "\n" not in str(e.value)
    assert Config().hardware.fp8 is False  # off unless asked for
