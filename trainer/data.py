"""Tokenizers, token shards with provenance, and a deterministic, resumable batch loader.

A prepared data directory holds::

    meta.json          tokenizer, vocab size, dtype, token counts, source files
    tokenizer.json     (BPE only) the trained ``tokenizers`` model
    train.bin val.bin  flat token streams (uint16 when the vocabulary fits, else uint32)
    train.idx.npz      provenance: token offset of every line, plus per-segment file and line number
    val.idx.npz

Every token position maps back to (source file, line), so a batch with a strange loss can be traced
to the text that caused it (seed 000 section 4.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

SEGMENT_LINES = 200
"""Lines per segment: the unit of the train/val split, each ended by an end-of-text token."""


class Tokenizer(Protocol):
    vocab_size: int
    eot: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 and one end-of-text token, 256. Needs no training and no files."""

    vocab_size = 257
    eot = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
    """A byte-level BPE from the ``tokenizers`` library (imported only when used)."""

    EOT_TEXT = "<|endoftext|>"

    def __init__(self, tok: object) -> None:
        self._tok = tok
        self.vocab_size = int(tok.get_vocab_size())  # type: ignore[attr-defined]
        self.eot = int(tok.token_to_id(self.EOT_TEXT))  # type: ignore[attr-defined]

    @classmethod
    def train(cls, texts: list[str], vocab_size: int) -> BPETokenizer:
        try:
            from tokenizers import Tokenizer as HFTokenizer
            from tokenizers import decoders, models, pre_tokenizers, trainers
        except ImportError:
            raise RuntimeError("data.tokenizer=bpe needs the 'tokenizers' package (pip install tokenizers), "
                               "or use data.tokenizer=byte") from None
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[cls.EOT_TEXT],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(path)))

    def save(self, path: Path) -> None:
        self._tok.save(str(path))  # type: ignore[attr-defined]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)  # type: ignore[attr-defined]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(texts)]  # type: ignore[attr-defined]

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))  # type: ignore[attr-defined]


def load_tokenizer(data_dir: Path) -> Tokenizer:
    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    if meta["tokenizer"] == "byte":
        return ByteTokenizer()
    return BPETokenizer.load(Path(data_dir) / "tokenizer.json")


# ---------------------------------------------------------------------------------------------
# Preparing shards


def stdlib_sources() -> tuple[Path, list[Path]]:
    """The Python standard library's own .py files: a corpus every machine with Python has."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return root, files


def collect_files(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"data input {item} does not exist")
    return files


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary or unreadable: not training text


@dataclass
class _Split:
    tokens: list[np.ndarray]
    line_starts: list[np.ndarray]
    seg_line_idx: list[int]
    seg_file: list[int]
    seg_first_line: list[int]
    n_tokens: int = 0
    n_lines: int = 0


def prepare(inputs: list[str], out_dir: Path, tokenizer: str = "byte", bpe_vocab_size: int = 32000,
            val_split: float = 0.1, max_bytes: int | None = None, log=print) -> dict:
    """Tokenize ``inputs`` (files/dirs; empty = stdlib demo corpus) into ``out_dir``; returns meta.

    The split is by segments of SEGMENT_LINES lines: every k-th segment (k = round(1/val_split)) is
    validation, so even a single big file gets a held-out part, and provenance stays exact."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if inputs:
        files, root, corpus = collect_files(inputs), None, "files"
    else:
        root, files = stdlib_sources()
        corpus = "python-stdlib"
    texts: list[tuple[str, str]] = []
    total = 0
    for f in files:
        text = _read_text(f)
        if not text:
            continue
        name = str(f.relative_to(root)) if root is not None else str(f)
        texts.append((name, text))
        total += len(text)
        if max_bytes is not None and total >= max_bytes:
            break
    if not texts:
        raise ValueError("no readable text found in the data inputs")
    k = max(2, round(1 / val_split))
    tok: Tokenizer
    if tokenizer == "byte":
        tok = ByteTokenizer()
    else:
        train_texts = []
        for _, text in texts:
            lines = text.splitlines(keepends=True)
            train_texts.extend("".join(lines[s : s + SEGMENT_LINES])
                               for j, s in enumerate(range(0, len(lines), SEGMENT_LINES)) if j % k != k - 1)
        tok = BPETokenizer.train(train_texts, bpe_vocab_size)
        tok.save(out_dir / "tokenizer.json")
    dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
    splits = {"train": _Split([], [], [], [], []), "val": _Split([], [], [], [], [])}
    for fi, (_, text) in enumerate(texts):
        lines = text.splitlines(keepends=True)
        for j, s in enumerate(range(0, len(lines), SEGMENT_LINES)):
            seg = lines[s : s + SEGMENT_LINES]
            sp = splits["val" if j % k == k - 1 else "train"]
            if isinstance(tok, BPETokenizer):
                enc = tok.encode_batch(seg)
            else:
                enc = [list(line.encode("utf-8")) for line in seg]
            lengths = np.fromiter((len(e) for e in enc), dtype=np.int64, count=len(enc))
            starts = sp.n_tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]])
            flat = np.fromiter((t for e in enc for t in e), dtype=np.int64, count=int(lengths.sum()))
            sp.tokens.append(np.concatenate([flat, [tok.eot]]).astype(dtype))
            sp.seg_line_idx.append(sp.n_lines)
            sp.seg_file.append(fi)
            sp.seg_first_line.append(s + 1)
            sp.line_starts.append(starts)
            sp.n_lines += len(seg)
            sp.n_tokens += int(lengths.sum()) + 1
    for name, sp in splits.items():
        arr = np.concatenate(sp.tokens) if sp.tokens else np.zeros(0, dtype=dtype)
        arr.tofile(out_dir / f"{name}.bin")
        np.savez(out_dir / f"{name}.idx.npz",
                 line_starts=np.concatenate(sp.line_starts) if sp.line_starts else np.zeros(0, np.int64),
                 seg_line_idx=np.asarray(sp.seg_line_idx, np.int64), seg_file=np.asarray(sp.seg_file, np.int32),
                 seg_first_line=np.asarray(sp.seg_first_line, np.int64))
    meta = {
        "tokenizer": tokenizer, "vocab_size": tok.vocab_size, "eot": tok.eot,
        "dtype": np.dtype(dtype).name, "corpus": corpus,
        "train_tokens": splits["train"].n_tokens, "val_tokens": splits["val"].n_tokens,
        "files": [name for name, _ in texts], "val_split": val_split, "segment_lines": SEGMENT_LINES,
    }
    # meta.json last: its presence marks a complete directory.
    tmp = out_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(out_dir / "meta.json")
    log(f"prepared {len(texts)} files: {meta['train_tokens']:,} train + {meta['val_tokens']:,} val tokens "
        f"({tokenizer}, vocab {tok.vocab_size}) in {out_dir}")
    return meta


# ---------------------------------------------------------------------------------------------
# Reading shards


class TokenSplit:
    """One split's token stream (memory-mapped) and its provenance index."""

    def __init__(self, data_dir: Path, split: str) -> None:
        data_dir = Path(data_dir)
        self.meta = json.loads((data_dir / "meta.json").read_text())
        path = data_dir / f"{split}.bin"
        dtype = np.dtype(self.meta["dtype"])
        n = path.stat().st_size // dtype.itemsize
        self.tokens = np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.zeros(0, dtype)
        idx = np.load(data_dir / f"{split}.idx.npz")
        self.line_starts = idx["line_starts"]
        self.seg_line_idx = idx["seg_line_idx"]
        self.seg_file = idx["seg_file"]
        self.seg_first_line = idx["seg_first_line"]
        self.files: list[str] = self.meta["files"]

    def __len__(self) -> int:
        return len(self.tokens)

    def source(self, pos: int) -> tuple[str, int]:
        """(file, 1-based line) of the token at ``pos``."""
        li = int(np.searchsorted(self.line_starts, pos, side="right")) - 1
        si = int(np.searchsorted(self.seg_line_idx, li, side="right")) - 1
        return self.files[int(self.seg_file[si])], int(self.seg_first_line[si] + li - self.seg_line_idx[si])


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
            self._order = rng.permutation(self.n_windows)
            self._perm_epoch = self.epoch
        return self._order

    def next(self) -> Batch:
        group = self.batch_size * self.world
        if self.cursor + group > self.n_windows:
            self.epoch, self.cursor = self.epoch + 1, 0
        lo = self.cursor + self.rank * self.batch_size
        starts = self._perm()[lo : lo + self.batch_size] * self.seq_len
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
    """A fixed set of validation windows, evenly spread over the split (the same at every eval)."""
    n_windows = (len(split) - 1) // seq_len
    want = n_batches * batch_size * world
    if n_windows == 0:
        return []
    picks = np.linspace(0, n_windows - 1, num=min(want, n_windows)).astype(np.int64)
    per_rank = (len(picks) // world) // batch_size * batch_size  # equal on every rank (FSDP lockstep)
    mine = picks[rank::world][:per_rank]
    out = []
    for i in range(0, per_rank, batch_size):
        starts = mine[i : i + batch_size] * seq_len
        x, y = _gather(split.tokens, starts, seq_len)
        out.append(Batch(x, y, starts))
    return out
