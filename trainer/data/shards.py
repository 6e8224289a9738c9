"""Token shards on disk: writing one split's shards, and reading a split as one memory-mapped stream.

A split is a list of shards ``<split>/NNNNNN.bin`` (uint16 when the vocabulary fits, else uint32),
each with ``NNNNNN.idx.npz``, the provenance index:

    line_starts     uint32  token offset (in the shard) of every source line
    seg_line_idx    int64   for every document, the index of its first line in line_starts
    seg_file        int32   for every document, its source (an index into meta.json's "files")
    seg_first_line  int64   for every document, the 1-based line number of its first line

so every token maps back to (file, line). Directories written before shards existed (``train.bin``
+ ``train.idx.npz``, int64 line starts) read as a split of one shard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def _atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


class SplitWriter:
    """Appends documents to the current shard of one split; :meth:`close` finishes that shard.
    Tokens go to disk as they come, so memory holds only the shard's index, never its tokens."""

    def __init__(self, out_dir: Path, split: str, dtype: np.dtype, done: list[dict]) -> None:
        self.out_dir, self.split, self.dtype = Path(out_dir), split, np.dtype(dtype)
        self.shards = list(done)
        self.tokens = 0
        self._f = None
        self._idx: dict[str, list[np.ndarray]] = {}
        self._lines = 0

    def _name(self) -> str:
        return f"{self.split}/{len(self.shards):06d}"

    def append(self, tokens: np.ndarray, line_starts: np.ndarray, lines_per_doc: np.ndarray,
               doc_file: np.ndarray, doc_first_line: np.ndarray) -> None:
        """Whole documents: ``tokens``; ``line_starts`` relative to tokens[0]; one entry per document
        in the other three."""
        if len(lines_per_doc) == 0:
            return
        if self._f is None:
            (self.out_dir / self.split).mkdir(parents=True, exist_ok=True)
            self._f = open(self.out_dir / f"{self._name()}.bin.tmp", "wb")  # noqa: SIM115
            self._idx = {"line_starts": [], "seg_line_idx": [], "seg_file": [], "seg_first_line": []}
            self._lines = 0
        self._f.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)  # the array's own bytes, no copy
        self._idx["line_starts"].append((line_starts + self.tokens).astype(np.uint32))
        first = self._lines + np.concatenate([[0], np.cumsum(lines_per_doc)[:-1]])
        self._idx["seg_line_idx"].append(first.astype(np.int64))
        self._idx["seg_file"].append(doc_file.astype(np.int32))
        self._idx["seg_first_line"].append(doc_first_line.astype(np.int64))
        self.tokens += len(tokens)
        self._lines += int(lines_per_doc.sum())

    def close(self) -> None:
        if self._f is None:
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        name = self._name()
        _atomic_savez(self.out_dir / f"{name}.idx.npz", **{k: np.concatenate(v) for k, v in self._idx.items()})
        os.replace(self.out_dir / f"{name}.bin.tmp", self.out_dir / f"{name}.bin")
        self.shards.append({"name": f"{name}.bin", "tokens": self.tokens})
        self.tokens, self._idx = 0, {}

    def abandon(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class _Shard:
    def __init__(self, bin_path: Path, idx_path: Path, dtype: np.dtype, n: int | None) -> None:
        if n is None:
            n = bin_path.stat().st_size // dtype.itemsize
        self.n = n
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        self.idx_path = idx_path
        self._index: dict[str, np.ndarray] | None = None

    def index(self) -> dict[str, np.ndarray]:
        if self._index is None:
            with np.load(self.idx_path) as z:
                self._index = {k: z[k] for k in z.files}
        return self._index

    def source(self, pos: int) -> tuple[int, int]:
        ix = self.index()
        li = int(np.searchsorted(ix["line_starts"], pos, side="right")) - 1
        si = int(np.searchsorted(ix["seg_line_idx"], li, side="right")) - 1
        return int(ix["seg_file"][si]), int(ix["seg_first_line"][si] + li - ix["seg_line_idx"][si])


class _Concat:
    """Slices of several memory-mapped shards as if they were one array."""

    def __init__(self, shards: list[_Shard], offsets: np.ndarray, dtype: np.dtype) -> None:
        self.shards, self.offsets, self.dtype = shards, offsets, dtype

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("shard streams support contiguous slices only")
        lo, hi, _ = key.indices(len(self))
        if hi <= lo:
            return np.zeros(0, self.dtype)
        first = int(np.searchsorted(self.offsets, lo, side="right")) - 1
        parts = []
        i = first
        while lo < hi:
            base = int(self.offsets[i])
            take = min(hi, int(self.offsets[i + 1]))
            parts.append(self.shards[i].tokens[lo - base : take - base])
            lo = take
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class TokenSplit:
    """One split's shards as one token stream (memory-mapped) with its provenance index."""

    def __init__(self, data_dir: Path, split: str) -> None:
        data_dir = Path(data_dir)
        self.meta = json.loads((data_dir / "meta.json").read_text())
        dtype = np.dtype(self.meta["dtype"])
        if "shards" in self.meta:
            self.shards = [_Shard(data_dir / s["name"], data_dir / s["name"].replace(".bin", ".idx.npz"), dtype,
                                  int(s["tokens"])) for s in self.meta["shards"][split]]
        else:
            self.shards = [_Shard(data_dir / f"{split}.bin", data_dir / f"{split}.idx.npz", dtype, None)]
        self.offsets = np.concatenate([[0], np.cumsum([s.n for s in self.shards], dtype=np.int64)]).astype(np.int64)
        self.tokens = (self.shards[0].tokens if len(self.shards) == 1
                       else _Concat(self.shards, self.offsets, dtype) if self.shards else np.zeros(0, dtype))
        self.files: list[str] = self.meta["files"]
        self._line_starts: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def line_starts(self) -> np.ndarray:
        """Token offset of every source line in the whole split (loads every shard's index)."""
        if self._line_starts is None:
            parts = [s.index()["line_starts"].astype(np.int64) + int(o)
                     for s, o in zip(self.shards, self.offsets, strict=False)]
            self._line_starts = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._line_starts

    def source(self, pos: int) -> tuple[str, int]:
        """(file, 1-based line) of the token at ``pos``."""
        if not 0 <= pos < len(self):
            raise IndexError(f"token {pos} is outside the split ({len(self)} tokens)")
        i = int(np.searchsorted(self.offsets, pos, side="right")) - 1
        f, line = self.shards[i].source(pos - int(self.offsets[i]))
        return self.files[f], line
