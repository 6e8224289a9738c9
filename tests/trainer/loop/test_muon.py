"""Muon: the single-process update (PyTorch's where it ships), the distributed form on two gloo ranks,
and the optimizer split the trainer builds."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.trainer.conftest import REPO, trainer_env
from tests.trainer.loop.muon_ddp_check import make_params, run
from trainer.loop.muon import Muon, orthogonalize
from trainer.loop.optim import ChainedOptimizer, build_optimizer
from trainer.model.gpt import GPT
from trainer.spec.config import ConfigError
from trainer.spec.load import load_config
from trainer.spec.presets import MODELS, modern


def test_newton_schulz_orthogonalises():
    g = torch.randn(64, 192, generator=torch.Generator().manual_seed(1))
    o = orthogonalize(g).float()
    s = torch.linalg.svdvals(o)
    assert o.shape == g.shape and 0.6 < s.min() and s.max() < 1.25  # all singular values pulled near 1
    assert 0.6 < torch.linalg.svdvals(orthogonalize(g.T).float()).min()  # tall matrices too


@pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="this PyTorch has no torch.optim.Muon")
def test_own_muon_is_pytorchs_bit_for_bit():
    ours, theirs = make_params(), make_params()
    run(lambda ps: Muon(ps, lr=0.02, weight_decay=0.1), ours)
    run(lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1, adjust_lr_fn="original"), theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_distributed_muon_on_two_gloo_ranks_equals_one_process(tmp_path):
    out = tmp_path / "dist.pt"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(REPO / "tests" / "trainer" / "loop" / "muon_ddp_check.py"), str(out)], cwd=REPO,
                       env=trainer_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(out, weights_only=True)
    single = make_params()
    opt = run(lambda ps: Muon(ps, lr=0.02, weight_decay=0.1), single)
    start = make_params()
    for p, q, p0 in zip(got["params"], single, start, strict=True):
        assert torch.equal(p, q) and not torch.equal(p, p0)  # moved, and exactly as one process moves it
    for m, q in zip(got["momentum"], single, strict=True):
        assert torch.equal(m, opt.state[q]["momentum_buffer"])


def test_muon_takes_block_matrices_adamw_the_rest_and_state_round_trips():
    cfg = load_config(None, ["--training.max_steps=5", "--training.optimizer=muon", "--training.matrix_lr=0.02",
                             "--training.learning_rate=0.004", "--training.embedding_lr=0.2"])
    torch.manual_seed(0)
    model = GPT(modern(MODELS["tiny"]))
    opt = build_optimizer(model, cfg, fused=False)
    assert isinstance(opt, ChainedOptimizer)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"matrix", "embedding", "head"}  # parameter-free norms: no norm group
    assert len(groups["matrix"]["params"]) == 4 * 2 and all(p.ndim == 2 for p in groups["matrix"]["params"])
    assert groups["matrix"]["lr_scale"] == pytest.approx(5.0) and groups["embedding"]["lr_scale"] == pytest.approx(50)
    x = torch.randint(0, 256, (2, 32))
    model(x, x).backward()
    opt.step()
    state = opt.state_dict()
    assert state["kinds"] == ["muon", "adamw"]
    again = build_optimizer(model, cfg, fused=False)
    again.load_state_dict(state)
    p = groups["matrix"]["params"][0]
    assert torch.equal(again.optimizers[0].state[p]["momentum_buffer"], opt.optimizers[0].state[p]["momentum_buffer"])
    adamw_cfg = load_config(None, ["--training.max_steps=5"])
    with pytest.raises(ConfigError, match="optimizer state is for adamw, this run uses muon"):
        again.load_state_dict(build_optimizer(model, adamw_cfg, fused=False).state_dict())
    assert type(build_optimizer(model, cfg, fused=False, sharded=True).optimizers[0]) is Muon  # FSDP2: ours
    with pytest.raises(ConfigError, match="training.optimizer must be adamw or muon"):
        load_config(None, ["--training.max_steps=5", "--training.optimizer=sgd"])
