"""The training data as the trainer sees it: prepared shards, read as one stream, and a
deterministic, resumable batch loader whose batches map back to their source file and line.

A prepared data directory holds::

    meta.json            tokenizer, vocab size, dtype, token counts, shards, sources
    tokenizer.json       (all but the byte tokenizer) the tokenizer
    train/NNNNNN.bin     token shards (uint16 when the vocabulary fits, else uint32)
    train/NNNNNN.idx.npz provenance: file, first line and token offset of every document (and a line
                         table, except for a byte-level BPE, whose lines are found from the tokens)
    val/...

It is written by ``python -m trainer.prepare`` (trainer/data/pipeline.py). Every token position maps
back to (source file, line), so a batch with a strange loss can be traced to the text that caused
it (the Atlas 1B build plan section 4.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.data.pipeline import PrepareOptions, prepare
from trainer.data.shards import TokenSplit
from trainer.data.sources import collect_files, stdlib_sources
from trainer.data.tokenizer import (
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    load_tokenizer,
    load_tokenizer_file,
)

__all__ = ["BPETokenizer", "Batch", "BatchLoader", "ByteTokenizer", "CharTokenizer", "PrepareOptions",
           "SEGMENT_LINES", "TokenSplit", "Tokenizer", "collect_files", "load_tokenizer", "load_tokenizer_file",
           "prepare", "stdlib_sources", "val_batches"]

SEGMENT_LINES = 200
"""Lines per document of a plain text file: the unit of the train/val split, each ended by an
end-of-text token."""


@dataclass
class Batch:
    x: np.ndarray  # [B, T] int64
    y: np.ndarray  # [B, T] int64
    starts: np.ndarray  # [B] token offset of each row in the split


def _gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])
    return rows[:, :-1], rows[:, 1:]


class BatchLoader:
    """Non-overlapping windows of seq_len+1 tokens, visited in a fresh seeded permutation each epoch.

    The whole state is (epoch, cursor, seq_len): saving it in a checkpoint and restoring it replays
    exactly the same batches, on any number of restarts. Rank r of W takes rows r*B..(r+1)*B-1 of
    each group of W*B windows, so ranks never see the same window in a step."""

    def __init__(self, split: TokenSplit, batch_size: int, seq_len: int, rank: int = 0, world: int = 1,
                 seed: int = 0) -> None:
        self.split, self.batch_size, self.rank, self.world, self.seed = split, batch_size, rank, world, seed
        self.epoch, self.cursor = 0, 0
        self.set_seq_len(seq_len)

    def set_seq_len(self, seq_len: int) -> None:
        """Change the window length (stage 2); the permutation restarts for the new windows."""
        n_windows = (len(self.split) - 1) // seq_len
        if n_windows < self.batch_size * self.world:
            raise ValueError(f"the training split has {len(self.split):,} tokens: too few for "
                             f"{self.world} x {self.batch_size} sequences of {seq_len}")
        if getattr(self, "seq_len", None) not in (None, seq_len):
            self.cursor = 0
        self.seq_len, self.n_windows = seq_len, n_windows
        self._perm_epoch = -1

    def _perm(self) -> np.ndarray:
        if self._perm_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch, self.seq_len])
            order = rng.permutation(self.n_windows)
            # int32 halves the memory of a 20B-token corpus's permutation (the order is unchanged)
            self._order = order.astype(np.int32) if self.n_windows < 2**31 else order
            self._perm_epoch = self.epoch
        return self._order

    def next(self) -> Batch:
        group = self.batch_size * self.world
        if self.cursor + group > self.n_windows:
            self.epoch, self.cursor = self.epoch + 1, 0
        lo = self.cursor + self.rank * self.batch_size
        starts = self._perm()[lo : lo + self.batch_size].astype(np.int64) * self.seq_len
        self.cursor += group
        x, y = _gather(self.split.tokens, starts, self.seq_len)
        return Batch(x, y, starts)

    def sources(self, batch: Batch) -> list[str]:
        return [f"{f}:{line}" for f, line in (self.split.source(int(s)) for s in batch.starts)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seq_len": self.seq_len}

    def load_state_dict(self, state: dict) -> None:
        self.set_seq_len(int(state["seq_len"]))
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])


def val_batches(split: TokenSplit, n_batches: int, batch_size: int, seq_len: int, rank: int = 0,
                world: int = 1) -> list[Batch]:
    """A fixed set of validation windows, evenly spread over the split (the same at every eval).

    A split too short for one batch of whole windows per rank gets overlapping windows, and one
    shorter than a window gets windows as long as it has: a small corpus still validates."""
    seq_len = min(seq_len, len(split) - 1)
    if seq_len < 1 or n_batches < 1:
        return []
    n_windows = (len(split) - 1) // seq_len
    group = batch_size * world
    want = max(n_batches * group, group)
    if n_windows >= group:
        picks = np.linspace(0, n_windows - 1, num=min(want, n_windows)).astype(np.int64) * seq_len
    else:
        picks = np.linspace(0, len(split) - 1 - seq_len, num=group).astype(np.int64)
    per_rank = (len(picks) // world) // batch_size * batch_size  # equal on every rank (FSDP lockstep)
    mine = picks[rank::world][:per_rank]
    out = []
    for i in range(0, per_rank, batch_size):
        starts = mine[i : i + batch_size]
        x, y = _gather(split.tokens, starts, seq_len)
        out.append(Batch(x, y, starts))
    return out
