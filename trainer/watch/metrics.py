"""metrics.jsonl (+ TensorBoard when installed), MFU against a known peak, and PPL-spike detection.

Every row of ``metrics.jsonl`` is one JSON object with a ``kind`` (typed, with units, in
``trainer/spec/metricsrow.py``: the trainer writes through it and gpucli reads through it):

- ``train``: step, loss, ppl, lr, embedding_lr, grad_norm, tok_per_s, dt_ms, mfu, mem_gib, elapsed_s,
  cost_usd, tokens, stage, seq_len
- ``val``: step, val_loss, val_ppl, plus ``tcf/...`` geometry metrics
- ``event``: ``event`` = started | resumed | stage_transition | ppl_spike | checkpoint | early_stop |
  error | finished (finished rows carry ``reason``: max_steps, max_hours, max_cost (limits.budget_usd),
  early_stop, signal)
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.spec.metricsrow import encode

# Dense bf16 tensor-core peaks (no sparsity), by a substring of torch.cuda.get_device_name().
# Order matters: the first match wins, so more specific names come first. A device not listed gets
# mfu=None: a missing number is better than a wrong one.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM / "H100 80GB HBM3"
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("RTX A6000", 155e12),
]


def peak_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, peak in PEAK_BF16_FLOPS:
        if key in device_name:
            return peak
    return None


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None, n_devices: int = 1) -> float | None:
    if peak is None or tokens_per_s <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak * n_devices)


def memory_gib(device: Any) -> float:
    """Peak memory of a ``torch.device``: the CUDA allocator's on a GPU, the process's max RSS on CPU."""
    if device.type == "cuda":
        import torch  # lazy: the rows are written and read without torch

        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        import resource  # Unix only

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    except Exception:
        return float("nan")


def safe_exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


class MetricsLogger:
    """Appends rows to metrics.jsonl (flushed each row, so ``tail -f`` and a copy mid-run both work)."""

    def __init__(self, out_dir: Path, enabled: bool = True, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self._f = None
        self._tb = None
        self.tracker: Any = None  # trainer.watch.trackers.Tracker: train and val rows go to it too
        if not enabled:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self._f = open(out_dir / "metrics.jsonl", "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: tensorboard

                self._tb = SummaryWriter(str(out_dir / "tb"))
            except Exception:  # tensorboard not installed: the jsonl is the record
                self._tb = None

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled or self._f is None:
            return
        row = {k: _clean(v) for k, v in row.items()}
        row.setdefault("time", time.time())
        self._f.write(encode(row) + "\n")  # the typed row (trainer.spec.metricsrow) gpucli reads back
        self._f.flush()
        if self._tb is not None and row.get("kind") in ("train", "val") and "step" in row:
            prefix = row["kind"]
            for k, v in row.items():
                if k in ("step", "time", "kind") or not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                self._tb.add_scalar(f"{prefix}/{k}" if "/" not in k else k, v, row["step"])
        if self.tracker is not None and row.get("kind") in ("train", "val"):
            self.tracker.log(row)

    def event(self, event: str, **fields: Any) -> None:
        self.write({"kind": "event", "event": event, **fields})

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.finish()
            self.tracker = None
        if self._f is not None:
            self._f.close()
            self._f = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _clean(v: Any) -> Any:
    """JSON has no NaN/inf: write them as null (a reader can still see the row)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class SpikeDetector:
    """A value above ``factor`` x the mean of the last ``window`` values (the Atlas 1B build plan's PPL spikes)."""

    def __init__(self, window: int = 20, factor: float = 2.0, min_history: int = 5) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.factor, self.min_history = factor, min_history

    def update(self, value: float) -> float | None:
        """Returns the rolling mean when ``value`` is a spike, else None. Spikes do not enter the mean."""
        if len(self.values) >= self.min_history:
            mean = sum(self.values) / len(self.values)
            if value > self.factor * mean:
                return mean
        if math.isfinite(value):
            self.values.append(value)
        return None


def write_status(out_dir: Path, **fields: Any) -> None:
    """status.json, replaced atomically: the run's state as the watchdog and gpucli read it."""
    tmp = out_dir / "status.json.tmp"
    tmp.write_text(json.dumps({**fields, "updated": time.time()}))
    tmp.replace(out_dir / "status.json")


def append_samples(out_dir: Path, rows: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """The sampled prompts' rows, appended to samples.jsonl and logged."""
    with open(out_dir / "samples.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    for r in rows:
        say(f"sample @{r['step']} {r['prompt']!r} -> {r['text'][:120]!r}")
