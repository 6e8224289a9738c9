"""The shards a BPE preparation writes are pinned byte for byte: a fixed corpus (text with indents,
blank lines, non-ASCII and invalid UTF-8, JSON Lines) and a fixed vocabulary (``bpe600.json``, a
600-token byte-level BPE kept beside this file) give tokens and a provenance index whose digest was
recorded before the encoder was made faster. Both encoders, tiktoken and the ``tokenizers``
library, must still give exactly those bytes."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest

from trainer.data.loader import prepare
from trainer.data.pipeline import PrepareOptions

pytest.importorskip("tokenizers")

VOCAB = Path(__file__).with_name("bpe600.json")
DIGEST = "4e518f60f1553a0720138e14736aa49e0f4b59a6104513a8ce64201647b631e1"  # sha256 of every shard's tokens and index arrays, in order (see digest())


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


def digest(out: Path) -> str:
    meta = json.loads((out / "meta.json").read_text())
    h = hashlib.sha256()
    for split in ("train", "val"):
        for s in meta["shards"][split]:
            h.update((out / s["name"]).read_bytes())
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
    assert digest(out) == DIGEST
