"""The shards a BPE preparation writes are pinned byte for byte: a fixed corpus (text with indents,
blank lines, non-ASCII and invalid UTF-8, JSON Lines) and a fixed vocabulary (``bpe600.json``, a
600-token byte-level BPE kept beside this file) give tokens whose digest was recorded before the
encoder was made faster, and a provenance index whose digest was recorded when it stopped keeping a
line table for byte-level BPE (lines are found from the tokens' newlines). Both encoders, tiktoken
and the ``tokenizers`` library, must still give exactly those bytes, and the index must find every
line exactly where the line table built from the ``tokenizers`` library's offsets puts it."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from trainer.data import pipeline
from trainer.data.loader import TokenSplit, prepare
from trainer.data.pipeline import PrepareOptions

pytest.importorskip("tokenizers")

VOCAB = Path(__file__).with_name("bpe600.json")
TOKENS = "dd51e8ff2d5050c6f0100874e4df30beb3288fc520ab6d83665e009c943560c4"  # sha256 of every shard's tokens, in order
DIGEST = "b37f5388d1f69d04ae3c6f7c33069da1097cad7fb87a1bb5130d1985bb09af20"  # ... and index arrays (see digest())


def make_corpus(root: Path) -> Path:
    rng = random.Random(30)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzéüß") for _ in range(rng.randint(1, 9)))
             for _ in range(300)] + ["日本語", "naïve", "Ωmega", "😀", "def", "return", "    ", "\t"]
    root.mkdir(parents=True, exist_ok=True)
    for f in range(3):
        lines = []
        for _ in range(1500):
            indent = " " * rng.choice([0, 0, 4, 8])
            lines.append(indent + " ".join(rng.choices(words, k=rng.randint(0, 14))) + rng.choice(["", ":", ".", " "]))
        (root / f"part{f}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # a stray invalid byte in the middle of a line: decoded with a replacement character
    (root / "bad.txt").write_bytes(b"good line\nbad \xff\xfe byte here\n" * 40 + "tail ünïcode\n".encode() * 30)
    with open(root / "records.jsonl", "w", encoding="utf-8") as fh:
        for i in range(400):
            text = "\n".join(" ".join(rng.choices(words, k=rng.randint(1, 10))) for _ in range(rng.randint(1, 6)))
            fh.write(json.dumps({"id": i, "text": text}) + "\n")
    return root


def digest(out: Path, index: bool = True) -> str:
    meta = json.loads((out / "meta.json").read_text())
    h = hashlib.sha256()
    for split in ("train", "val"):
        for s in meta["shards"][split]:
            h.update((out / s["name"]).read_bytes())
            if not index:
                continue
            with np.load(out / s["name"].replace(".bin", ".idx.npz")) as z:
                for k in sorted(z.files):
                    h.update(k.encode() + np.ascontiguousarray(z[k]).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize(("encoder", "workers", "block_bytes"),
                         [("tiktoken", 1, 1 << 24), ("tokenizers", 1, 1 << 24), ("tiktoken", 2, 50_000)])
def test_bpe_shards_are_the_recorded_bytes(tmp_path, encoder, workers, block_bytes):
    """(Small blocks and two worker processes: many blocks and batches, the same bytes.)"""
    if encoder == "tiktoken":
        pytest.importorskip("tiktoken")
    src = make_corpus(tmp_path / "src")
    out = tmp_path / "out"
    meta = prepare([str(src)], out, "file", log=lambda m: None,
                   options=PrepareOptions(tokenizer="file", tokenizer_file=str(VOCAB), encoder=encoder, workers=workers,
                                          shard_tokens=1 << 16, min_val_tokens=4000, segment_lines=50,
                                          block_bytes=block_bytes))
    assert meta["encoder"] == encoder
    assert len(meta["shards"]["train"]) > 1  # several shards, closed at document boundaries
    assert digest(out, index=False) == TOKENS
    assert digest(out) == DIGEST


def test_lines_from_newlines_are_those_of_the_offsets(tmp_path, monkeypatch):
    """The same corpus with the line table forced (the ``tokenizers`` library's character offsets, as
    for a tokenizer that is not byte-level): every line start, and the file and line of every token,
    agree with what the index finds from the tokens' newlines. Small documents cut mid-line
    (``max_doc_bytes``) and multi-line JSON records included."""
    src = make_corpus(tmp_path / "src")
    opts = PrepareOptions(tokenizer="file", tokenizer_file=str(VOCAB), encoder="tokenizers", workers=1,
                          shard_tokens=1 << 16, min_val_tokens=4000, segment_lines=50, max_doc_bytes=700)
    prepare([str(src)], tmp_path / "newlines", "file", log=lambda m: None, options=opts)
    monkeypatch.setattr(pipeline, "newline_table", lambda text: None)
    prepare([str(src)], tmp_path / "table", "file", log=lambda m: None, options=opts)
    for split in ("train", "val"):
        lazy, table = TokenSplit(tmp_path / "newlines", split), TokenSplit(tmp_path / "table", split)
        with np.load(tmp_path / "table" / f"{split}/000000.idx.npz") as z:
            assert "line_starts" in z.files
        with np.load(tmp_path / "newlines" / f"{split}/000000.idx.npz") as z:
            assert "line_starts" not in z.files and "seg_start" in z.files
        assert np.array_equal(np.asarray(lazy.tokens[:]), np.asarray(table.tokens[:]))
        assert np.array_equal(lazy.line_starts, table.line_starts) and len(lazy.line_starts) > 500
        # each side of the first 1,500 line starts, and 1,500 tokens anywhere
        edges = np.concatenate([table.line_starts[:1500], table.line_starts[1:1500] - 1])
        for pos in np.concatenate([edges, np.random.default_rng(0).integers(0, len(lazy), 1500)]).tolist():
            assert lazy.source(pos) == table.source(pos), pos
