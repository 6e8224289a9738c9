"""The loader over many shards (exact resume, windows across shard boundaries, high-loss provenance),
directories from before shards, and a tiny corpus that still validates and trains."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.trainer.conftest import read_rows, run_trainer, tiny_args
from trainer.data.loader import BatchLoader, TokenSplit, prepare, val_batches
from trainer.data.pipeline import PrepareOptions


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    src = root / "corpus.txt"
    src.write_text("".join(f"line {i} " + "x" * (i % 37) + "\n" for i in range(60_000)))
    prepare([str(src)], root / "d", "byte", log=lambda m: None,
            options=PrepareOptions(shard_tokens=1 << 16, workers=1, min_val_tokens=1000))
    return src, root / "d"


def test_many_shards_read_as_one_stream_with_provenance(sharded):
    src, d = sharded
    split = TokenSplit(d, "train")
    assert len(split.shards) >= 10
    whole = np.concatenate([np.asarray(s.tokens) for s in split.shards])
    assert len(split) == len(whole)
    for s in (int(split.offsets[3]) - 5, int(split.offsets[7]) - 1, 0, len(whole) - 10):  # across boundaries
        assert np.array_equal(np.asarray(split.tokens[s : s + 10]), whole[s : s + 10])
    lines = src.read_text().splitlines(keepends=True)
    for pos in (int(split.offsets[4]) + 3, int(split.offsets[9]) + 100, len(whole) - 2):
        f, line = split.source(pos)
        li = int(np.searchsorted(split.line_starts, pos, side="right")) - 1
        start = int(split.line_starts[li])
        got = bytes(whole[start : start + len(lines[line - 1])].astype(np.uint8))
        assert f == str(src) and got.decode() == lines[line - 1]


def test_loader_resumes_exactly_across_shards_and_maps_batches_to_lines(sharded):
    _, d = sharded
    split = TokenSplit(d, "train")
    a = BatchLoader(split, 8, 2000, seed=5)
    for _ in range(7):
        a.next()
    state = json.loads(json.dumps(a.state_dict()))  # as a checkpoint stores it
    want = [a.next() for _ in range(100)]  # runs into the next epoch: n_windows / 8 per epoch
    b = BatchLoader(TokenSplit(d, "train"), 8, 2000, seed=5)
    b.load_state_dict(state)
    got = [b.next() for _ in range(100)]
    for x, y in zip(want, got, strict=True):
        assert np.array_equal(x.starts, y.starts) and np.array_equal(x.x, y.x) and np.array_equal(x.y, y.y)
    assert a.epoch >= 1  # the resume point and the epoch change are both covered
    crossing = [s for w in want for s in w.starts
                if np.searchsorted(split.offsets, s, "right") != np.searchsorted(split.offsets, s + 2000, "right")]
    assert crossing, "no window crossed a shard boundary"
    srcs = a.sources(want[0])
    assert all(s.rsplit(":", 1)[0].endswith("corpus.txt") and int(s.rsplit(":", 1)[1]) >= 1 for s in srcs)


def test_directory_from_before_shards_still_loads(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    toks = np.arange(1000, dtype=np.uint16) % 256
    toks.tofile(d / "train.bin")
    np.savez(d / "train.idx.npz", line_starts=np.array([0, 500], np.int64), seg_line_idx=np.array([0], np.int64),
             seg_file=np.array([0], np.int32), seg_first_line=np.array([1], np.int64))
    (d / "meta.json").write_text(json.dumps({"tokenizer": "byte", "vocab_size": 257, "eot": 256,
                                             "dtype": "uint16", "files": ["a.txt"]}))
    split = TokenSplit(d, "train")
    assert len(split) == 1000 and split.source(700) == ("a.txt", 2)
    assert np.array_equal(np.asarray(split.tokens[100:200]), toks[100:200])
    batch = BatchLoader(split, 2, 100).next()
    assert np.array_equal(batch.x[0], toks[batch.starts[0] : batch.starts[0] + 100])


def test_short_validation_split_still_gives_every_rank_a_batch(sharded):
    _, d = sharded
    val = TokenSplit(d, "val")
    for seq in (64, len(val) // 3, len(val) * 2):  # many windows, fewer than ranks x batch, longer than the split
        b0 = val_batches(val, 2, 4, seq, 0, 2)
        b1 = val_batches(val, 2, 4, seq, 1, 2)
        assert len(b0) == len(b1) >= 1 and b0[0].x.shape[0] == 4


def test_tiny_corpus_gets_a_validation_split_and_the_trainer_validates(tmp_path):
    # Issue 15 item 6: every file under ~2000 lines left validation empty and crashed the trainer.
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j}\n" for j in range(300)))
    d = tmp_path / "data"
    meta = prepare([str(src)], d, "byte", val_split=0.1, log=lambda m: None)
    assert meta["val_tokens"] > 0 and meta["train_tokens"] > meta["val_tokens"] / 2
    out = tmp_path / "run"
    r = run_trainer(tiny_args(d, out, **{"training.max_steps": 10, "training.val_interval": 5}))
    assert r.returncode == 0, r.stderr[-3000:]
    vals = [row for row in read_rows(out) if row.get("kind") == "val"]
    assert vals and all(np.isfinite(v["val_loss"]) for v in vals)

    one = tmp_path / "one.txt"
    one.write_text("only one short document\n")
    with pytest.raises(ValueError, match="too little for both"):
        prepare([str(one)], tmp_path / "one", "byte", log=lambda m: None)
