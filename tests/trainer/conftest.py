"""Fixtures for the trainer tests: one small prepared corpus, and a helper that runs the trainer
as a real subprocess (the way gpucli runs it on a pod), single-threaded so 2 ranks fit 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def trainer_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """~300 kB of the Python standard library, byte-level tokens."""
    from trainer.data.loader import prepare

    out = tmp_path_factory.mktemp("data")
    prepare([], out, "byte", val_split=0.1, max_bytes=300_000, log=lambda m: None)
    return out


@pytest.fixture(scope="session")
def straight_run(data_dir, tmp_path_factory) -> Path:
    """20 uninterrupted steps (checkpoints at 10 and 20), shared by the tests that only read it."""
    out = tmp_path_factory.mktemp("straight") / "run"
    r = run_trainer(tiny_args(data_dir, out, **{"training.eval_prompts": "[def]"}))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def tiny_args(data_dir: Path, out_dir: Path, **over: object) -> list[str]:
    """Overrides for a 0.1M-parameter model that trains a step in ~20 ms on one core."""
    base: dict[str, object] = {
        "model.preset": "tiny", "model.dropout": 0.1,
        "training.out_dir": str(out_dir), "training.batch_size": 4, "training.grad_accum_steps": 2,
        "training.seq_len": 64, "training.max_steps": 20, "training.warmup_steps": 4,
        "training.learning_rate": 0.003, "training.val_interval": 10, "training.val_batches": 2,
        "training.checkpoint_interval": 10, "training.keep_last": 5, "training.log_interval": 1,
        "training.eval_max_new_tokens": 4, "training.eval_prompts": "[]",
        "hardware.device": "cpu", "data.dir": str(data_dir),
    }
    base.update({k: v for k, v in over.items()})
    return [f"--{k}={v}" for k, v in base.items()]


def run_trainer(args: list[str], *, nproc: int = 1, timeout: float = 600, env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess:
    if nproc == 1:
        cmd = [sys.executable, "-m", "trainer.train", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "trainer.train", *args]
    return subprocess.run(cmd, cwd=REPO, env=env or trainer_env(), capture_output=True, text=True,
                          timeout=timeout)


def read_rows(out_dir: Path) -> list[dict]:
    path = out_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_losses(out_dir: Path) -> dict[int, float]:
    """step -> loss of the last train row logged for that step (a resumed run re-logs steps)."""
    return {r["step"]: r["loss"] for r in read_rows(out_dir) if r.get("kind") == "train"}


def finished(out_dir: Path) -> dict:
    rows = [r for r in read_rows(out_dir) if r.get("event") == "finished"]
    assert rows, "no finished row"
    return rows[-1]


# ---- a tiny checkpoint written the trainer's way, and a live server over it (trainer.serve) ----

def write_checkpoint(root: Path, preset: str = "tiny", seed: int = 2, step: int = 10, spec: Any = None,
                     **meta: Any) -> Path:
    """A checkpoint of an untrained ``preset`` GPT (byte tokenizer), saved by trainer.loop.checkpoint as the
    trainer saves one, so loading goes through the same code as a real run's. (Seed 2's greedy
    continuation of the tests' prompt changes character part-way, which the stop test needs.) ``spec``, a
    ModelSpec, replaces the preset."""
    import torch

    from trainer.loop import checkpoint as ckpt
    from trainer.model.gpt import GPT
    from trainer.spec.presets import MODELS

    torch.manual_seed(seed)
    model = GPT(spec or MODELS[preset])
    return ckpt.save_checkpoint(root / "checkpoints", step, rank=0, world=1, model_state=model.state_dict(),
                                optim_state={}, meta={"model_shape": model.shape.__dict__, "tokenizer": "byte",
                                                      "val_loss": 5.0, **meta})


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("serve_run"))


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    """A running server on a free port: (base_url, Server)."""
    from trainer.serve import load, make_server

    api = load(tiny_checkpoint, device="cpu", max_batch=4)
    httpd = make_server(api, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", api
    httpd.shutdown()
    httpd.server_close()
    api.engine.stop()
