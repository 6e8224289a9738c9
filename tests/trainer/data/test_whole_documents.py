"""BPE preparation encodes whole documents: the tokens the model meets when it reads a whole prompt
(newline-plus-indent merges included) are the tokens it trained on, and provenance (file:line of a
position) still points at the right line, found from the encoder's offsets."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from trainer.data.loader import TokenSplit, prepare
from trainer.data.pipeline import PrepareOptions
from trainer.data.tokenizer import BPETokenizer

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """~40 small standard-library modules (each one document: under 200 lines), BPE-prepared."""
    root = tmp_path_factory.mktemp("docs")
    src = root / "src"
    src.mkdir()
    lib = Path(sysconfig.get_paths()["stdlib"])
    picked = [p for p in sorted(lib.glob("*.py")) if 40 < len(p.read_text(errors="replace").splitlines()) < 190][:40]
    for p in picked:
        (src / p.name).write_text(p.read_text(errors="replace"))
    prepare([str(src)], root / "d", "bpe", bpe_vocab_size=2000, log=lambda m: None,
            options=PrepareOptions(workers=1, min_val_tokens=2000))
    return src, root / "d"


def test_every_token_of_a_whole_document_encoding_occurs_in_the_shards(corpus):
    src, d = corpus
    tok = BPETokenizer.load(d / "tokenizer.json")
    seen = set(np.unique(np.concatenate([np.asarray(TokenSplit(d, s).tokens[:]) for s in ("train", "val")])).tolist())
    joined = 0
    for f in sorted(src.iterdir()):
        ids = tok.encode(f.read_text())  # as a prompt reaches the model at serving time
        assert set(ids) <= seen, f"{f.name}: {sorted(set(ids) - seen)[:10]} never trained on"
        joined += sum(1 for i in ids if tok.decode([i]).startswith("\n") and len(tok.decode([i])) > 1)
    assert joined > 0  # tokens that join a newline with what follows: line-by-line encoding never makes them


def test_provenance_finds_the_line_through_the_offsets(corpus):
    src, d = corpus
    tok = BPETokenizer.load(d / "tokenizer.json")
    split = TokenSplit(d, "train")
    rng = np.random.default_rng(0)
    checked = 0
    for pos in rng.integers(0, len(split) - 1, 60).tolist():
        f, line = split.source(int(pos))
        text = (src / Path(f).name).read_text().splitlines(keepends=True)[line - 1]
        li = int(np.searchsorted(split.line_starts, pos, side="right")) - 1
        start = int(split.line_starts[li])
        got = tok.decode(np.asarray(split.tokens[start : start + 40]).tolist())
        body = text.strip("\n")
        if body.strip():
            # the line's first token may begin with the newline(s) that end the line before
            assert got.lstrip("\n").startswith(body[:20].lstrip("\n")), (f, line, got[:40], body[:40])
            checked += 1
    assert checked > 30


def test_tiktoken_encoder_writes_the_same_shards(corpus, tmp_path):
    """The pipeline picks tiktoken for this BPE (it agrees on the corpus) and the shards are those of
    the tokenizers library, byte for byte; a forced tiktoken run says which encoder it used."""
    pytest.importorskip("tiktoken")
    src, d = corpus
    meta = json.loads((d / "meta.json").read_text())
    assert meta["encoder"] == "tiktoken"
    prepare([str(src)], tmp_path / "slow", "file", log=lambda m: None,
            options=PrepareOptions(workers=1, min_val_tokens=2000, tokenizer="file",
                                   tokenizer_file=str(d / "tokenizer.json"), encoder="tokenizers"))
    slow = json.loads((tmp_path / "slow" / "meta.json").read_text())
    assert slow["encoder"] == "tokenizers"
    for split in ("train", "val"):
        assert np.array_equal(np.asarray(TokenSplit(d, split).tokens[:]),
                              np.asarray(TokenSplit(tmp_path / "slow", split).tokens[:]))
        assert np.array_equal(TokenSplit(d, split).line_starts, TokenSplit(tmp_path / "slow", split).line_starts)
