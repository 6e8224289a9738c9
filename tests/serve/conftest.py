"""Fixtures for the serving tests: a tiny checkpoint written the trainer's way, and a live server."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest


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
