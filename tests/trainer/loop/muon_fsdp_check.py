"""Run under torchrun (gloo, 2 ranks): trainer.loop.muon.Muon on FSDP2 shards (DTensors sharded on dim 0).

``optimizer OUT``: three steps on matrices and gradients every rank builds the same way (uneven row
splits and an empty shard included); rank 0 saves the full parameters and momentum buffers.
``model OUT``: the tiny nanochat-style GPT, fully_shard'ed as trainer.loop.dist does, one Muon + AdamW step
on a batch split across the ranks; rank 0 saves the full weights. Then two more steps, against a
fresh model and optimizer that load the state saved after step one (the trainer's checkpoint calls:
``get/set_optimizer_state_dict`` with the chained optimizer) and take the same two steps; rank 0
saves both results. tests/trainer/loop/test_muon_fsdp.py compares all of it with one process.
"""

from __future__ import annotations

import io
import sys

import torch
import torch.distributed as dist

SHAPES = [(16, 48)] * 3 + [(48, 16)] * 2 + [(32, 32)] + [(5, 12)] * 3 + [(1, 8)]
"""Three wide and two tall (rounds of two ranks, one short), 5 rows (3 + 2), 1 row (rank 1 holds none)."""


def make_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g) for s in SHAPES]


def model_config():
    from trainer.spec.load import load_config

    return load_config(None, ["--training.max_steps=10", "--training.optimizer=muon", "--training.matrix_lr=0.02",
                              "--training.learning_rate=0.004", "--training.embedding_lr=0.2",
                              "--training.warmup_steps=0", "--training.muon_momentum_warmup_steps=4"])


def make_model():
    from trainer.model.gpt import GPT
    from trainer.spec.presets import MODELS, modern

    torch.manual_seed(0)
    return GPT(modern(MODELS["tiny"]))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 256, (4, 32), generator=g)
    return x, torch.roll(x, -1, dims=1)


def train_step(model, opt, step: int, rows: slice) -> None:
    from trainer.loop.optim import set_schedule

    cfg = model_config()
    set_schedule(opt, cfg.training, step, cfg.resolved_max_steps())
    x, y = batch(step)
    model(x[rows], y[rows]).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor().detach().clone() if hasattr(p, "full_tensor") else p.detach().clone()


def check_optimizer(out: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    from trainer.loop.muon import Muon, shard_rows

    holder = torch.nn.Module()
    holder.mats = torch.nn.ParameterList(make_params())
    fully_shard(holder)
    params = list(holder.mats)
    rank, world = dist.get_rank(), dist.get_world_size()
    for p, s in zip(params, SHAPES, strict=True):  # FSDP2 cuts rows as Muon assumes
        assert p.to_local().shape[0] == shard_rows(s[0], world)[rank], (s, p.to_local().shape)
    opt = Muon(params, lr=0.02, weight_decay=0.1)
    for step in range(3):
        for p, g in zip(params, grads(step), strict=True):
            p.grad = distribute_tensor(g, p.device_mesh, p.placements)
        opt.step()
    state = {"params": [full(p) for p in params],
             "momentum": [full(opt.state[p]["momentum_buffer"]) for p in params]}
    if rank == 0:
        torch.save(state, out)


def check_model(out: str) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    from trainer.loop.optim import build_optimizer

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * 4 // world, (rank + 1) * 4 // world)  # this rank's share of the batch

    def sharded():
        model = make_model()  # built whole with one seed: the same weights as one process
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, build_optimizer(model, model_config(), fused=False, rank=rank, world=world, sharded=True)

    model, opt = sharded()
    train_step(model, opt, 0, rows)
    one = {k: full(v) for k, v in model.state_dict().items()}
    file = io.BytesIO()  # what Checkpointer.optim_state writes to this rank's file
    torch.save(get_optimizer_state_dict(model, opt), file)
    for step in (1, 2):
        train_step(model, opt, step, rows)
    straight = {k: full(v) for k, v in model.state_dict().items()}
    straight_momenta = momenta(opt)

    again, opt2 = sharded()
    set_model_state_dict(again, dict(one), options=StateDictOptions(full_state_dict=True))  # it fills in the dict
    file.seek(0)
    set_optimizer_state_dict(again, opt2, torch.load(file, weights_only=False))
    for step in (1, 2):
        train_step(again, opt2, step, rows)
    resumed = {k: full(v) for k, v in again.state_dict().items()}
    resumed_momenta = momenta(opt2)  # collectives: every rank
    if rank == 0:
        torch.save({"one": one, "straight": straight, "resumed": resumed, "straight_momenta": straight_momenta,
                    "resumed_momenta": resumed_momenta}, out)


def momenta(opt) -> list[torch.Tensor]:
    muon = opt.optimizers[0]
    return [full(muon.state[p]["momentum_buffer"]) for p in muon.param_groups[0]["params"]]


def main() -> None:
    dist.init_process_group("gloo")
    {"optimizer": check_optimizer, "model": check_model}[sys.argv[1]](sys.argv[2])
    # Every rank done before any tears gloo down (as trainer/train.py ends): a rank that closed its
    # pairs while the other still finished its last all-gather aborted it once under load.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
