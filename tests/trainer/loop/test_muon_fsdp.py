"""Muon under FSDP2 on two gloo ranks (the same update as one process, exact resume, the trainer end to
end), nanochat's momentum warmup, and the hardware.compile choice (whole-model compile trains on CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from tests.trainer.conftest import REPO, run_trainer, tiny_args, trainer_env
from tests.trainer.loop.muon_fsdp_check import grads, make_model, make_params, model_config, train_step
from trainer.loop.dist import compile_model
from trainer.loop.muon import Muon, shard_rows
from trainer.loop.optim import build_optimizer, lr_factor, muon_momentum, set_schedule
from trainer.spec.config import ConfigError
from trainer.spec.load import load_config


def torchrun_check(mode: str, out) -> dict:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(REPO / "tests" / "trainer" / "loop" / "muon_fsdp_check.py"), mode, str(out)], cwd=REPO,
                       env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out, weights_only=True)


def test_shard_rows_is_torch_chunks_split():
    assert shard_rows(5, 2) == [3, 2] and shard_rows(1, 2) == [1, 0] and shard_rows(48, 2) == [24, 24]
    assert shard_rows(10, 4) == [3, 3, 3, 1] and shard_rows(6, 4) == [2, 2, 2, 0]


def test_fsdp2_muon_on_two_gloo_ranks_equals_one_process_bit_for_bit(tmp_path):
    """Uneven row splits (5 = 3 + 2), an empty shard (1 row) and rounds with fewer matrices than ranks."""
    got = torchrun_check("optimizer", tmp_path / "opt.pt")
    single = make_params()
    opt = Muon(single, lr=0.02, weight_decay=0.1)
    for step in range(3):
        for p, g in zip(single, grads(step), strict=True):
            p.grad = g.clone()
        opt.step()
    for p, q, p0 in zip(got["params"], single, make_params(), strict=True):
        assert torch.equal(p, q) and not torch.equal(p, p0)
    for m, q in zip(got["momentum"], single, strict=True):
        assert torch.equal(m, opt.state[q]["momentum_buffer"])


def test_fsdp2_model_step_matches_one_process_and_resumes_exactly(tmp_path):
    got = torchrun_check("model", tmp_path / "model.pt")
    model = make_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = build_optimizer(model, model_config(), fused=False)  # one process: PyTorch's Muon where it ships
    train_step(model, opt, 0, slice(0, 4))
    one = model.state_dict()
    # The gradients differ only in summation order (two half batches reduced vs one batch).
    for k, v in one.items():
        torch.testing.assert_close(got["one"][k], v, rtol=1e-5, atol=1e-6)
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-3  # the step moved the weights
    for k in got["straight"]:  # resumed after step 1 from the saved sharded state: the same bits
        assert torch.equal(got["straight"][k], got["resumed"][k]), k
    assert len(got["resumed_momenta"]) == 2 * 4
    for a, b in zip(got["straight_momenta"], got["resumed_momenta"], strict=True):
        assert torch.equal(a, b) and a.abs().sum() > 0


def test_trainer_with_muon_under_fsdp2_on_two_ranks_resumes_exactly(data_dir, tmp_path):
    out = tmp_path / "run"
    over = {"training.max_steps": 12, "training.checkpoint_interval": 6, "training.val_interval": 6,
            "training.optimizer": "muon", "training.matrix_lr": 0.02, "training.embedding_lr": 0.1,
            "training.muon_momentum_warmup_steps": 8, "model.norm": "rmsnorm", "model.pos_embedding": "rope",
            "model.mlp": "relu2", "model.tie_embeddings": "false", "model.dropout": 0.0}
    args = [*tiny_args(data_dir, out, **over), "--hardware.fsdp=on"]
    r = run_trainer(args, nproc=2, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "muon, FSDP x2" in r.stderr
    losses = {x["step"]: x["loss"] for x in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
              if x.get("kind") == "train"}
    assert losses[12] < losses[1] - 0.3, losses
    assert (out / "checkpoints" / "step_000006" / "optim_rank1.pt").exists()
    again = tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step_000012")
    (again / "metrics.jsonl").write_text("")
    r = run_trainer([*tiny_args(data_dir, again, **over), "--hardware.fsdp=on", "--resume=auto"], nproc=2,
                    timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step_000006" in r.stderr
    resumed = {x["step"]: x["loss"] for x in map(json.loads, (again / "metrics.jsonl").read_text().splitlines())
               if x.get("kind") == "train"}
    assert [resumed[s] for s in (7, 9, 12)] == [losses[s] for s in (7, 9, 12)]


def test_muon_momentum_warms_up_as_nanochat_and_only_on_muon():
    assert muon_momentum(0, 0.85, 0.95, 300) == 0.85
    assert muon_momentum(150, 0.85, 0.95, 300) == pytest.approx(0.90)
    assert muon_momentum(300, 0.85, 0.95, 300) == muon_momentum(10_000, 0.85, 0.95, 300) == 0.95
    assert muon_momentum(0, 0.85, 0.95, 0) == 0.95
    cfg = load_config(None, ["--training.max_steps=1000", "--training.optimizer=muon"])
    t = cfg.training
    assert (t.muon_momentum_start, t.muon_momentum, t.muon_momentum_warmup_steps) == (0.85, 0.95, 300)
    model = make_model()
    opt = build_optimizer(model, cfg, fused=False)
    assert opt.optimizers[0].param_groups[0]["momentum"] == 0.85  # the first update's, before any schedule call
    set_schedule(opt, t, 60, 1000)
    muon, adamw = opt.optimizers
    assert muon.param_groups[0]["momentum"] == pytest.approx(0.87)
    assert all("momentum" not in g for g in adamw.param_groups)
    factor = lr_factor(60, t.warmup_steps, 1000, t.min_lr / t.learning_rate)
    assert muon.param_groups[0]["lr"] == pytest.approx(t.learning_rate * muon.param_groups[0]["lr_scale"] * factor)
    plain_cfg = load_config(None, ["--training.max_steps=10"])
    plain = build_optimizer(model, plain_cfg, fused=False)
    set_schedule(plain, plain_cfg.training, 3, 10)  # AdamW only: no momentum key
    assert all("momentum" not in g for g in plain.param_groups)
    for bad in ("--training.muon_momentum=1.0", "--training.muon_momentum_start=-0.1",
                "--training.muon_momentum=nan", "--training.muon_momentum_warmup_steps=-1"):
        with pytest.raises(ConfigError, match="training.muon_momentum"):
            load_config(None, ["--training.max_steps=5", bad])


def test_sharded_muon_is_ours_not_pytorchs():
    cfg = model_config()
    opt = build_optimizer(make_model(), cfg, fused=False, sharded=True)
    assert type(opt.optimizers[0]) is Muon
    assert list(opt) == list(opt.optimizers)  # what torch.distributed.checkpoint takes as a list of optimizers


def test_hardware_compile_choices():
    base = ["--training.max_steps=5"]
    assert load_config(None, base).hardware.compile == "blocks"
    assert load_config(None, [*base, "--hardware.compile=true"]).hardware.compile == "blocks"  # older run files
    assert load_config(None, [*base, "--hardware.compile=false"]).hardware.compile == "off"
    assert load_config(None, [*base, "--hardware.compile=model"]).hardware.compile == "model"
    with pytest.raises(ConfigError, match="hardware.compile must be off, blocks, model, got 'graph'"):
        load_config(None, [*base, "--hardware.compile=graph"])


def test_whole_model_compile_trains_on_cpu():
    """hardware.compile=model traces the whole forward (the fused chunked loss included) and trains as
    eager does. aot_eager: dynamo and AOT autograd without inductor's C++ build, so the suite stays fast."""
    torch._dynamo.reset()
    eager, compiled = make_model(), make_model()
    compile_model(compiled, "model", backend="aot_eager")
    cfg = model_config()
    losses: dict[str, list[float]] = {"eager": [], "model": []}
    for name, m in (("eager", eager), ("model", compiled)):
        opt = build_optimizer(m, cfg, fused=False)
        for step in range(3):
            set_schedule(opt, cfg.training, step, 10)
            x = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(step))
            loss = m(x, torch.roll(x, -1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[name].append(loss.item())
    assert compiled._compiled_call_impl is not None  # Module.compile in place: the keys stay plain
    assert set(compiled.state_dict()) == set(eager.state_dict())
    assert losses["model"][-1] < losses["model"][0]
    assert losses["model"] == pytest.approx(losses["eager"], rel=1e-4)
    torch._dynamo.reset()
