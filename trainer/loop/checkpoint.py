"""Checkpoints that survive crashes, preemption and truncated copies.

Layout (``<out_dir>/checkpoints/step_000500/``)::

    model.pt          full model state dict (plain keys, loadable on one GPU or CPU)
    model.safetensors the same weights as safetensors (no pickle: other tools read them without
                      torch.load), where the safetensors package is installed
    optim_rank0.pt    optimizer state + RNG states of rank 0 (one file per rank)
    meta.json         step, losses, tokens seen, config, sha256 of every file, data-loader position
    tokenizer.json    (BPE) / data_meta.json: what ``trainer.sample`` needs to decode

Everything is written into ``.tmp_step_000500`` and renamed into place only when complete, so a
crash mid-write leaves the previous checkpoint untouched; meta.json (readable without torch) holds
each file's sha256, so a truncated or corrupted copy is detected and skipped on resume.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

STEP_PREFIX = "step_"


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:06d}"


class _HashingFile:
    """A write-only file object that hashes what passes through, so saving does not re-read GBs.

    Large writes are hashed on a helper thread while the same bytes go to the file (hashlib and
    file writes both release the GIL), so a write costs max(hash, write) instead of their sum; the
    call returns only when both are done, so the caller's buffer is never read after it returns."""

    def __init__(self, f) -> None:
        self._f, self.sha = f, hashlib.sha256()
        self._pool = None

    def write(self, b) -> int:
        if len(b) < 1 << 20:
            self.sha.update(b)
            return self._f.write(b)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-sha256")
        hashed = self._pool.submit(self.sha.update, b)
        try:
            return self._f.write(b)
        finally:
            hashed.result()

    def flush(self) -> None:
        self._f.flush()

    def close_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class HostStaging:
    """Copies a checkpoint's CUDA tensors to host memory in one go: a non-blocking copy per tensor
    into pinned buffers that are kept for the next checkpoint, then one synchronize.

    torch.save of CUDA tensors copies each storage into fresh pageable memory, one at a time; on an
    H100 VM that ran at ~1 GB/s (page faults on new memory), most of a 16 GB checkpoint's time.
    Buffers are pinned only while their total stays under ``max_fraction`` of the host's memory;
    past that, tensors are copied the plain way."""

    def __init__(self, max_fraction: float = 0.25) -> None:
        self._buffers: list[torch.Tensor | None] = []
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
        self._pin_budget = int(total * max_fraction)

    def to_host(self, obj: Any) -> Any:
        """``obj`` (nested dicts / lists / tuples) with every plain CUDA tensor replaced by a host copy;
        tensors that share memory stay shared."""
        seen: dict[tuple, torch.Tensor] = {}
        slot = pinned = 0
        copied = False

        def host(t: torch.Tensor) -> torch.Tensor:
            nonlocal slot, pinned, copied
            key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
            if key in seen:
                return seen[key]
            i, slot = slot, slot + 1
            # PyTorch's pinned-memory allocator rounds each block up to a power of two: count that.
            nbytes = 1 << max(0, (t.numel() * t.element_size() - 1).bit_length())
            if i == len(self._buffers):
                self._buffers.append(None)
            buf = self._buffers[i]
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = None
                if pinned + nbytes <= self._pin_budget:
                    try:
                        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    except RuntimeError:  # pinning refused (locked-memory limits): plain copies
                        self._pin_budget = 0
                self._buffers[i] = buf  # None keeps later tensors on their own slots
                if buf is None:
                    seen[key] = t.detach().cpu()
                    return seen[key]
            pinned += nbytes
            buf.copy_(t.detach(), non_blocking=True)
            copied = True
            seen[key] = buf
            return buf

        def walk(o: Any) -> Any:
            if type(o) is torch.Tensor and o.is_cuda:  # DTensors and CPU tensors are saved as they are
                return host(o)
            if isinstance(o, dict):
                items = [(k, walk(v)) for k, v in o.items()]
                return type(o)(items) if type(o) in (dict, OrderedDict) else dict(items)
            if isinstance(o, list):
                return [walk(v) for v in o]
            if isinstance(o, tuple) and not hasattr(o, "_fields"):
                return tuple(walk(v) for v in o)
            return o

        out = walk(obj)
        if copied:
            torch.cuda.synchronize()
        return out


def save_files(objs: dict[str, Any], directory: Path) -> dict[str, str]:
    """torch.save each object to ``directory/name`` (fsynced), the files in parallel (hashing is the
    slow part and each file has its own hasher); returns name -> sha256."""
    if len(objs) == 1:
        return {name: save_file(obj, directory / name) for name, obj in objs.items()}
    with ThreadPoolExecutor(len(objs), thread_name_prefix="ckpt-write") as pool:
        futures = {name: pool.submit(save_file, obj, directory / name) for name, obj in objs.items()}
        return {name: f.result() for name, f in futures.items()}


def save_file(obj: Any, path: Path) -> str:
    """torch.save ``obj`` to ``path`` (fsynced) and return its sha256."""
    with open(path, "wb") as raw:
        hf = _HashingFile(raw)
        try:
            torch.save(obj, hf)  # type: ignore[arg-type]
        finally:
            hf.close_pool()
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
    staging: HostStaging | None = None,
) -> Path:
    """Collective: every rank calls it. Rank 0 writes model.pt and meta.json, every rank its optimizer
    file; the directory appears under its final name only when all files are complete. CUDA tensors
    are copied to host memory first (through ``staging`` when given), then the files are written and
    hashed in parallel."""
    root = Path(root)
    final = root / step_dir_name(step)
    tmp = root / f".tmp_{step_dir_name(step)}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    optim_name = f"optim_rank{rank}.pt"
    objs = {optim_name: optim_state}
    if rank == 0:
        assert model_state is not None
        objs["model.pt"] = model_state
    if staging is not None:
        objs = staging.to_host(objs)
    written = save_files(objs, tmp)
    hashes = dict(gather((optim_name, written[optim_name])))
    if rank == 0:
        model_sha = written["model.pt"]
        weights = {"model.pt": model_sha, **safetensors_copy(objs["model.pt"], tmp)}
        for name, src in (extra_files or {}).items():
            shutil.copyfile(src, tmp / name)
        meta = dict(meta, step=step, world_size=world, sha256=model_sha, files={**weights, **hashes})
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
            # Out of sight first, in one rename: a reader listing the folder (fetch-best on a live
            # run) never sees a checkpoint whose meta.json is there and model.pt already gone.
            gone = p.with_name(f".del_{p.name}")
            try:
                p.rename(gone)
            except OSError:
                gone = p
            shutil.rmtree(gone, ignore_errors=True)
            removed.append(p)
    for pattern in (".tmp_*", ".del_*"):  # leftovers of a crash mid-write or mid-delete
        for p in Path(root).glob(pattern):
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
    """The weights: model.pt, or model.safetensors where that is all there is (the ``best`` folder)."""
    ckpt = Path(ckpt)
    if not (ckpt / "model.pt").exists() and (ckpt / WEIGHTS_FILE).exists():
        from safetensors.torch import load_file  # optional: only a best/ folder holds safetensors

        return load_file(ckpt / WEIGHTS_FILE, device=str(map_location))
    return torch.load(ckpt / "model.pt", map_location=map_location, weights_only=True)


# ---------------------------------------------------------------------------------------------
# The best validated weights: one folder beside the periodic ones, replaced at each improvement.

BEST_DIR = "best"
"""``checkpoints/best``: not a ``step_*`` folder, so never resumed from, never pruned, never counted
in ``keep_last``; its meta.json says which step and validation loss it holds."""
WEIGHTS_FILE = "model.safetensors"


def save_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> str:
    """The tensors as safetensors (readable without torch.load: no pickle), fsynced; returns the sha256."""
    from safetensors.torch import save_file as st_save  # optional: torch-only images write model.pt

    st_save({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path), metadata=metadata)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return sha256_file(path)


def writes_safetensors() -> bool:
    """Whether checkpoints get model.safetensors beside model.pt (the package is optional: the train extra)."""
    return importlib.util.find_spec("safetensors") is not None


def safetensors_copy(state: dict[str, torch.Tensor], directory: Path) -> dict[str, str]:
    """``directory/model.safetensors`` beside a checkpoint's model.pt, so other tools read the weights
    without torch.load; {name: sha256}, or {} where the safetensors package is not installed (a
    torch-only image: model.pt alone, as checkpoints were before)."""
    if not writes_safetensors():
        return {}
    return {WEIGHTS_FILE: save_safetensors(state, Path(directory) / WEIGHTS_FILE, {"format": "pt"})}


def save_best(root: Path, model_state: dict, meta: dict, extra_files: dict[str, Path] | None = None) -> Path:
    """Write ``root/best`` (weights as safetensors, meta.json with ``step`` and ``val_loss`` and the
    sha256 of each file, the tokenizer files) under a temporary name, then swap it in: a reader sees
    the previous best or the new one, whole."""
    root = Path(root)
    final, tmp, old = root / BEST_DIR, root / f".tmp_{BEST_DIR}", root / f".old_{BEST_DIR}"
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        name, sha = WEIGHTS_FILE, save_safetensors(model_state, tmp / WEIGHTS_FILE, {"format": "pt"})
    except ImportError:  # no safetensors on this machine: the weights as the periodic checkpoints hold them
        name, sha = "model.pt", save_file(model_state, tmp / "model.pt")
    for extra, src in (extra_files or {}).items():
        shutil.copyfile(src, tmp / extra)
    meta = dict(meta, kind="best", sha256=sha, files={name: sha})
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    _fsync_dir(tmp)
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    _fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_optim_state(ckpt: Path, rank: int, trusted: bool = False) -> dict | None:
    """Rank ``rank``'s optimizer + RNG file. ``trusted`` (FSDP: DTensor states) allows full
    unpickling; call it only for a checkpoint whose sha256 verified."""
    path = Path(ckpt) / f"optim_rank{rank}.pt"
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=not trusted)
