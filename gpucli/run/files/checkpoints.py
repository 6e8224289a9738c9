"""The checkpoint rules, for both kinds of job: what counts as a checkpoint, how it is verified, and
which one is the best. Downloading them is :mod:`gpucli.run.files.harvest`.

The bundled trainer writes ``checkpoints/step_N/meta.json`` with its validation loss and every file's
sha256 (:func:`list_checkpoints`, :func:`best_checkpoint`, :func:`verify`). A user's own code writes
whatever it writes under ``--checkpoints`` (:func:`choose_checkpoint`, pure: listing + rows in). Two
shapes cover the common scripts:

- **a checkpoint per step**: folders or files with a step number in the name (Hugging Face
  ``checkpoint-500/``, Lightning ``epoch=0-step=200.ckpt``, nanochat's ``model_000500.pt`` +
  ``meta_000500.json`` + ``optim_000500_rank0.pt``, anyone's ``step_500.pt``). Files of one step in one
  folder are one checkpoint. Each is scored by the validation loss logged nearest before (or at) its
  step in ``metrics.jsonl`` (``val_loss``; nanochat's ``val_bpb`` when no row has a loss); the lowest
  wins, the later step on a tie. With no validation logged before any of them, the newest step wins.
- **one overwritten file or folder** (nanoGPT's ``ckpt.pt``, saved when the val loss improves, or a
  final ``save_pretrained`` folder): brought back as it is, everything under ``--checkpoints`` that has
  no step in its path.

Hidden and temporary entries (``.name``, ``*.tmp``, ``*.partial``, ``*.lock``) are never part of a
checkpoint; ``min_age_s`` leaves out checkpoints still being written on a live run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, NotFoundError, TransferError
from gpucli.run.host import untrusted
from gpucli.ssh import sha256_file
from gpucli.store.storelocal import LOGS, SKIP, group_own, step_in_name  # one reading of a step, pod and here
from trainer.spec.metricsrow import MetricsRow, as_rows

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

# What a checkpoint holds only to resume training, not to use the model: the optimizer and scheduler
# state, RNG and grad-scaler state. Hugging Face Trainer ``optimizer.pt``, ``scheduler.pt``,
# ``rng_state*.pth``, ``scaler.pt`` (transformers/trainer.py, ``_save_optimizer_and_scheduler``,
# ``_save_rng_state``); Accelerate ``save_state``: ``optimizer.bin``, ``scheduler.bin``,
# ``random_states_N.pkl``, ``scaler.pt`` (accelerate/checkpointing.py); DeepSpeed
# ``*_optim_states.pt``; nanochat ``optim_NNNNNN_rankR.pt`` (nanochat/checkpoint_manager.py).
_RESUME_ONLY = re.compile(r"^(?:optim(?:izer)?(?:[_.\-].*)?|scheduler(?:[_.\-].*)?|lr_scheduler(?:[_.\-].*)?|"
                          r"rng_state.*|random_states.*|scaler\.pt|.*_optim_states\.pt)$", re.IGNORECASE)


@dataclass(frozen=True)
class OwnCheckpoint:
    name: str  # the folder ("checkpoint-500"), the step's file stem, or the single file's name
    files: tuple[str, ...]  # paths relative to the --checkpoints folder
    step: int | None  # None: the overwritten checkpoint
    size_bytes: int
    mtime: float  # the newest file's
    val_loss: float | None = None  # the validation value logged nearest before the step
    val_step: int | None = None  # the step it was logged at
    val_metric: str | None = None  # "val_loss" or "val_bpb"


@dataclass(frozen=True)
class CheckpointChoice:
    checkpoint: OwnCheckpoint
    reason: str  # shown to the user: why this one
    candidates: tuple[OwnCheckpoint, ...]


def resume_only(rel: str) -> bool:
    """Whether a checkpoint file is state only a resume needs (the optimizer's, the scheduler's, RNG)."""
    return bool(_RESUME_ONLY.match(rel.rsplit("/", 1)[-1]))


def model_files(files: Iterable[str]) -> tuple[str, ...]:
    """A checkpoint's files without those only a resume needs; all of them when that leaves none (a
    checkpoint that is one file, Lightning's ``.ckpt`` or LitGPT's ``lit_model.pth``, holds both)."""
    files = tuple(files)
    kept = tuple(f for f in files if not resume_only(f))
    return kept or files


def _entry(value: Any) -> tuple[int, float]:
    """(size, mtime) of a listing value: a ``RemoteFile``-like object or a ``(size, mtime)`` pair."""
    if isinstance(value, tuple):
        return int(value[0]), float(value[1])
    return int(getattr(value, "size", 0)), float(getattr(value, "mtime", 0))


def group_checkpoints(listing: Mapping[str, Any]) -> tuple[list[OwnCheckpoint], OwnCheckpoint | None]:
    """The per-step checkpoints (by step) and the overwritten one (everything without a step), from a
    listing of the checkpoints folder: relative path -> RemoteFile (or ``(size, mtime)``)."""
    rels = sorted(listing)
    groups = group_own(rels)
    grouped = {rel for files in groups.values() for rel in files}
    loose = [rel for rel in rels if rel not in grouped
             and not (any(SKIP.search(p) for p in rel.split("/")) or LOGS.search(rel.split("/")[-1]))]
    # a folder with a step is named as it is; the files of one step in a folder (key "folder/") get
    # the file's own name, or step_N
    names = {key: "" if key[0].endswith("/") else key[0].rsplit("/", 1)[-1] for key in groups}

    def build(name: str, files: list[str], step: int | None) -> OwnCheckpoint:
        entries = [_entry(listing[f]) for f in files]
        return OwnCheckpoint(name=name, files=tuple(files), step=step, size_bytes=sum(s for s, _ in entries),
                             mtime=max((m for _, m in entries), default=0.0))

    def name_of(key: tuple[str, int], files: list[str]) -> str:
        if names[key]:
            return names[key]
        return files[0].rsplit("/", 1)[-1] if len(files) == 1 else f"step_{key[1]}"

    stepped = [build(name_of(key, files), files, key[1]) for key, files in groups.items()]
    stepped.sort(key=lambda c: (c.step, c.name))
    single = None
    if loose:
        single = build(loose[0] if len(loose) == 1 else "latest", loose, None)
    return stepped, single


def _val_rows(rows: Iterable[Mapping[str, Any] | MetricsRow]) -> tuple[str | None, list[tuple[int, float]]]:
    vals = [r for r in as_rows(rows) if r.kind == "val"]
    for metric in ("val_loss", "val_bpb"):
        found = [(r.step, v) for r in vals if r.step is not None and (v := getattr(r, metric)) is not None]
        if found:
            return metric, sorted(found)
    return None, []


def score(checkpoints: list[OwnCheckpoint], rows: Iterable[Mapping[str, Any] | MetricsRow]) -> list[OwnCheckpoint]:
    """Each checkpoint with the validation value logged nearest before (or at) its step."""
    metric, vals = _val_rows(rows)
    out = []
    for ck in checkpoints:
        before = [(s, v) for s, v in vals if ck.step is not None and s <= ck.step]
        if before:
            s, v = before[-1]
            ck = dataclasses.replace(ck, val_loss=v, val_step=s, val_metric=metric)
        out.append(ck)
    return out


@dataclass(frozen=True)
class FrameworkBest:
    """The best checkpoint as the framework itself recorded it (Hugging Face ``best_model_checkpoint``)."""

    name: str | None  # the checkpoint's folder name ("checkpoint-30"), or
    metric: float | None
    source: str  # "checkpoint-40/trainer_state.json"
    step: int | None = None  # its step (nanochat: the meta_NNNNNN.json with the lowest val_bpb)
    what: str = "best_model_checkpoint"


def newest_trainer_state(listing: Mapping[str, Any]) -> str | None:
    """The ``trainer_state.json`` of the Hugging Face checkpoint with the highest step in a listing."""
    states = [(step, rel) for rel in listing if rel.endswith("/trainer_state.json")
              and (step := step_in_name(rel.split("/")[-2])) is not None]
    return max(states)[1] if states else None


def hf_best(text: str, source: str) -> FrameworkBest | None:
    """``best_model_checkpoint`` and ``best_metric`` of a ``trainer_state.json`` (None when unset)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    best = data.get("best_model_checkpoint") if isinstance(data, dict) else None
    if not isinstance(best, str) or not best.strip("/"):
        return None
    metric = data.get("best_metric")
    return FrameworkBest(best.rstrip("/").rsplit("/", 1)[-1],
                         float(metric) if isinstance(metric, (int, float)) else None, source)


_NANOCHAT_META = re.compile(r"(?:^|/)meta_(\d+)\.json$")


def nanochat_metas(listing: Mapping[str, Any]) -> list[str]:
    """nanochat's ``meta_NNNNNN.json`` files that sit beside a ``model_NNNNNN.pt`` of the same step."""
    out = []
    for rel in listing:
        m = _NANOCHAT_META.search(rel)
        if m and f"{rel[: m.start() + (1 if rel[m.start()] == '/' else 0)]}model_{m.group(1)}.pt" in listing:
            out.append(rel)
    return sorted(out)


def nanochat_best(metas: Mapping[str, str]) -> FrameworkBest | None:
    """The step whose ``meta_NNNNNN.json`` has the lowest ``val_bpb`` (what nanochat logs each save)."""
    best: tuple[float, int, str] | None = None
    for rel, text in metas.items():
        try:
            data = json.loads(text)
        except ValueError:
            continue
        bpb, step = (data.get("val_bpb"), data.get("step")) if isinstance(data, dict) else (None, None)
        if isinstance(bpb, (int, float)) and isinstance(step, int) and math.isfinite(bpb):
            if best is None or (bpb, -step) < (best[0], -best[1]):
                best = (float(bpb), step, rel)
    return None if best is None else FrameworkBest(None, best[0], best[2], step=best[1], what="lowest val_bpb")


def choose_checkpoint(listing: Mapping[str, Any], rows: Iterable[Mapping[str, Any] | MetricsRow], *,
                      now: float | None = None, min_age_s: float = 0.0,
                      framework: FrameworkBest | None = None) -> CheckpointChoice | None:
    """What fetch-best brings back for own code, or None when there is nothing. ``now``/``min_age_s``:
    per-step checkpoints written less than ``min_age_s`` ago are left out (one may still be written);
    the overwritten file is taken as it is (the job replaces it in one write, as nanoGPT's torch.save).
    ``framework``: the framework's own choice, taken when it is one of the checkpoints."""
    stepped, single = group_checkpoints(listing)
    if now is not None and min_age_s > 0:
        stepped = [c for c in stepped if now - c.mtime >= min_age_s]
    if stepped:
        scored = score(stepped, list(rows))
        named = next((c for c in scored if framework is not None and (
            c.name == framework.name if framework.name is not None else c.step == framework.step)), None)
        if named is not None and framework is not None:
            metric = f" {framework.metric:.4f}" if framework.metric is not None else ""
            return CheckpointChoice(named, f"the framework's own record: {framework.what}{metric} in "
                                    f"{framework.source}", tuple(scored))
        with_val = [c for c in scored if c.val_loss is not None]
        if with_val:
            best = min(with_val, key=lambda c: (c.val_loss, -(c.step or 0)))
            when = (f"logged at its step {best.step}" if best.val_step == best.step else
                    f"logged at step {best.val_step}, the nearest before step {best.step}")
            reason = f"lowest {best.val_metric} {best.val_loss:.4f} ({when})"
        else:
            best = scored[-1]
            reason = f"no validation logged before any checkpoint: the newest (step {best.step})"
        return CheckpointChoice(best, reason, tuple(scored))
    if single is not None:
        what = "the single checkpoint file" if len(single.files) == 1 else "the checkpoint folder"
        return CheckpointChoice(single, f"{what}, as the job last wrote it", (single,))
    return None


# --------------------------------------------------------------------------------------------------
# The bundled trainer's checkpoints: checkpoints/step_N/ with a meta.json listing every file's sha256


@dataclass(frozen=True)
class CheckpointInfo:
    name: str  # step_000500
    path: str  # on the host
    step: int
    val_loss: float | None
    train_loss: float | None
    kind: str | None
    files: dict[str, str]  # name -> sha256
    meta: dict[str, Any]


BEST_DIR = "best"  # the trainer's weights-only best (trainer/loop/checkpoint.py): fetch-best's, never resumed from


def list_checkpoints(host: Host, workdir: str, *, with_best: bool = False) -> list[CheckpointInfo]:
    """Every complete checkpoint (temp folders of an unfinished write are ignored), by step; the
    weights-only ``best`` folder only ``with_best`` (it is no resume point: mirror and resume skip it)."""
    root = f"{workdir}/checkpoints"
    files = host.list_files(root)
    out = []
    for rel in sorted(files):
        if not rel.endswith("/meta.json"):
            continue
        folder = rel.rsplit("/", 1)[0]
        if folder.startswith(".") or "/" in folder or untrusted.name_problem(folder) \
                or (folder == BEST_DIR and not with_best):
            continue
        # The pod's meta.json is read bounded, and counts only when it describes a complete checkpoint:
        # a file list of safe names with their sha256, the weights among them (gpucli/run/host/untrusted.py).
        try:
            meta = untrusted.read_json(host, f"{root}/{rel}", f"{folder}/meta.json", size=files[rel].size)
        except TransferError:
            continue
        hashes = untrusted.checkpoint_manifest(meta)
        if hashes is None:
            continue
        step = untrusted.whole_number(meta.get("step"))
        if step is None:
            continue
        out.append(CheckpointInfo(
            name=folder, path=f"{root}/{folder}", step=step, val_loss=untrusted.finite_number(meta.get("val_loss")),
            train_loss=untrusted.finite_number(meta.get("train_loss")),
            kind=meta.get("kind") if isinstance(meta.get("kind"), str) else None, files=hashes, meta=meta))
    return sorted(out, key=lambda c: c.step)


def best_checkpoint(checkpoints: list[CheckpointInfo]) -> CheckpointInfo:
    """Lowest validation loss; with no validation yet, the newest (said so by its val_loss None)."""
    if not checkpoints:
        raise NotFoundError("the run has no checkpoint yet", hint="wait for the first checkpoint_interval")
    # A sharded checkpoint of a run over several nodes has weights to bring home only when consolidated.
    checkpoints = [c for c in checkpoints if c.meta.get("consolidated", True)] or checkpoints
    with_val = [c for c in checkpoints if isinstance(c.val_loss, (int, float))]
    if with_val:
        return min(with_val, key=lambda c: (c.val_loss, -c.step))
    return checkpoints[-1]


def sha256_of(path: Path) -> str:
    return sha256_file(path)


def verify(folder: Path) -> bool:
    """Whether the folder is a complete checkpoint on this machine: its meta.json lists the required
    files (an empty or partial list is not a checkpoint) and every file it lists is there, a regular
    file, with its sha256."""
    try:
        with open(folder / "meta.json", "rb") as fh:
            files = untrusted.checkpoint_manifest(untrusted.parse_json(fh.read(untrusted.MAX_JSON_BYTES + 1),
                                                                       "meta.json"))
    except (OSError, GpucliError):
        return False
    if files is None:
        return False
    try:
        return all(untrusted.local_path(folder, name).is_file() and sha256_of(folder / name) == want
                   for name, want in files.items())
    except GpucliError:
        return False


def same_files(folder: Path, ck: CheckpointInfo) -> bool:
    """Whether the checkpoint on this machine in ``folder`` lists the files (and hashes) ``ck`` does."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return untrusted.checkpoint_manifest(meta) == ck.files


def step_folders(root: Path) -> list[Path]:
    """The ``step_N`` folders under ``root`` on this machine, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_")), key=lambda p: p.name)


def newest_verified(root: Path) -> Path | None:
    """The newest ``step_N`` folder under ``root`` whose files verify."""
    return next((f for f in reversed(step_folders(root)) if verify(f)), None)


def checkpoint_step(folder: Path) -> int | None:
    """The step a checkpoint on this machine was written at (its meta.json), None when unreadable."""
    try:
        return int(json.loads((folder / "meta.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
