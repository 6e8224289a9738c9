"""Running gpucli in-process as a user would, and waiting for a run to get somewhere."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

# The small, fast trainer settings every end-to-end run uses: a 64-token context, batches of 4, a
# checkpoint and a validation every 5 steps, a few hundred KB of the demo corpus. No sample prompts:
# generating them after each checkpoint took ~0.5 s of CPU (2 s on a loaded machine), and no test
# outside tests/trainer reads samples.jsonl.
FAST_TRAINER = ["--set", "model.max_seq_len=64", "--set", "training.seq_len=64", "--set", "training.batch_size=4",
                "--set", "training.checkpoint_interval=5", "--set", "training.log_interval=1",
                "--set", "training.val_batches=2", "--set", "training.eval_max_new_tokens=4",
                "--set", "training.eval_prompts=[]",
                "--set", "training.tcf=false", "--val-interval", "5", "--steps", "400"]


def cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    """``gpucli ARGS`` in this process: (exit code, stdout, stderr)."""
    from gpucli.cli import render
    from gpucli.cli.app import main

    render.reset_consoles()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def rows_of(capsys: Any, name: str) -> list[dict]:
    """The run's metrics rows, as `gpucli tail --no-follow --json` gives them."""
    code, out, err = cli(capsys, "tail", name, "--no-follow", "--json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def fetched_whole(folder: Any) -> dict[str, Any]:
    """A fetched checkpoint's meta.json, after checking that every file it lists came home intact, the
    weights among them: the best folder holds model.safetensors alone, a periodic one model.pt beside it."""
    import hashlib
    from pathlib import Path

    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    assert {"model.pt", "model.safetensors"} & set(meta["files"])
    for file_name, digest in meta["files"].items():
        assert hashlib.sha256((folder / file_name).read_bytes()).hexdigest() == digest, file_name
    return meta
