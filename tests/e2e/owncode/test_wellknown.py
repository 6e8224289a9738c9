"""An unchanged copy of a well-known public training script through gpucli on CPU: Karpathy's nanoGPT
(train.py, model.py, configurator.py, its shakespeare_char config and prepare.py). The project does not
carry other projects' code, and the test machines have no network: the test runs on a checkout named by
NANOGPT_DIR (e.g. `git clone https://github.com/karpathy/nanoGPT`) and is skipped without one; the
format tests in test_launch_local.py cover its log lines everywhere. Its data step is run as --setup on local text (prepare.py downloads only
when input.txt is missing), a tiny model is trained with nanoGPT's own command-line overrides, `tail`
shows its `iter N: loss X` lines by step and its `step N: ... val loss Y` evaluations, and fetch-best
brings back the ckpt.pt it overwrites."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.owncode.helpers import fetch_best, finished_rows, status_json
from tests.support.cli import cli
from tests.support.jobscripts import local_text

FILES = ("train.py", "model.py", "configurator.py", "config/train_shakespeare_char.py",
         "data/shakespeare_char/prepare.py")


def nanogpt_checkout(root: Path) -> Path:
    """A copy of the NANOGPT_DIR checkout's files, unchanged, with local text as its input.txt."""
    upstream = Path(os.environ.get("NANOGPT_DIR", ""))
    if not os.environ.get("NANOGPT_DIR") or not all((upstream / f).is_file() for f in FILES):
        pytest.skip("set NANOGPT_DIR to a nanoGPT checkout to run it unchanged through gpucli")
    for path in FILES:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(upstream / path, root / path)
    (root / "data" / "shakespeare_char" / "input.txt").write_text(local_text() * 4)
    return root


def test_unchanged_nanogpt_trains_through_gpucli(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = nanogpt_checkout(tmp_path / "nanoGPT")
    py = sys.executable
    run = (f"{py} train.py config/train_shakespeare_char.py --device=cpu --compile=False --dtype=float32 "
           "--eval_iters=2 --log_interval=1 --block_size=32 --batch_size=4 --n_layer=1 --n_head=2 --n_embd=32 "
           "--max_iters=20 --lr_decay_iters=20 --warmup_iters=2 --dropout=0.0 --eval_interval=10 "
           '--out_dir="$GPUCLI_CHECKPOINTS"')
    rc, out, err = cli(capsys, "launch", "--provider", "local", "--code", str(code), "--name", "nanogpt",
                       "--setup", f"{py} data/shakespeare_char/prepare.py", "--run", run)
    assert rc == 0, err
    rows = finished_rows(capsys, "nanogpt", timeout_s=300)
    finished = [r for r in rows if r.get("event") == "finished"][-1]
    assert finished["reason"] == "exit 0", finished
    train = [(r["step"], r["loss"]) for r in rows if r.get("kind") == "train"]
    assert [s for s, _ in train] == list(range(0, 20)) or [s for s, _ in train] == list(range(0, 21)), train
    vals = [(r["step"], r["val_loss"]) for r in rows if r.get("kind") == "val"]
    assert [s for s, _ in vals] == [0, 10, 20]
    assert train[-1][1] < train[0][1]  # it learns
    assert status_json(capsys, "nanogpt")["state"] == "finished"
    got = fetch_best(capsys, "nanogpt", tmp_path / "fetched")
    assert got["checkpoint"] == "ckpt.pt" and got["files"] == ["ckpt.pt"]
    pod_ckpt = Path(runs.load("nanogpt").workdir) / "code" / "checkpoints" / "ckpt.pt"
    assert (Path(got["dest"]) / "ckpt.pt").read_bytes() == pod_ckpt.read_bytes()
    rc, out, err = cli(capsys, "tail", "nanogpt", "--no-follow")
    assert rc == 0 and "loss" in out
