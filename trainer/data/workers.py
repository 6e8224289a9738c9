"""What a preparation worker process does: read pieces, encode their documents into blocks, and
leave each block in the work folder for the main process, which owns the shards.

Blocks go through files rather than pipes so that memory stays bounded however far the workers
run ahead of the writer (a 20 GB .gz file is one task, read by one worker, in many blocks). With one
worker, which runs in the main process, each block goes straight to the shards instead (a sink).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.data.fastbpe import from_tokenizer_json
from trainer.data.sources import Piece, PieceStats, Source, piece_docs
from trainer.data.tokenizer import ByteTokenizer, Tokenizer, encode_block, load_tokenizer_text


@dataclass(frozen=True)
class WorkerSetup:
    out_dir: str
    sources: tuple[Source, ...]
    pieces: tuple[Piece, ...]
    tokenizer_file: str | None  # None: bytes
    dtype: str
    text_field: str
    segment_lines: int
    max_doc_bytes: int
    block_bytes: int
    val_split: float
    encoder: str = "tokenizers"  # or "tiktoken" (trainer.data.fastbpe), chosen by the pipeline
    line_table: bool = True  # False for a byte-level BPE: the shard index finds lines from newlines


@dataclass(frozen=True)
class TaskResult:
    task: int
    blocks: int
    piece_lines: dict[int, int] = field(default_factory=dict)
    bad_records: dict[int, int] = field(default_factory=dict)
    binary: tuple[int, ...] = ()
    stopped: bool = False  # the sink asked for no more blocks


BLOCK_ARRAYS = ("tokens", "doc_starts", "line_starts", "has_line_table", "lines_per_doc", "doc_file", "doc_piece", "doc_line",
                "doc_hash", "doc_bytes", "disk")
_setup: WorkerSetup | None = None
_tok: Tokenizer | None = None
_counter = None


def init_worker(setup: WorkerSetup, counter) -> None:
    """Pool initializer (also called in-process when there is one worker)."""
    global _setup, _tok, _counter
    # One thread per worker: the workers are the parallelism; the tokenizers library's own thread
    # pool inside each of them would only oversubscribe the cores.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _setup, _counter = setup, counter
    _tok = load_encoder(setup.tokenizer_file, setup.encoder) if setup.tokenizer_file else ByteTokenizer()


def load_encoder(path: str, encoder: str = "tokenizers") -> Tokenizer:
    """The tokenizer file's tokenizer, on tiktoken when ``encoder`` says so and it can be. Kept per
    process by the file's content: with one worker the pipeline's checks and the worker share one
    load (a tokenizers file and the tiktoken tables cost ~0.1 s each to build)."""
    raw = Path(path).read_bytes()
    key = (hashlib.sha256(raw).hexdigest(), encoder)
    if key not in _loaded:
        text = raw.decode("utf-8")
        tok = load_encoder(path) if encoder == "tiktoken" else load_tokenizer_text(text, path)
        if encoder == "tiktoken":
            tok = from_tokenizer_json(text, tok.eot) or tok
        if len(_loaded) >= 4:
            _loaded.clear()
        _loaded[key] = tok
    return _loaded[key]


_loaded: dict[tuple[str, str], Tokenizer] = {}


def doc_hash(text: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def is_val_hash(h: int | np.ndarray, val_split: float):
    return h < np.uint64(min(int(val_split * 2.0**64), 2**64 - 1)) if isinstance(h, np.ndarray) \
        else h < val_split * 2.0**64


def block_path(out_dir: str | Path, task: int, block: int) -> Path:
    return Path(out_dir) / "work" / f"t{task:07d}-b{block:05d}.npy"


Sink = Callable[[int, dict[str, np.ndarray], dict[int, int]], bool]


def run_task(task: int, piece_ids: list[int], skip_blocks: int, sink: Sink | None = None) -> TaskResult:
    """Encode the pieces of one task into blocks ``skip_blocks`` onwards (earlier blocks are read
    but not encoded: a resumed preparation already holds them in finished shards). Each block goes
    to a file in the work folder, or, in the main process, straight to ``sink(block, arrays, lines
    of the pieces read so far)``, which returns True to stop."""
    s, tok = _setup, _tok
    assert s is not None and tok is not None
    texts: list[bytes] = []
    offs: list[np.ndarray] = []
    meta: list[tuple[int, int, int]] = []  # (source, piece, first line in the piece)
    size = 0
    blocks = 0
    disk = 0
    result_lines: dict[int, int] = {}
    bad: dict[int, int] = {}
    binary: list[int] = []

    def flush() -> bool:
        nonlocal texts, offs, meta, size, blocks, disk
        stop = False
        if blocks >= skip_blocks:
            arrays = _block_arrays(s, tok, texts, offs, meta, disk)
            if sink is None:
                _write_block(block_path(s.out_dir, task, blocks), arrays)
            else:
                stop = sink(blocks, arrays, dict(result_lines))
        if _counter is not None:
            with _counter.get_lock():
                _counter.value += disk
        blocks += 1
        texts, offs, meta, size, disk = [], [], [], 0, 0
        return stop

    for pid in piece_ids:
        piece = s.pieces[pid]
        stats = PieceStats()
        pos = [0]
        seen = 0
        for doc, line, o in piece_docs(s.sources[piece.source], piece, s.text_field, s.segment_lines,
                                       s.max_doc_bytes, stats, pos):
            texts.append(doc)
            offs.append(o)
            meta.append((piece.source, pid, line))
            size += len(doc)
            disk += pos[0] - seen
            seen = pos[0]
            if size >= s.block_bytes and flush():
                return TaskResult(task, blocks, result_lines, bad, tuple(binary), stopped=True)
        disk += max(0, (s.sources[piece.source].size if piece.end < 0 else piece.end - piece.start) - seen)
        result_lines[pid] = stats.lines
        if stats.bad_records:
            bad[piece.source] = bad.get(piece.source, 0) + stats.bad_records
        if stats.binary:
            binary.append(piece.source)
    if texts:
        stopped = flush()
        return TaskResult(task, blocks, result_lines, bad, tuple(binary), stopped)
    if _counter is not None and disk:
        with _counter.get_lock():
            _counter.value += disk
    return TaskResult(task, blocks, result_lines, bad, tuple(binary))


def _block_arrays(s: WorkerSetup, tok: Tokenizer, texts: list[bytes], offs: list[np.ndarray],
                  meta: list[tuple[int, int, int]], disk: int) -> dict[str, np.ndarray]:
    tokens, doc_starts, line_starts = encode_block(tok, texts, offs, s.dtype, s.line_table)
    m = np.asarray(meta, np.int64).reshape(-1, 3)
    return {"tokens": tokens, "doc_starts": doc_starts,
            "lines_per_doc": np.fromiter((len(o) for o in offs), np.int64, len(offs)),
            "line_starts": np.zeros(0, np.int64) if line_starts is None else line_starts,
            "has_line_table": np.bool_(line_starts is not None),
            "doc_file": m[:, 0], "doc_piece": m[:, 1], "doc_line": m[:, 2],
            "doc_hash": np.fromiter((doc_hash(t) for t in texts), np.uint64, len(texts)),
            "doc_bytes": np.fromiter((len(t) for t in texts), np.int64, len(texts)), "disk": np.int64(disk)}


def _write_block(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:  # .npy arrays one after another: no zip checksums on a file read once
        for k in BLOCK_ARRAYS:
            np.lib.format.write_array(f, np.asarray(arrays[k]), allow_pickle=False)
    os.replace(tmp, path)


def read_block(path: Path) -> dict[str, np.ndarray]:
    """The arrays :func:`_write_block` left in ``path``."""
    with open(path, "rb") as f:
        return {k: np.lib.format.read_array(f, allow_pickle=False) for k in BLOCK_ARRAYS}


def sample_piece(pid: int, quota: int) -> list[str]:
    """Up to ``quota`` bytes of training-split documents from the start of a piece, for learning a
    vocabulary. Validation documents stay out, so the tokenizer never saw the held-out text."""
    s = _setup
    assert s is not None
    piece = s.pieces[pid]
    out: list[str] = []
    got = 0
    for doc, _, _ in piece_docs(s.sources[piece.source], piece, s.text_field, s.segment_lines,
                                s.max_doc_bytes, PieceStats(), [0]):
        if got >= quota:
            break
        if is_val_hash(doc_hash(doc), s.val_split):
            continue
        out.append(doc.decode("utf-8", errors="replace"))
        got += len(doc)
    return out
