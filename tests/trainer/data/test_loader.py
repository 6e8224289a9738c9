"""The loader and tokenizers in process: provenance, determinism and resume, BPE round trips."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.loader import BatchLoader, ByteTokenizer, TokenSplit, stdlib_sources, val_batches


def test_provenance_points_at_the_real_line(data_dir):
    split = TokenSplit(data_dir, "train")
    root, _ = stdlib_sources()
    tok = ByteTokenizer()
    for pos in (0, 12345, len(split) // 2, len(split) - 3):
        f, line = split.source(pos)
        text_line = (root / f).read_text().splitlines(keepends=True)[line - 1]
        # walk back to the line's first token and compare bytes
        li = int(np.searchsorted(split.line_starts, pos, side="right")) - 1
        start = int(split.line_starts[li])
        got = tok.decode(np.asarray(split.tokens[start : start + len(text_line.encode())]).tolist())
        assert got == text_line



def test_loader_is_deterministic_resumable_and_rank_disjoint(data_dir):
    split = TokenSplit(data_dir, "train")
    a = BatchLoader(split, 4, 32, seed=3)
    first = [a.next().starts.copy() for _ in range(5)]
    state = a.state_dict()
    rest = [a.next().starts.copy() for _ in range(3)]
    b = BatchLoader(split, 4, 32, seed=3)
    b.load_state_dict(state)
    assert all((x == y).all() for x, y in zip(rest, [b.next().starts for _ in range(3)], strict=True))
    r0, r1 = BatchLoader(split, 4, 32, 0, 2, seed=3), BatchLoader(split, 4, 32, 1, 2, seed=3)
    assert not set(r0.next().starts) & set(r1.next().starts)
    assert len(first) == 5
    v0 = val_batches(TokenSplit(data_dir, "val"), 3, 4, 32, 0, 2)
    v1 = val_batches(TokenSplit(data_dir, "val"), 3, 4, 32, 1, 2)
    assert len(v0) == len(v1) == 3



def test_bpe_tokenizer_roundtrip(tmp_path):
    pytest.importorskip("tokenizers")
    from trainer.data.loader import load_tokenizer, prepare

    src = tmp_path / "a.txt"
    src.write_text("hello world\n" * 600 + "def f(x):\n    return x + 1\n" * 300)
    meta = prepare([str(src)], tmp_path / "d", "bpe", bpe_vocab_size=300, val_split=0.2, log=lambda m: None)
    tok = load_tokenizer(tmp_path / "d")
    assert meta["vocab_size"] <= 300 and tok.decode(tok.encode("hello world\n")) == "hello world\n"
    f, line = TokenSplit(tmp_path / "d", "val").source(0)
    assert f == str(src) and (line - 1) % 200 == 0  # validation holds whole 200-line documents
