"""Calibration entries from a finished run: the trainer's measured speed, for the planner.

``gpucli calibrate RUN`` reads the run's metrics rows and its newest checkpoint's meta.json (the
model shape the trainer really built) and appends one entry to ``GPUCLI_HOME/calibration.yaml``,
which the catalogue merges with its own measured entries.
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path
from typing import Any

import yaml

from gpucli.errors import UsageError
from gpucli.runs.records import RunRecord
from trainer.spec.metricsrow import MetricsRow, as_rows


def entry_from_run(record: RunRecord, rows: list[dict[str, Any]] | list[MetricsRow], meta: dict[str, Any] | None,
                   run_config: dict[str, Any]) -> dict[str, Any]:
    """One calibration entry (the same fields scripts/bench_trainer.py writes)."""
    if not record.gpu:
        raise UsageError(f"run {record.name} ran on a CPU: there is no GPU speed to calibrate with")
    train = [r for r in as_rows(rows) if r.kind == "train" and r.tok_per_s is not None]
    if len(train) < 5:
        raise UsageError(f"run {record.name} has {len(train)} logged steps; calibration needs at least 5",
                         hint="let it run longer, then try again")
    steady = train[max(1, len(train) // 5):]  # the first rows include compilation and warm-up
    mfus = [r.mfu for r in steady if r.mfu is not None]
    mems = [r.mem_gib for r in train if r.mem_gib is not None]
    cfg_model = run_config.get("model", {})
    shape = dict((meta or {}).get("model_shape") or {})
    model = {
        "name": record.model,
        "d_model": shape.get("d_model", cfg_model.get("d_model")),
        "n_layers": shape.get("n_layers", cfg_model.get("n_layers")),
        "n_heads": shape.get("n_heads", cfg_model.get("n_heads")),
        "d_ff": shape.get("d_ff", cfg_model.get("d_ff")),
        "vocab_size": shape.get("vocab_size", cfg_model.get("vocab_size")),
    }
    if any(v is None for v in model.values()):
        raise UsageError(f"run {record.name}: the model shape is not known (no checkpoint meta.json yet)")
    training = run_config.get("training", {})
    hardware = run_config.get("hardware", {})
    return {
        "workload": "train", "gpu": record.gpu, "gpu_count": record.n_gpus, "model": model,
        "seq_len": steady[-1].seq_len or training.get("seq_len"),
        "micro_batch": training.get("batch_size"),
        "precision": "bf16" if hardware.get("mixed_precision", True) else "fp32",
        "compile": hardware.get("compile", True) not in (False, "off"),
        "tokens_per_s": round(statistics.median(r.tok_per_s for r in steady if r.tok_per_s is not None), 1),
        "mfu": round(statistics.median(mfus), 4) if mfus else None,
        "peak_mem_gib": round(max(mems), 2) if mems else None,
        "date": dt.date.today().isoformat(),
        "trainer_version": (meta or {}).get("trainer_version"),
        "source": f"gpucli calibrate {record.name}",
    }


def append_entry(path: Path, entry: dict[str, Any]) -> None:
    """Append as one more item of the top-level YAML list (the file stays one valid list)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = yaml.safe_load(path.read_text()) if path.exists() else None
    if existing is not None and not isinstance(existing, list):
        raise UsageError(f"{path}: expected a YAML list of calibration entries")
    with open(path, "a") as fh:
        fh.write(yaml.safe_dump([entry], sort_keys=False))
