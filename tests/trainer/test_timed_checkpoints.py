"""training.checkpoint_every_s: a checkpoint once that much time has passed since the last one, besides
the step interval (seed 004 saves every hour)."""

from __future__ import annotations

import json

from tests.trainer.conftest import run_trainer, tiny_args


def _checkpoint_steps(out) -> list[tuple[int, str]]:  # noqa: ANN001
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["checkpoint_kind"]) for r in rows if r.get("event") == "checkpoint"]


def test_a_due_time_checkpoints_on_the_next_step(data_dir, tmp_path):
    # Due after a millisecond, while the step interval alone would save none (only the final). The flag is
    # agreed by the ranks at the end of a step (with the stop flags, one collective) and saved on the next
    # step; the clock restarts at each save: steps 1, 3, 5.
    out = tmp_path / "timed"
    r = run_trainer(tiny_args(data_dir, out, **{"training.max_steps": 5, "training.checkpoint_interval": 1000,
                                                "training.checkpoint_every_s": 0.001, "training.keep_last": 10}))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [s for s, kind in _checkpoint_steps(out) if kind == "regular"] == [1, 3, 5]
