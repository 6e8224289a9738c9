"""Room on disk for the next checkpoint, made before it is written.

The $1000 8x H100 setup guide's runbook planned 31 checkpoints of ~17 GB by hand and, for a disk running low, said to
delete the optimizer files of old checkpoints. Here that happens before each checkpoint: rank 0
compares the free space of the checkpoint folder with what the next checkpoint will take (the size
of the newest complete one on disk, or, before the first, the model and optimizer state's bytes, the
weights counted twice where model.safetensors is written beside model.pt) and,
when it would not fit, drops optimizer files: those of checkpoints that are neither the newest nor
the best first (oldest first), then the best's; never the newest's, the one a resume continues from.

A checkpoint without its optimizer files keeps its weights, meta.json and tokenizer: ``serve``,
``sample`` and ``fetch-best`` use it as before, and a resume from it restores the weights, step
and data position with fresh optimizer moments (said in the log). Its meta.json is rewritten first,
atomically, without the dropped files in ``files`` and with their names in ``optimizer_dropped``,
so it still verifies: a crash between the two steps leaves extra files, never a listed one missing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.loop.checkpoint import best_checkpoint, list_checkpoints, read_meta

disk_usage: Callable[[Path], tuple[int, int, int]] = shutil.disk_usage  # type: ignore[assignment]
"""(total, used, free) bytes of the disk a path is on; looked up at each call (tests put a small disk here)."""

MARGIN = 0.05  # the next checkpoint may be a little larger than the last (meta.json grows with the run)
ESTIMATE_MARGIN = 0.10  # before the first checkpoint the size is computed, not measured: pickling adds a little


@dataclass(frozen=True)
class Room:
    ok: bool  # the next checkpoint fits now
    need: int  # bytes the next checkpoint is expected to take, margin included
    free: int  # bytes free after any optimizer files were dropped
    basis: str  # where ``need`` comes from
    dropped: tuple[str, ...] = ()  # checkpoint folders whose optimizer files were deleted
    freed: int = 0  # bytes those files took


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())


def is_complete(path: Path) -> bool:
    """Every file meta.json lists is there, optimizer files included (none were dropped)."""
    meta = read_meta(path)
    if meta is None or meta.get("optimizer_dropped"):
        return False
    return all((path / name).exists() for name in (meta.get("files") or {"model.pt": None}))


def expected_bytes(root: Path, estimate: int) -> tuple[int, str]:
    """(bytes the next checkpoint will take, margin included; what that rests on)."""
    for _, path in list_checkpoints(root):
        if is_complete(path):
            size = folder_bytes(path)
            return int(size * (1 + MARGIN)), f"the size of {path.name} ({size / 1e9:.2f} GB)"
    return int(estimate * (1 + ESTIMATE_MARGIN)), "the model and optimizer state's size"


def drop_optimizer(ckpt: Path) -> int:
    """Delete ``ckpt``'s optimizer files, meta.json first rewritten without them; returns the bytes freed."""
    names = sorted(p.name for p in ckpt.glob("optim_rank*.pt"))
    meta = read_meta(ckpt)
    if not names or meta is None:
        return 0
    files = {k: v for k, v in (meta.get("files") or {}).items() if k not in names}
    meta = dict(meta, files=files, optimizer_dropped=sorted(set(meta.get("optimizer_dropped") or []) | set(names)))
    tmp = ckpt / "meta.json.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(meta, indent=1, default=str))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(ckpt / "meta.json")
    freed = 0
    for name in names:
        try:
            freed += (ckpt / name).stat().st_size
            (ckpt / name).unlink()
        except OSError:
            continue
    return freed


def make_room(root: Path, need: int, basis: str = "", log: Callable[[str], None] = lambda m: None) -> Room:
    """Drop optimizer files until ``need`` bytes are free in ``root`` or none are left to drop but the
    newest checkpoint's. Leftovers of a crash mid-write (``.tmp_*``, ``.del_*``) go first."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for pattern in (".tmp_*", ".del_*"):
        for p in root.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)
    free = disk_usage(root)[2]
    if free >= need:
        return Room(True, need, free, basis)
    newest_first = [p for _, p in list_checkpoints(root)]
    latest = newest_first[0] if newest_first else None
    best = best_checkpoint(root)
    order = [p for p in reversed(newest_first) if p not in (latest, best)]
    if best is not None and best != latest:
        order.append(best)
    dropped: list[str] = []
    freed = 0
    for path in order:
        if free >= need:
            break
        got = drop_optimizer(path)
        if got:
            dropped.append(path.name)
            freed += got
            log(f"disk: dropped the optimizer files of {path.name}{' (the best)' if path == best else ''}, "
                f"{got / 1e9:.2f} GB freed (its weights stay)")
        free = disk_usage(root)[2]
    return Room(free >= need, need, free, basis, tuple(dropped), freed)
