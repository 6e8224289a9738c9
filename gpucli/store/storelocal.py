"""The checkpoints on the pod that the store's uploader (storesync.py, beside this file) sends: the bundled
trainer's ``step_N/`` folders and ``best/`` (with each node's files of a run over several nodes), and
your own code's per-step files and folders. Standard library only; loaded by path on the pod."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The checkpoint-naming rules of gpucli/run/files/checkpoints.py (fetch-best), for the user's own code; a test
# holds the two to the same answers.
# How a step is read from a checkpoint's file or folder name, here and on this machine alike
# (gpucli/run/files/checkpoints.py imports these; this file also runs on the pod by itself).
# A step after a keyword ("step_500", "global_step500", "checkpoint-1200", "iter_000400", "ckpt=7").
_KEYWORD_STEP = re.compile(r"(?:global_step|step|iteration|iter|checkpoint|ckpt)[-_=]?([0-9]{1,18})(?![0-9])",
                           re.IGNORECASE)
# Otherwise the first number that is not a rank or a shard index ("optim_000500_rank0.pt": 500).
_NUMBER = re.compile(r"(?<![A-Za-z0-9])(?<!rank)(?<!rank_)(?<!of)(?<!of_)([0-9]{1,18})(?![0-9])")
SKIP = re.compile(r"(^\.|\.tmp$|\.partial$|\.lock$|\.incomplete$)")  # hidden, or still being written
LOGS = re.compile(r"^events\.out\.tfevents\.|^hparams\.yaml$|^metrics\.csv$")  # a logger's files, no weights


@dataclass
class Local:
    """A whole checkpoint on the pod."""

    name: str  # its name in the store
    kind: str  # regular | best | own
    step: int | None
    files: dict[str, Path]  # name in the store -> the file on the pod
    hashes: dict[str, str] = field(default_factory=dict)  # known sha256 (the trainer's meta.json)
    loss: float | None = None
    val_loss: float | None = None
    mtime: float = 0.0
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # several nodes: each node's files, sha256


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _meta(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def trainer_checkpoints(root: Path) -> list[Local]:
    """The bundled trainer's ``step_N/`` folders and ``best/``, each with what its meta.json lists."""
    out: list[Local] = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return out
    for folder in entries:
        if not folder.is_dir() or not (folder.name.startswith("step_") or folder.name == "best"):
            continue
        meta = _meta(folder)
        if meta is None or not isinstance(meta.get("files"), dict) or not isinstance(meta.get("step"), int):
            continue
        step = meta["step"]
        hashes = {str(k): str(v) for k, v in meta["files"].items()}
        names = [*hashes, *(n for n in ("tokenizer.json", "data_meta.json") if (folder / n).is_file())]
        best = folder.name == "best"
        listed = meta.get("nodes")
        nodes = {str(k): {str(n): str(h) for n, h in v.items()} for k, v in listed.items() if isinstance(v, dict)} \
            if isinstance(listed, dict) and len(listed) > 1 else {}
        out.append(Local(name=f"best_step_{step:06d}" if best else folder.name, kind="best" if best else "regular",
                         step=step, files={n: folder / n for n in [*names, "meta.json"]}, hashes=hashes,
                         loss=_num(meta.get("train_loss")), val_loss=_num(meta.get("val_loss")), nodes=nodes))
    return out


def step_in_name(name: str) -> int | None:
    """The step a file or folder name carries, or None."""
    stem = re.sub(r"\.(pt|pth|bin|ckpt|safetensors|json|npz|npy|pkl|tar|zip|h5)$", "", name, flags=re.IGNORECASE)
    m = _KEYWORD_STEP.search(stem)
    if m:
        return int(m.group(1))
    if re.fullmatch(r"version_\d+|v\d+|run_?\d+", stem):  # a logger's run folder (Lightning's version_0)
        return None
    m = _NUMBER.search(stem)
    return int(m.group(1)) if m else None


def group_own(rels: list[str]) -> dict[tuple[str, int], list[str]]:
    """The per-step checkpoints among relative paths, keyed as gpucli.run.files.checkpoints.group_checkpoints
    keys them: (a folder with a step, or a folder + "/" for the files of one step in it, step)."""
    groups: dict[tuple[str, int], list[str]] = {}
    for rel in sorted(rels):
        parts = rel.split("/")
        if any(SKIP.search(p) for p in parts) or LOGS.search(parts[-1]):
            continue
        for i, part in enumerate(parts):
            step = step_in_name(part)
            if step is None:
                continue
            key = ("/".join(parts[: i + 1]), step) if i < len(parts) - 1 else ("/".join(parts[:i]) + "/", step)
            groups.setdefault(key, []).append(rel)
            break
    return groups


def own_checkpoints(root: Path, run_dir: Path) -> list[Local]:
    """Your own code's per-step checkpoints under ``root``, scored by the val loss logged nearest before
    (or at) each step in metrics.jsonl, as fetch-best scores them. (An overwritten file without a step,
    nanoGPT's ckpt.pt, has no version to keep apart: fetch-best brings it from the pod.)"""
    rels, mtimes = [], {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                rel = p.relative_to(root).as_posix()
                rels.append(rel)
                mtimes[rel] = p.stat().st_mtime
    vals, losses = _metric_rows(run_dir)
    out = []
    for (folder, step), files in group_own(rels).items():
        name = folder.rstrip("/").rsplit("/", 1)[-1] if not folder.endswith("/") else f"step_{step}"
        name = re.sub(r"[^A-Za-z0-9._\-]", "_", name) or f"step_{step}"
        if not name[0].isalnum():
            name = f"c{name}"
        val = [v for s, v in vals if s <= step]
        loss = [v for s, v in losses if s <= step]
        out.append(Local(name=name, kind="own", step=step, files={f: root / f for f in files},
                         val_loss=val[-1] if val else None, loss=loss[-1] if loss else None,
                         mtime=max(mtimes[f] for f in files)))
    return out


def _metric_rows(run_dir: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    vals, losses = [], []
    try:
        with open(run_dir / "metrics.jsonl", "rb") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                    continue
                if row.get("kind") == "val" and _num(row.get("val_loss")) is not None:
                    vals.append((row["step"], float(row["val_loss"])))
                elif _num(row.get("loss")) is not None:
                    losses.append((row["step"], float(row["loss"])))
    except OSError:
        pass
    return sorted(vals), sorted(losses)
