"""Time, cost and disk for your own training code (pure): the planner's estimate for a model of the size
you name (a preset, or a parameter count), your sequence length and tokens, on the setup you launch.

Your code is not the bundled trainer: its speed is assumed to be the bundled trainer's measured MFU for
that shape and GPU (said in the estimate), its checkpoints fp32 weights plus AdamW's two moments.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpucli.plan.disk import CheckpointDisk, checkpoint_disk
from gpucli.plan.estimate import speed_flops_per_token
from gpucli.plan.planner import PlanRequest, PriceQuote, Setup, estimate_train
from gpucli.plan.schema import Catalog, ModelShape
from trainer.spec.presets import MAX_NANOCHAT_DEPTH, nanochat_spec

OWN_KEEP_LAST = 3  # assumed: how many checkpoints your code keeps (the bundled trainer's default)


@dataclass(frozen=True)
class OwnEstimate:
    shape: ModelShape | None
    shape_note: str
    tokens_per_s: float | None = None
    hours: float | None = None
    cost_usd: float | None = None
    source: str = ""
    checkpoint: CheckpointDisk | None = None
    missing: str | None = None  # why there is no estimate (None: there is one)


def shape_for_params(params: float) -> tuple[ModelShape, str]:
    """The nanochat depth whose parameter count is closest to ``params`` (a shape for the FLOPs and memory)."""
    shapes = []
    for depth in range(1, MAX_NANOCHAT_DEPTH + 1):
        try:
            shapes.append(nanochat_spec(depth))
        except ValueError:  # an odd depth's width does not split into 128-wide heads
            continue
    best = min(shapes, key=lambda s: abs(s.num_params() - params))
    return best, (f"shape assumed: nanochat {best.name} ({best.num_params() / 1e6:,.0f}M params, the depth closest "
                  f"to {params / 1e6:,.0f}M; pass --model PRESET for your own shape)")


def own_code_estimate(catalog: Catalog, *, gpu_id: str | None, n_gpus: int, usd_per_hour: float | None,
                      model: ModelShape | None, params: float | None, seq_len: int | None,
                      tokens: float | None, today: dt.date | None = None) -> OwnEstimate:
    """The estimate, or one saying plainly what it lacks."""
    if model is None and params is None:
        return OwnEstimate(None, "", missing="no estimate for your own code: pass --model PRESET or --params N "
                                            "(its size), with --tokens N (and --seq-len T)")
    shape, note = (model, f"sized as {model.name}") if model is not None else shape_for_params(float(params or 0))
    ck = checkpoint_disk(shape, keep_last=OWN_KEEP_LAST, weight_copies=1)  # your code saves its weights once
    if tokens is None:
        return OwnEstimate(shape, note, checkpoint=ck,
                           missing="no time or cost estimate: pass --tokens N (the tokens your code trains on)")
    if gpu_id is None:
        return OwnEstimate(shape, note, checkpoint=ck, missing="no time or cost estimate for a CPU machine")

    t = seq_len or shape.max_seq_len
    req = PlanRequest(model=shape, today=today or dt.date.today(), tokens=tokens, seq_len=t)
    price = (usd_per_hour or 0.0) / n_gpus
    setup = Setup(catalog.gpus[gpu_id], n_gpus, PriceQuote(price, "on-demand", "launch", "", None, False))
    est = estimate_train(catalog, req, setup, tokens, t, speed_flops_per_token(shape, t))
    return OwnEstimate(shape, note, tokens_per_s=est.tokens_per_s, hours=est.hours,
                       cost_usd=est.cost_usd if usd_per_hour else None, checkpoint=ck,
                       source=f"{est.speed_source}; assumes your code reaches the bundled trainer's MFU")
