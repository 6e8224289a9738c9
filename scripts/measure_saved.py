"""Bytes the trainer keeps for backward, per layer and token, measured on this machine's CPU with
``torch.autograd.graph.saved_tensors_hooks`` (every tensor autograd saves, each storage counted once).

    python scripts/measure_saved.py    # the grid behind gpucli's constants, each beside the formula

What is measured: one Atlas memory block's mix (trainer/model/memory.py: projections, features, the
chunked update, the read, the attention/memory gate), the part a memory block keeps on top of a plain
block, under bf16 autocast as on a GPU (the memory itself runs in fp32, outside autocast); and a plain
block (trainer/model/gpt.py ``Block``) for comparison. The planner's
``gpucli.plan.estimate.memory_activation_bytes_per_token`` is fitted to the grid printed here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.model.memory import AtlasMemory  # noqa: E402


def saved_bytes(fn) -> int:  # noqa: ANN001
    """Bytes of the distinct storages autograd saves while ``fn`` runs (its outputs' graph kept alive)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def memory_block(d: int, dk: int, dv: int, chunk: int, window: int, poly: int, t: int, b: int = 1) -> float:
    """Bytes per token kept by one memory block's mix (the memory on top of attention)."""
    torch.manual_seed(0)
    mem = AtlasMemory(d, dk, dv, poly, window)
    mem.chunk_size = chunk
    h = torch.randn(b, t, d, requires_grad=True)
    attn = torch.randn(b, t, d, requires_grad=True)

    def run():  # noqa: ANN202
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return mem.mix(h, attn, None, None)

    return saved_bytes(run) / (b * t)


def plain_block(d: int, heads: int, ff: int, t: int, b: int = 1) -> float:
    from trainer.model.gpt import Block
    from trainer.spec.modelspec import ModelSpec

    spec = ModelSpec(d_model=d, n_layers=1, n_heads=heads, d_ff=ff, vocab_size=256, max_seq_len=t)
    torch.manual_seed(0)
    block = Block(spec)
    x = torch.randn(b, t, d, requires_grad=True)

    def run():  # noqa: ANN202
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return block(x, None)

    return saved_bytes(run) / (b * t)


GRID = [  # d, dk, dv, chunk, window, poly, T
    (64, 64, 64, 64, 16, 2, 256), (64, 64, 64, 128, 16, 2, 256), (64, 64, 64, 256, 16, 2, 512),
    (128, 64, 64, 128, 16, 2, 256), (64, 128, 64, 128, 16, 2, 256), (64, 64, 128, 128, 16, 2, 256),
    (64, 64, 64, 128, 4, 2, 256), (64, 64, 64, 128, 16, 3, 256), (128, 128, 128, 256, 16, 2, 512),
    # beyond the fitted range: wider and longer chunks, as the 1b-atlas preset runs them
    (512, 512, 512, 1024, 16, 2, 1024), (384, 384, 384, 2048, 16, 2, 2048), (512, 512, 512, 256, 16, 2, 1024),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args(argv)
    torch.set_num_threads(1)
    from gpucli.plan.estimate import memory_activation_bytes_per_token

    print("| d | d_key | d_value | chunk | window | poly | T | measured B/token | gpucli B/token | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d, dk, dv, c, w, p, t in GRID:
        got = memory_block(d, dk, dv, c, w, p, t)
        want = memory_activation_bytes_per_token(d, dk, dv, min(c, t), w, p)
        print(f"| {d} | {dk} | {dv} | {c} | {w} | {p} | {t} | {got:,.0f} | {want:,.0f} | {want / got:.2f} |", flush=True)
    for d, heads, ff, t in ((64, 2, 256, 256), (128, 4, 512, 256)):
        print(f"plain block d {d} ff {ff} T {t}: {plain_block(d, heads, ff, t):,.0f} B/token (CPU attention "
              "keeps its T x T scores; flash attention on a GPU does not)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
