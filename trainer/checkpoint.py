"""Checkpoints that survive crashes, preemption and truncated copies.

Layout (``<out_dir>/checkpoints/step_000500/``)::

    model.pt          full model state dict (plain keys, loadable on one GPU or CPU)
    optim_rank0.pt    optimizer state + RNG states of rank 0 (one file per rank)
    meta.json         step, losses, tokens seen, config, sha256 of every file, data-loader position
    tokenizer.json    (BPE) / data_meta.json: what ``trainer.sample`` needs to decode

Everything is written into ``.tmp_step_000500`` and renamed into place only when complete, so a
crash mid-write leaves the previous checkpoint untouched; meta.json (readable without torch) holds
each file's sha256, so a truncated or corrupted copy is detected and skipped on resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STEP_PREFIX = "step_"


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:06d}"


class _HashingFile:
    """A write-only file object that hashes what passes through, so saving does not re-read GBs."""

    def __init__(self, f) -> None:
        self._f, self.sha = f, hashlib.sha256()

    def write(self, b) -> int:
        self.sha.update(b)
        return self._f.write(b)

    def flush(self) -> None:
        self._f.flush()


def save_file(obj: Any, path: Path) -> str:
    """torch.save ``obj`` to ``path`` (fsynced) and return its sha256."""
    with open(path, "wb") as raw:
        hf = _HashingFile(raw)
        torch.save(obj, hf)  # type: ignore[arg-type]
        raw.flush()
        os.fsync(raw.fileno())
    return hf.sha.hexdigest()


def sha256_file(path: Path, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(
    root: Path,
    step: int,
    *,
    rank: int,
    world: int,
    model_state: dict | None,
    optim_state: dict,
    meta: dict,
    extra_files: dict[str, Path] | None = None,
    barrier: Callable[[], None] = lambda: None,
    gather: Callable[[Any], list[Any]] = lambda x: [x],
) -> Path:
    """Collective: every rank calls it. Rank 0 writes model.pt and meta.json, every rank its optimizer
    file; the directory appears under its final name only when all files are complete."""
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp_{step_dir_name(step)}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    optim_name = f"optim_rank{rank}.pt"
    optim_sha = save_file(optim_state, tmp / optim_name)
    hashes = dict(gather((optim_name, optim_sha)))
    if rank == 0:
        assert model_state is not None
        model_sha = save_file(model_state, tmp / "model.pt")
        for name, src in (extra_files or {}).items():
            shutil.copyfile(src, tmp / name)
        meta = dict(meta, step=step, world_size=world, sha256=model_sha,
                    files={"model.pt": model_sha, **hashes})
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (e.g. emergency save right after a regular one)
            old = root / f".old_{step_dir_name(step)}"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        tmp.rename(final)
        _fsync_dir(root)
    barrier()
    return final


def read_meta(ckpt: Path) -> dict | None:
    try:
        meta = json.loads((Path(ckpt) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def verify(ckpt: Path, world: int | None = None) -> tuple[bool, str]:
    """Check every file listed in meta.json against its sha256. Returns (ok, reason)."""
    ckpt = Path(ckpt)
    meta = read_meta(ckpt)
    if meta is None:
        return False, "meta.json missing or unreadable"
    files = meta.get("files") or {"model.pt": meta.get("sha256")}
    for name, want in files.items():
        path = ckpt / name
        if not path.exists():
            return False, f"{name} missing"
        if sha256_file(path) != want:
            return False, f"{name} sha256 mismatch (truncated or corrupted)"
    if world is not None and meta.get("world_size") != world:
        return True, f"world size {meta.get('world_size')} != {world}: optimizer state will be reset"
    return True, "ok"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, dir) of finished checkpoint directories, newest first (temp dirs excluded)."""
    out = []
    root = Path(root)
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(STEP_PREFIX):
            try:
                out.append((int(p.name[len(STEP_PREFIX):]), p))
            except ValueError:
                continue
    return sorted(out, reverse=True)


def find_resumable(root: Path, world: int | None = None, log: Callable[[str], None] = print) -> Path | None:
    """The newest checkpoint whose files all verify; bad ones are reported and skipped."""
    for _, path in list_checkpoints(root):
        ok, reason = verify(path, world)
        if ok:
            if reason != "ok":
                log(f"resume: {path.name}: {reason}")
            return path
        log(f"resume: skipping {path.name}: {reason}")
    return None


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints and the best by val_loss; returns removed."""
    ckpts = list_checkpoints(root)
    keep = {p for _, p in ckpts[:keep_last]}
    best = best_checkpoint(root)
    if best is not None:
        keep.add(best)
    removed = []
    for _, p in ckpts:
        if p not in keep:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    for p in Path(root).glob(".tmp_*"):  # leftovers of a crash mid-write
        shutil.rmtree(p, ignore_errors=True)
    return removed


def best_checkpoint(root: Path) -> Path | None:
    """The checkpoint with the lowest val_loss in its meta.json (reads only meta files)."""
    best: tuple[float, int, Path] | None = None
    for step, p in list_checkpoints(root):
        meta = read_meta(p)
        v = meta.get("val_loss") if meta else None
        if isinstance(v, (int, float)) and (best is None or (v, -step) < (best[0], -best[1])):
            best = (float(v), step, p)
    return best[2] if best else None


def load_model_state(ckpt: Path, map_location: str | torch.device = "cpu") -> dict:
    return torch.load(Path(ckpt) / "model.pt", map_location=map_location, weights_only=True)


def load_optim_state(ckpt: Path, rank: int, trusted: bool = False) -> dict | None:
    """Rank ``rank``'s optimizer + RNG file. ``trusted`` (FSDP: DTensor states) allows full
    unpickling; call it only for a checkpoint whose sha256 verified."""
    path = Path(ckpt) / f"optim_rank{rank}.pt"
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=not trusted)
