"""TRM-style refinement: the loss as its docstring defines it, the summary the cloud training guide prints, the
order alert, refinement helping on a small CPU task, and a trainer run that reports it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import yaml

from tests.trainer.conftest import REPO, read_rows, run_trainer, tiny_args
from trainer.data.loader import TokenSplit
from trainer.model.gpt import GPT
from trainer.model.refine import RefineWatch, refinement_objective, step_weights, summarize
from trainer.spec.presets import MODELS


def test_the_objective_is_the_documented_formula():
    losses = [torch.tensor(3.0, requires_grad=True), torch.tensor(2.0, requires_grad=True),
              torch.tensor(2.5, requires_grad=True)]
    w = step_weights(2, 5.0)
    assert w == pytest.approx([1 / (1 + 5**0.5 + 5), 5**0.5 / (1 + 5**0.5 + 5), 5 / (1 + 5**0.5 + 5)])
    got = refinement_objective(losses, 5.0, 1.0)
    softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731
    want = w[0] * 3.0 + w[1] * 2.0 + w[2] * 2.5 + 1.0 / 2 * (softplus(2.0 - 3.0) + softplus(2.5 - 2.0))
    assert float(got.detach()) == pytest.approx(want)
    got.backward()
    # The improvement term reaches only the later step of each pair (the earlier one is stop-gradient).
    assert float(losses[0].grad) == pytest.approx(w[0])
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert float(losses[2].grad) == pytest.approx(w[2] + 0.5 * sig(0.5))
    assert float(refinement_objective(losses, 1.0, 0.0).detach()) == pytest.approx(7.5 / 3)


def test_summary_line_and_order_alert():
    s = summarize([10.5, 9.2, 8.7, 8.5])
    assert s.order_holds and s.refinement == pytest.approx(1 - 8.5 / 10.5)
    assert s.line() == "step_0: 10.500 > step_1: 9.200 > step_2: 8.700 > step_3: 8.500  refinement 19.0 %"
    assert s.row() == {"losses": [10.5, 9.2, 8.7, 8.5], "order_holds": True, "refinement_pct": 19.048}
    broken = summarize([5.0, 4.9, 4.95])
    assert not broken.order_holds and "step_1: 4.900 !> step_2: 4.950" in broken.line()
    w = RefineWatch()
    assert [w.update(x) for x in (s, broken, broken, s, broken)] == [False, True, False, False, True]


def test_phases_carry_seed_002s_refinement_values():
    phases = yaml.safe_load((REPO / "gpucli" / "profiles" / "phases.yaml").read_text())["phases"]
    got = {name: (p["refinement"]["supervision_weight_base"], p["refinement"]["improvement_reward_scale"])
           for name, p in phases.items() if "refinement" in p}
    assert got == {"fast": (5.0, 1.0), "extreme": (10.0, 2.0)}
    assert "refinement" not in phases["tnt"]  # the Atlas 1B build plan's two-stage memory phase: no refinement knobs


def test_refinement_helps_on_a_small_cpu_task(data_dir):
    """A 1-layer backbone and one shared block applied twice, 300 AdamW steps on bytes: each step's
    held-out loss is below the one before."""
    torch.manual_seed(0)
    tok = np.asarray(TokenSplit(data_dir, "train").tokens)
    rng = np.random.default_rng(0)

    def batch(b: int = 8, t: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        starts = rng.integers(0, len(tok) - t - 1, b)
        x = np.stack([tok[i : i + t + 1] for i in starts]).astype(np.int64)
        return torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])

    spec = dataclasses.replace(MODELS["tiny"], n_layers=1, refine_steps=2, refine_layers=1, vocab_size=320)
    model = GPT(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    held_out = [batch() for _ in range(4)]
    for _ in range(300):
        x, y = batch()
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        per_step = []
        for x, y in held_out:
            last = model(x, y)
            assert model.refine_losses is not None and float(last) == float(model.refine_losses[-1])
            per_step.append(model.refine_losses)
    s = summarize(torch.stack(per_step).mean(0).tolist())
    assert s.order_holds and s.refinement > 0.005, s.line()
    assert s.losses[0] < 2.4  # it learned something at all
    assert model(held_out[0][0]).shape == (8, 320)  # generation reads the last step's logits


def test_a_trainer_run_with_refinement_reports_each_validation(data_dir, tmp_path):
    out = tmp_path / "run"
    over = {"model.refine_steps": 3, "training.refinement.supervision_weight_base": 10.0,
            "training.refinement.improvement_reward_scale": 2.0}
    r = run_trainer(tiny_args(data_dir, out, **over))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_rows(out)
    val = [x for x in rows if x.get("kind") == "val"]
    assert len(val) == 2
    for v in val:
        ref = v["refine"]
        assert len(ref["losses"]) == 4 and isinstance(ref["order_holds"], bool)
        assert ref["refinement_pct"] == pytest.approx(100 * (1 - ref["losses"][-1] / ref["losses"][0]), abs=1e-2)
        assert v["val_loss"] == pytest.approx(ref["losses"][-1], abs=1e-4)  # val loss is the last step's
    train = [x for x in rows if x.get("kind") == "train"]
    assert all("objective" in x and x["objective"] != x["loss"] for x in train)
    assert "refinement step_0: " in r.stderr
    broken = [x for x in rows if x.get("event") == "refinement_order"]
    assert all(not v["refine"]["order_holds"] for v in val if any(b["step"] == v["step"] for b in broken))
