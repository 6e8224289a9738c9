"""The optimizers (AdamW alone, or Muon for the block matrices with AdamW for the rest), the warmup +
cosine LR schedule and Muon's momentum warmup."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainer.loop.muon import Muon
from trainer.spec.config import Config, ConfigError, TrainingConfig

MUON_WEIGHT_DECAY = 0.0
"""nanochat trains its Muon matrices without weight decay (nanochat/gpt.py ``setup_optimizers``); at
Muon's learning rates (~0.02) AdamW's 0.1 would shrink every matrix by 0.2 % a step."""


def lr_factor(step: int, warmup: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine down to ``min_ratio`` at max_steps."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if max_steps <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def muon_momentum(step: int, start: float, end: float, warmup_steps: int) -> float:
    """Muon's momentum at ``step`` (0 = the first update): linear from ``start`` to ``end`` over
    ``warmup_steps``, then ``end``. nanochat's base_train ``get_muon_momentum`` with 0.85, 0.95 and
    300 (karpathy/nanochat scripts/base_train.py, e.g. commit 23acb17; later versions warm to 0.97
    over 400 steps). A function of the step alone, so a resumed run repeats it exactly."""
    if warmup_steps <= 0:
        return end
    frac = min(step / warmup_steps, 1.0)
    return (1 - frac) * start + frac * end


class ChainedOptimizer:
    """Several optimizers stepped as one: their groups in one list (each group keeps its ``name``
    and ``lr_scale``), one state dict holding each one's, in order."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def kinds(self) -> list[str]:
        return [type(o).__name__.lower() for o in self.optimizers]

    def __iter__(self):
        """The optimizers, so ``torch.distributed.checkpoint.state_dict``'s get/set_optimizer_state_dict
        take a ChainedOptimizer as the list of optimizers they accept (FSDP2 checkpoints)."""
        return iter(self.optimizers)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"kinds": self.kinds, "states": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("kinds") != self.kinds:
            got = state.get("kinds") if isinstance(state, dict) and "kinds" in state else ["adamw"]
            raise ConfigError(f"the checkpoint's optimizer state is for {'+'.join(got)}, this run uses "
                              f"{'+'.join(self.kinds)} (set training.optimizer to match, or start fresh)")
        for o, s in zip(self.optimizers, state["states"], strict=True):
            o.load_state_dict(s)


def _split(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """embedding (token and position tables), head (an untied LM head), matrix (2-D, in the blocks)
    and norm (1-D) parameters."""
    parts: dict[str, list[torch.nn.Parameter]] = {"embedding": [], "head": [], "matrix": [], "norm": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        owner = name.split(".")[-2]
        if owner in ("wte", "wpe"):
            parts["embedding"].append(p)
        elif owner == "lm_head":
            parts["head"].append(p)
        elif p.dim() >= 2:
            parts["matrix"].append(p)
        else:
            parts["norm"].append(p)
    return parts


def build_optimizer(model: torch.nn.Module, cfg: Config, fused: bool, *, rank: int = 0, world: int = 1,
                    sharded: bool = False) -> torch.optim.Optimizer | ChainedOptimizer:
    """training.optimizer=adamw: one AdamW, groups embedding (own LR, no decay), matrix and head
    (decayed), norm (no decay). muon: Muon for the block matrices, AdamW for the rest (nanochat's
    split), stepped together. Each group's ``lr_scale`` is its peak LR over learning_rate."""
    t = cfg.training
    parts = _split(model)
    scale = {"embedding": (t.embedding_lr or t.learning_rate) / t.learning_rate,
             "matrix": (t.matrix_lr or t.learning_rate) / t.learning_rate, "head": 1.0, "norm": 1.0}
    decay = {"embedding": 0.0, "matrix": t.weight_decay, "head": t.weight_decay, "norm": 0.0}
    muon = t.optimizer == "muon"
    adam_parts = ("embedding", "head", "norm") if muon else ("embedding", "matrix", "head", "norm")
    groups = [{"params": parts[k], "weight_decay": decay[k], "lr_scale": scale[k], "name": k}
              for k in adam_parts if parts[k]]
    adamw = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.beta1, t.beta2), fused=fused)
    if not muon:
        return adamw
    group = [{"params": parts["matrix"], "lr_scale": scale["matrix"], "name": "matrix"}]
    lr = t.learning_rate * scale["matrix"]
    momentum = muon_momentum(0, t.muon_momentum_start, t.muon_momentum, t.muon_momentum_warmup_steps)
    native = getattr(torch.optim, "Muon", None)
    if world == 1 and not sharded and native is not None:
        # PyTorch's own where it serves (one process): the same algorithm as trainer.loop.muon.Muon.
        matrices = native(group, lr=lr, weight_decay=MUON_WEIGHT_DECAY, momentum=momentum, nesterov=True,
                          adjust_lr_fn="original")
    else:  # DDP, or FSDP2 shards (trainer.loop.muon.Muon orthogonalises whole matrices, each on one rank)
        matrices = Muon(group, lr=lr, momentum=momentum, weight_decay=MUON_WEIGHT_DECAY, rank=rank,
                        world=world)
    return ChainedOptimizer(matrices, adamw)


def set_lr(optimizer: torch.optim.Optimizer | ChainedOptimizer, lr: float) -> None:
    """The base LR for this step; each group scales it by its own ``lr_scale``."""
    for g in optimizer.param_groups:
        g["lr"] = lr * g["lr_scale"]


def set_schedule(optimizer: torch.optim.Optimizer | ChainedOptimizer, t: TrainingConfig, step: int,
                 max_steps: int) -> None:
    """Everything that follows the step count, before update ``step`` (0 = the first): the LR of
    every group (warmup + cosine) and, with Muon, its momentum (warmup)."""
    set_lr(optimizer, t.learning_rate * lr_factor(step, t.warmup_steps, max_steps, t.min_lr / t.learning_rate))
    if isinstance(optimizer, ChainedOptimizer):
        m = muon_momentum(step, t.muon_momentum_start, t.muon_momentum, t.muon_momentum_warmup_steps)
        for o, kind in zip(optimizer.optimizers, optimizer.kinds, strict=True):
            if kind == "muon":
                for g in o.param_groups:
                    g["momentum"] = m
