"""Token shards on disk: writing one split's shards, and reading a split as one memory-mapped stream.

A split is a list of shards ``<split>/NNNNNN.bin`` (uint16 when the vocabulary fits, else uint32),
each with ``NNNNNN.idx.npz``, the provenance index, one entry per document:

    seg_start       int64   token offset of the document in the shard
    seg_lines       int64   its source lines (1 for a record of JSON Lines or Parquet)
    seg_file        int32   its source (an index into meta.json's "files")
    seg_first_line  int64   the 1-based line number of its first line

and, unless the tokenizer is a byte-level BPE, a line table instead of ``seg_start``/``seg_lines``:

    line_starts     uint32  token offset (in the shard) of every source line
    seg_line_idx    int64   for every document, the index of its first line in line_starts

A byte-level BPE's tokens hold the document's bytes, so a line starts where the bytes after a newline
do: the line of a token is found by counting the newlines of the tokens before it in its document
(:func:`line_starts`, from the tokenizer's newline table), which preparation need not write down. A
line starts at the token holding its first byte either way. A directory whose tokenizer.json is gone
still reads; its byte-level shards then name each document's first line. Directories written before
shards existed (``train.bin`` + ``train.idx.npz``, int64 line starts) read as a split of one shard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainer.data.fastbpe import newline_table


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

    def append(self, tokens: np.ndarray, doc_starts: np.ndarray, lines_per_doc: np.ndarray, doc_file: np.ndarray,
               doc_first_line: np.ndarray, line_starts: np.ndarray | None = None) -> None:
        """Whole documents: ``tokens``; one entry per document in the next four (``doc_starts``
        relative to tokens[0]); ``line_starts`` (relative to tokens[0]) or None for a byte-level BPE."""
        if len(lines_per_doc) == 0:
            return
        if self._f is None:
            (self.out_dir / self.split).mkdir(parents=True, exist_ok=True)
            self._f = open(self.out_dir / f"{self._name()}.bin.tmp", "wb")  # noqa: SIM115
            table = ("line_starts", "seg_line_idx") if line_starts is not None else ("seg_start", "seg_lines")
            self._idx = {k: [] for k in (*table, "seg_file", "seg_first_line")}
            self._lines = 0
        if (line_starts is None) == ("line_starts" in self._idx):
            raise ValueError("a shard's documents must all come with a line table or all without")
        self._f.write(np.ascontiguousarray(tokens, dtype=self.dtype).data)  # the array's own bytes, no copy
        if line_starts is None:
            self._idx["seg_start"].append(doc_starts.astype(np.int64) + self.tokens)
            self._idx["seg_lines"].append(lines_per_doc.astype(np.int64))
        else:
            self._idx["line_starts"].append((line_starts + self.tokens).astype(np.uint32))
            first = self._lines + np.concatenate([[0], np.cumsum(lines_per_doc)[:-1]])
            self._idx["seg_line_idx"].append(first.astype(np.int64))
            self._lines += int(lines_per_doc.sum())
        self._idx["seg_file"].append(doc_file.astype(np.int32))
        self._idx["seg_first_line"].append(doc_first_line.astype(np.int64))
        self.tokens += len(tokens)

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


Newlines = tuple[np.ndarray, np.ndarray, int]  # per token id: newline bytes, ends with one; and end-of-text


def line_starts(tokens: np.ndarray, seg_start: np.ndarray, seg_lines: np.ndarray, newlines: Newlines
                ) -> np.ndarray:
    """Token offset (in ``tokens``) of every source line of the documents starting at ``seg_start``
    (the first at 0; the last may be cut short). A line other than a document's first starts at the
    token holding the byte after a newline: the newline's own token, or the next one when the newline
    is that token's last byte; never at an end-of-text. Records (``seg_lines`` 1) are one line."""
    count, ends, eot = newlines
    t = np.asarray(tokens)
    inside = count[t].astype(np.int64) - ends[t]
    inside[1:] += ends[t[:-1]]
    inside[t == eot] = 0  # what a document's last newline moved onto its end-of-text
    one = np.flatnonzero(seg_lines <= 1)
    if len(one):
        mark = np.zeros(len(t) + 1, np.int64)
        bounds = np.append(seg_start, len(t))
        np.add.at(mark, bounds[one], 1)
        np.add.at(mark, bounds[one + 1], -1)
        inside[np.cumsum(mark[:-1]) > 0] = 0
    return np.sort(np.concatenate([np.asarray(seg_start, np.int64), np.repeat(np.arange(len(t)), inside)]))


class _Shard:
    def __init__(self, bin_path: Path, idx_path: Path, dtype: np.dtype, n: int | None,
                 newlines: Callable[[], Newlines | None]) -> None:
        if n is None:
            n = bin_path.stat().st_size // dtype.itemsize
        self.n = n
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        self.idx_path = idx_path
        self.newlines = newlines
        self._index: dict[str, np.ndarray] | None = None

    def index(self) -> dict[str, np.ndarray]:
        if self._index is None:
            with np.load(self.idx_path) as z:
                self._index = {k: z[k] for k in z.files}
        return self._index

    def line_starts(self) -> np.ndarray:
        ix = self.index()
        if "line_starts" in ix:
            return ix["line_starts"].astype(np.int64)
        table = self.newlines()
        if table is None:  # no tokenizer file: each document's first line only
            return ix["seg_start"]
        return line_starts(self.tokens[:], ix["seg_start"], ix["seg_lines"], table)

    def source(self, pos: int) -> tuple[int, int]:
        ix = self.index()
        if "line_starts" in ix:
            li = int(np.searchsorted(ix["line_starts"], pos, side="right")) - 1
            si = int(np.searchsorted(ix["seg_line_idx"], li, side="right")) - 1
            return int(ix["seg_file"][si]), int(ix["seg_first_line"][si] + li - ix["seg_line_idx"][si])
        si = int(np.searchsorted(ix["seg_start"], pos, side="right")) - 1
        start, lines, table = int(ix["seg_start"][si]), int(ix["seg_lines"][si]), self.newlines()
        # the lines that start in the document up to this token, counted from its tokens' newlines
        inside = 1 if lines <= 1 or table is None else \
            len(line_starts(self.tokens[start : pos + 1], np.zeros(1, np.int64), np.array([lines]), table))
        return int(ix["seg_file"][si]), int(ix["seg_first_line"][si]) + inside - 1


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
                                  int(s["tokens"]), self._newlines) for s in self.meta["shards"][split]]
        else:
            self.shards = [_Shard(data_dir / f"{split}.bin", data_dir / f"{split}.idx.npz", dtype, None,
                                  self._newlines)]
        self.offsets = np.concatenate([[0], np.cumsum([s.n for s in self.shards], dtype=np.int64)]).astype(np.int64)
        self.tokens = (self.shards[0].tokens if len(self.shards) == 1
                       else _Concat(self.shards, self.offsets, dtype) if self.shards else np.zeros(0, dtype))
        self.files: list[str] = self.meta["files"]
        self.data_dir = data_dir
        self._line_starts: np.ndarray | None = None
        self._table: list[Newlines | None] = []

    def _newlines(self) -> Newlines | None:
        """The tokenizer's newline table (trainer.data.fastbpe.newline_table), read once."""
        if not self._table:
            path = self.data_dir / "tokenizer.json"
            table = newline_table(path.read_text()) if path.is_file() else None
            self._table.append(None if table is None else (*table, int(self.meta["eot"])))
        return self._table[0]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @property
    def line_starts(self) -> np.ndarray:
        """Token offset of every source line in the whole split (loads every shard's index)."""
        if self._line_starts is None:
            parts = [s.line_starts() + int(o)
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
