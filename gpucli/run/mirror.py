"""Checkpoint mirroring and spot recovery.

A spot pod can be taken away with the work on it. gpucli keeps the newest good checkpoint (and the
metrics so far) on the user's machine under ``GPUCLI_HOME/mirror/<run>/`` — ``gpucli mirror`` once,
``gpucli watch`` (and ``launch --mirror-checkpoints`` / ``--recover``) as they appear — and
``gpucli resume`` rents a new pod of the same profile, uploads that checkpoint and the metrics,
and starts the trainer with ``--resume auto``: same run, same step, same data order (the checkpoint
holds the data loader's position and the RNG state).

Every mirrored file is verified against the sha256 in the checkpoint's meta.json and written to a
temporary folder that is renamed into place only when complete; a cut download leaves the previous
mirror intact.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import TransferError
from gpucli.run.monitor import CheckpointInfo, download_checkpoint, list_checkpoints
from gpucli.run.records import RunRecord

if TYPE_CHECKING:
    from gpucli.run.targets import Host
from gpucli.settings import home


def mirror_root(run: str) -> Path:
    return home() / "mirror" / run


def sha256_of(path: Path) -> str:
    from gpucli.ssh import sha256_file

    return sha256_file(path)


_sha256 = sha256_of


def own_mirror(run: str) -> Path | None:
    """The mirrored --checkpoints folder of an own-code run, when anything is in it."""
    folder = mirror_root(run) / "own-checkpoints"
    return folder if folder.is_dir() and any(folder.iterdir()) else None


def verify(folder: Path) -> bool:
    """Whether the folder is a complete checkpoint: its meta.json lists the required files (an empty
    or partial list is not a checkpoint) and every file it lists is there, a regular file, with its sha256."""
    from gpucli.errors import GpucliError
    from gpucli.run import untrusted

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


@dataclass(frozen=True)
class MirrorResult:
    checkpoint: str | None  # the folder mirrored this time, or None when nothing new
    step: int | None
    metrics_rows: int


def mirror_once(host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
                on_event: Callable[[str], None] = lambda m: None) -> MirrorResult:
    """Bring the newest checkpoint (if not mirrored yet) and the metrics home."""
    from gpucli.ssh import tune_heap_for_downloads

    tune_heap_for_downloads()  # ~15 % faster per GiB; a process-wide choice, made by the downloading command
    root = mirror_root(record.name)
    ck_root = root / "checkpoints"
    ck_root.mkdir(parents=True, exist_ok=True)
    try:
        host.download(f"{record.workdir}/metrics.jsonl", root / "metrics.jsonl")
    except TransferError:
        pass  # no metrics yet
    rows = 0
    if (root / "metrics.jsonl").exists():
        rows = sum(1 for line in (root / "metrics.jsonl").read_bytes().splitlines() if line.strip())
    if (record.launch or {}).get("own"):  # the user's own code: its whole --checkpoints folder
        from gpucli.run.ownfetch import mirror_own

        name, step = mirror_own(host, record, root / "own-checkpoints", progress=progress, on_event=on_event)
        return MirrorResult(name, step, rows)
    cks = list_checkpoints(host, record.workdir)
    if not cks:
        return MirrorResult(None, None, rows)
    newest = cks[-1]
    target = ck_root / newest.name
    if target.exists() and _same(target, newest):
        return MirrorResult(None, newest.step, rows)
    download_checkpoint(host, newest, target, progress=progress)
    on_event(f"mirrored {newest.name} (step {newest.step}) to {target}")
    _prune(ck_root, keep)
    return MirrorResult(newest.name, newest.step, rows)


def _same(folder: Path, ck: CheckpointInfo) -> bool:
    from gpucli.run.untrusted import checkpoint_manifest

    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return checkpoint_manifest(meta) == ck.files


def _prune(ck_root: Path, keep: int) -> None:
    folders = sorted((p for p in ck_root.iterdir() if p.is_dir() and p.name.startswith("step_")),
                     key=lambda p: p.name)
    for old in folders[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def newest_good(run: str) -> Path | None:
    """The newest mirrored checkpoint whose files verify."""
    ck_root = mirror_root(run) / "checkpoints"
    if not ck_root.is_dir():
        return None
    for folder in sorted((p for p in ck_root.iterdir() if p.is_dir() and p.name.startswith("step_")),
                         key=lambda p: p.name, reverse=True):
        if verify(folder):
            return folder
    return None
