"""Run under torchrun (gloo): three steps of trainer.loop.muon.Muon split across the ranks, on matrices and
gradients every rank builds the same way; rank 0 saves the parameters and momentum buffers to argv[1].
tests/trainer/loop/test_muon.py compares them with the single-process update."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def make_params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    # Three 16x48 (not a multiple of two ranks), two 48x16 (tall), one 32x32.
    shapes = [(16, 48)] * 3 + [(48, 16)] * 2 + [(32, 32)]
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def grads(step: int, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def run(opt_factory, params, steps: int = 3) -> None:
    opt = opt_factory(params)
    for step in range(steps):
        for p, gr in zip(params, grads(step, params), strict=True):
            p.grad = gr.clone()
        opt.step()
    return opt


def main() -> None:
    from trainer.loop.muon import Muon

    dist.init_process_group("gloo")
    params = make_params()
    opt = run(lambda ps: Muon(ps, lr=0.02, weight_decay=0.1, rank=dist.get_rank(), world=dist.get_world_size()),
              params)
    if dist.get_rank() == 0:
        torch.save({"params": [p.detach() for p in params],
                    "momentum": [opt.state[p]["momentum_buffer"] for p in params]}, sys.argv[1])
    dist.barrier()  # every rank done before any tears gloo down (as trainer/train.py ends)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
