"""Bringing a run's checkpoints home: ``fetch-best`` (the best one) and the mirror (the newest, kept on
this machine for a resume on a new pod), for both kinds of job. Which checkpoint is which is
:mod:`gpucli.run.files.checkpoints`; which of these routines a run uses is its job's (:mod:`gpucli.run.starting.jobs`).

A spot pod can be taken away with the work on it. gpucli keeps the newest good checkpoint (and the
metrics so far) on the user's machine under ``GPUCLI_HOME/mirror/<run>/`` — ``gpucli mirror`` once,
``gpucli watch`` (and ``launch --mirror-checkpoints`` / ``--recover``) as they appear — and
``gpucli resume`` rents a new pod of the same profile, uploads that checkpoint and the metrics,
and starts the trainer with ``--resume auto``: same run, same step, same data order (the checkpoint
holds the data loader's position and the RNG state).

Every file is verified against a sha256 (the one in the trainer's meta.json, or one computed on the
host for the user's own code) and written to a temporary folder that is renamed into place only when
complete; a cut download leaves the previous copy intact.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, NotFoundError, TransferError
from gpucli.run.files.checkpoints import (
    CheckpointInfo,
    best_checkpoint,
    choose_checkpoint,
    group_checkpoints,
    hf_best,
    list_checkpoints,
    model_files,
    nanochat_best,
    nanochat_metas,
    newest_trainer_state,
    newest_verified,
    same_files,
    sha256_of,
    step_folders,
)
from gpucli.run.host import untrusted
from gpucli.run.watch.monitor import read_metrics, trainer_alive
from gpucli.runs.records import RunRecord
from gpucli.settings import home
from gpucli.ssh import TransferProgress, tune_heap_for_downloads

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

EventFn = Callable[[str], None]
LIVE_MIN_AGE_S = 10.0  # on a live run of own code, a per-step checkpoint this fresh may still be being written
EXTRA_FILES = ("tokenizer.json", "data_meta.json")  # next to the trainer's weights when it wrote them
_FETCH_TRIES = 8  # a fast run on a slow link can improve its best several times in one download


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class FetchResult:
    checkpoint: CheckpointInfo
    dest: Path
    files: tuple[str, ...]
    bytes: int


@dataclass(frozen=True)
class MirrorResult:
    checkpoint: str | None  # the folder mirrored this time, or None when nothing new
    step: int | None
    metrics_rows: int


# --------------------------------------------------------------------------------------------------
# Folders on this machine


def mirror_root(run: str) -> Path:
    return home() / "mirror" / run


def own_mirror(run: str) -> Path | None:
    """The mirrored --checkpoints folder of an own-code run, when anything is in it."""
    folder = mirror_root(run) / "own-checkpoints"
    return folder if folder.is_dir() and any(folder.iterdir()) else None


def newest_good(run: str) -> Path | None:
    """The newest mirrored checkpoint of the bundled trainer whose files verify."""
    return newest_verified(mirror_root(run) / "checkpoints")


def partial_dir(target: Path) -> Path:
    """Where a checkpoint is assembled before it is renamed to ``target`` (a cut download's finished
    files stay there: the next attempt skips what already matches)."""
    return target.with_name(f".tmp_{target.name}")


def swap_into_place(tmp: Path, target: Path) -> None:
    """Put the complete folder ``tmp`` at ``target``; an older copy is moved aside first and removed only
    after, so a crash in between leaves a complete folder under one of the two names."""
    if target.exists():
        old = target.with_name(f".old_{target.name}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(target)


# --------------------------------------------------------------------------------------------------
# The bundled trainer: checkpoints/step_N/ with the hashes in meta.json


def download_checkpoint(host: Host, ck: CheckpointInfo, target: Path, *, with_optimizer: bool = True,
                        more: dict[str, bytes] | None = None, progress: Any = None) -> tuple[tuple[str, ...], int]:
    """The one downloader of the trainer's checkpoints (``fetch-best`` and the mirror): every file
    meta.json lists (without the optimizer state unless ``with_optimizer``), verified against its
    sha256, plus the tokenizer and data meta when present and ``more`` (name -> bytes) from this side;
    meta.json last. All of it lands in :func:`partial_dir` and is renamed into place only when complete,
    so ``target`` is always a whole checkpoint (an older one it replaces stays until then). Returns the
    file names and the bytes downloaded."""
    tmp = partial_dir(target)
    present = host.list_files(ck.path)
    names = [n for n in ck.files if with_optimizer or not n.startswith("optim_")]
    names += [n for n in EXTRA_FILES if n in present and n not in names]
    # Only regular files the listing shows (never a FIFO, device or link the pod put in their place),
    # each landing inside the partial folder; the meta.json read last is the one listed, bounded.
    missing = [n for n in [*names, "meta.json"] if n not in present]
    if missing:
        raise TransferError(f"{ck.name}: {untrusted.shown(missing[0])} is not a regular file on the pod")
    # an earlier copy at ``target`` (a second fetch-best, mirror or serve) is replaced only once the new
    # one is complete and verified (swap_into_place); a partial folder of a cut download is continued
    untrusted.local_path(target.parent, target.name, folder=True)
    untrusted.local_path(target.parent, tmp.name, folder=True)
    for n in [*names, *(more or {}), "meta.json"]:
        untrusted.local_path(tmp, n)
    tmp.mkdir(parents=True, exist_ok=True)
    # All together: over a long link the files (weights, optimizer shards) come on parallel channels.
    # The bar's size is known from the listing before the first byte.
    total_bytes = sum(present[n].size for n in names if n in present)

    def bar(p: Any) -> None:
        progress(TransferProgress(p.bytes_done, max(total_bytes, p.bytes_total), p.files_done, len(names), p.path))

    if progress is not None:
        bar(SimpleNamespace(bytes_done=0, bytes_total=0, files_done=0, path=""))
    got = host.download_files([(posixpath.join(ck.path, n), tmp / n, ck.files.get(n)) for n in names],
                              progress=bar if progress is not None else None)
    total = sum(s.bytes_total for s in got)
    for name, data in (more or {}).items():
        (tmp / name).write_bytes(data)
    meta, _ = host.read_from(posixpath.join(ck.path, "meta.json"), 0, untrusted.MAX_JSON_BYTES + 1)
    if untrusted.checkpoint_manifest(untrusted.parse_json(meta, f"{ck.name}/meta.json")) != ck.files:
        raise TransferError(f"{ck.name}/meta.json changed during the download")
    (tmp / "meta.json").write_bytes(meta)
    swap_into_place(tmp, target)
    return tuple(names + ["meta.json"]), total + len(meta)


def fetch_best_trainer(host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False,
                       progress: Any = None, on_event: EventFn = _quiet) -> FetchResult:
    """Download the best checkpoint's weights and meta (and tokenizer, run config), each verified
    against the sha256 in meta.json (see :func:`download_checkpoint`).

    On a live run the trainer keeps only the newest checkpoints and the best: a better one can
    appear, and the one being fetched be deleted, mid-download. Then the choice is made again from a
    fresh listing (a few times at most)."""
    tune_heap_for_downloads()  # ~15 % faster per GiB; a process-wide choice, made by the downloading command

    def choose() -> CheckpointInfo:
        best = best_checkpoint(list_checkpoints(host, record.workdir, with_best=True))
        val = f"{best.val_loss:.4f}" if best.val_loss is not None else "none logged"
        on_event(f"best checkpoint: {best.name} (val loss {val})")
        return best

    def fetch(best: CheckpointInfo, target: Path) -> FetchResult:
        try:
            run_yaml = host.read_file(f"{record.workdir}/run.yaml")
        except TransferError:
            run_yaml = None
        files, size = download_checkpoint(host, best, target, with_optimizer=with_optimizer,
                                          more={"run.yaml": run_yaml} if run_yaml else None, progress=progress)
        return FetchResult(best, target, files, size)

    return _choosing_again(host, record, choose, lambda ck: dest / f"{record.name}-{ck.name}", fetch,
                           "a better one came", on_event, with_best=True)


def _choosing_again(host: Host, record: RunRecord, choose: Callable[[], CheckpointInfo],
                    target_of: Callable[[CheckpointInfo], Path], fetch: Callable[[CheckpointInfo, Path], Any],
                    why: str, on_event: EventFn, *, with_best: bool) -> Any:
    """``fetch(choose())``, choosing again from a fresh listing when the trainer deleted the chosen
    checkpoint mid-download (it keeps only the newest few and the best; a new step is a new folder, and
    ``best`` is replaced in place). A checkpoint still listed after a failure is a real failure, raised."""
    for tries in range(1, _FETCH_TRIES + 1):
        ck = choose()
        target = target_of(ck)
        try:
            return fetch(ck, target)
        except TransferError:
            gone = not any((c.name, c.step) == (ck.name, ck.step)
                           for c in list_checkpoints(host, record.workdir, with_best=with_best))
            if gone:  # nothing of it can ever complete
                shutil.rmtree(partial_dir(target), ignore_errors=True)
            if tries >= _FETCH_TRIES or not gone:
                raise
            on_event(f"{ck.name} was deleted by the trainer while downloading ({why}); choosing again")
    raise AssertionError("unreachable")


def mirror_metrics(host: Host, record: RunRecord) -> int:
    """Bring the run's metrics.jsonl home (the mirror's first part, for both kinds); its row count."""
    tune_heap_for_downloads()  # ~15 % faster per GiB; a process-wide choice, made by the downloading command
    root = mirror_root(record.name)
    root.mkdir(parents=True, exist_ok=True)
    try:
        host.download(f"{record.workdir}/metrics.jsonl", root / "metrics.jsonl")
    except TransferError:
        pass  # no metrics yet
    if not (root / "metrics.jsonl").exists():
        return 0
    return sum(1 for line in (root / "metrics.jsonl").read_bytes().splitlines() if line.strip())


def mirror_trainer(host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
                   on_event: EventFn = _quiet) -> MirrorResult:
    """Bring the newest checkpoint (if not mirrored yet) and the metrics home."""
    rows = mirror_metrics(host, record)
    ck_root = mirror_root(record.name) / "checkpoints"
    ck_root.mkdir(parents=True, exist_ok=True)
    cks = list_checkpoints(host, record.workdir)
    if not cks:
        return MirrorResult(None, None, rows)
    if (ck_root / cks[-1].name).exists() and same_files(ck_root / cks[-1].name, cks[-1]):
        return MirrorResult(None, cks[-1].step, rows)

    def newest_now() -> CheckpointInfo:
        listed = list_checkpoints(host, record.workdir)
        if not listed:
            raise TransferError("the run's checkpoints were all deleted while mirroring")
        return listed[-1]

    def fetch(ck: CheckpointInfo, target: Path) -> CheckpointInfo:
        download_checkpoint(host, ck, target, progress=progress)
        return ck

    listed = [cks[-1]]  # the first choice is the listing's; a second one comes from a fresh listing
    newest = _choosing_again(host, record, lambda: listed.pop() if listed else newest_now(), lambda ck: ck_root / ck.name,
                             fetch, "a newer one came", on_event, with_best=False)
    on_event(f"mirrored {newest.name} (step {newest.step}) to {ck_root / newest.name}")
    for old in step_folders(ck_root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return MirrorResult(newest.name, newest.step, rows)


# --------------------------------------------------------------------------------------------------
# The user's own code: whatever it wrote under --checkpoints, hashed on the host


def remote_sha256(host: Host, root: str, files: Iterable[str]) -> dict[str, str]:
    """sha256 of each file (relative to ``root``), computed on the host (``sha256sum``, one command for
    the lot): a file cut mid-way resumes from its ``.partial`` and a changed one fails loudly instead
    of landing corrupted."""
    files = list(files)
    out: dict[str, str] = {}
    for i in range(0, len(files), 200):  # keeps one command line well under ARG_MAX
        chunk = files[i:i + 200]
        res = host.run(f"cd {shlex.quote(root)} && sha256sum -- " + " ".join(shlex.quote(f) for f in chunk),
                       timeout_s=1800)
        for line in res.stdout.splitlines():
            digest, _, name = line.partition("  ")
            if len(digest) == 64 and name:
                out[name.removeprefix("./")] = digest
    missing = [f for f in files if f not in out]
    if missing:
        raise TransferError(f"could not hash {missing[0]} on the host")
    return out


def download_files(host: Host, root: str, hashes: Mapping[str, str], target: Path, *, progress: Any = None,
                   keep: Path | None = None) -> int:
    """Download ``hashes``' files from ``root`` into ``target`` through its partial folder, renamed into
    place when all are verified. Files already in ``keep`` with the same hash are copied, not fetched."""
    tmp = partial_dir(target)
    # an earlier copy at ``target`` (a second fetch-best, mirror or serve) is replaced only once the new
    # one is complete and verified (swap_into_place); a partial folder of a cut download is continued
    untrusted.local_path(target.parent, target.name, folder=True)
    untrusted.local_path(target.parent, tmp.name, folder=True)
    for rel in hashes:  # every name the pod listed lands inside the folder, before any byte is written
        untrusted.local_path(tmp, rel)
    tmp.mkdir(parents=True, exist_ok=True)
    total = 0
    for rel, digest in hashes.items():
        dest = untrusted.local_path(tmp, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and sha256_of(dest) == digest:
            continue
        if keep is not None and untrusted.local_path(keep, rel).is_file() and sha256_of(keep / rel) == digest:
            shutil.copy2(keep / rel, dest)
            continue
        total += host.download(f"{root}/{rel}", dest, sha256=digest, progress=progress).bytes_total
    wanted = {untrusted.local_path(tmp, rel) for rel in hashes}
    for left in [p for p in tmp.rglob("*") if p.is_file() and p not in wanted]:
        left.unlink()  # a file the job deleted since an earlier, cut attempt (or its partial) is not kept
    swap_into_place(tmp, target)
    return total


def fetch_best_folder(host: Host, record: RunRecord, root: str, dest: Path, *, with_optimizer: bool = False,
                      progress: Any = None, on_event: EventFn = _quiet) -> FetchResult:
    """fetch-best for own code: :func:`gpucli.run.files.checkpoints.choose_checkpoint` picks from a listing of
    ``root`` (the --checkpoints folder on the host) and the run's metrics rows; the optimizer, scheduler
    and RNG state only ``with_optimizer`` (:func:`gpucli.run.files.checkpoints.model_files`)."""
    tune_heap_for_downloads()  # ~15 % faster per GiB; a process-wide choice, made by the downloading command
    listing = host.list_files(root) if host.exists(root) else {}
    rows = read_metrics(host, record.workdir)
    live = bool(trainer_alive(host, record))
    framework = None
    state = newest_trainer_state(listing)
    metas = nanochat_metas(listing)
    try:
        if state is not None:  # a Hugging Face Trainer's: its own record of the best checkpoint
            framework = hf_best(host.read_file(f"{root}/{state}").decode(errors="replace"), state)
        elif metas:  # nanochat's: the val_bpb saved with each checkpoint
            framework = nanochat_best({m: host.read_file(f"{root}/{m}").decode(errors="replace")
                                       for m in metas[-200:]})
    except (GpucliError, OSError):
        framework = None
    choice = choose_checkpoint(listing, rows, now=time.time(), min_age_s=LIVE_MIN_AGE_S if live else 0.0,
                               framework=framework)
    if choice is None:
        raise NotFoundError(f"no checkpoint in {root} yet",
                            hint="the job writes them under --checkpoints (GPUCLI_CHECKPOINTS)")
    ck = choice.checkpoint
    on_event(f"best checkpoint: {ck.name} ({choice.reason})")
    files = ck.files if with_optimizer else model_files(ck.files)
    if len(files) < len(ck.files):
        on_event(f"left out {len(ck.files) - len(files)} optimizer/scheduler/RNG file(s): --with-optimizer brings them")
    hashes = remote_sha256(host, root, files)
    step = ck.step
    if step is None:  # the overwritten file: the last step logged before it was written
        steps = [r.step for r in rows if r.step is not None and (r.time or 0) <= ck.mtime + 1]
        step = max(steps, default=-1)
    target = untrusted.local_path(dest, f"{record.name}-{ck.name}", folder=True)
    size = download_files(host, root, hashes, target, progress=progress)
    info = CheckpointInfo(name=ck.name, path=root, step=step, val_loss=ck.val_loss, train_loss=None, kind="own",
                          files=dict(hashes), meta={"reason": choice.reason})
    return FetchResult(info, target, tuple(hashes), size)


def mirror_folder(host: Host, record: RunRecord, root: str, *, progress: Any = None,
                  on_event: EventFn = _quiet) -> MirrorResult:
    """The metrics and the whole --checkpoints folder ``root`` into ``own-checkpoints`` of the run's
    mirror (files unchanged since the last mirror are copied locally, not downloaded again). The
    result names what was mirrored and its newest step, or None when nothing changed."""
    rows = mirror_metrics(host, record)
    for tries in range(1, _FETCH_TRIES + 1):
        listed: set[str] = set()
        try:
            return _mirror_folder_once(host, record, root, rows, listed, progress, on_event)
        except TransferError:
            # the job rotated a file away between the listing and its copy: a fresh listing, again
            gone = host.exists(root) and bool(listed - set(host.list_files(root)))
            if tries >= _FETCH_TRIES or not gone:
                raise
            on_event("a checkpoint file was deleted by the job while mirroring; listing again")
    raise AssertionError("unreachable")


def _mirror_folder_once(host: Host, record: RunRecord, root: str, rows: int, listed: set[str], progress: Any,
                        on_event: EventFn) -> MirrorResult:
    mirror_dir = mirror_root(record.name) / "own-checkpoints"
    if not host.exists(root):
        return MirrorResult(None, None, rows)
    listing = host.list_files(root)
    now = time.time()
    live = bool(trainer_alive(host, record))
    files = [rel for rel, f in sorted(listing.items())
             if not rel.rsplit("/", 1)[-1].startswith(".") and not (live and now - f.mtime < LIVE_MIN_AGE_S)]
    if not files:
        return MirrorResult(None, None, rows)
    stamp = {rel: (listing[rel].size, int(listing[rel].mtime)) for rel in files}
    listed.update(files)
    untrusted.check_names(files)  # before any local path is made of them
    if mirror_dir.is_dir() and all((mirror_dir / rel).is_file() and (mirror_dir / rel).stat().st_size == s
                                   and int((mirror_dir / rel).stat().st_mtime) == m for rel, (s, m) in stamp.items()):
        return MirrorResult(None, None, rows)
    hashes = remote_sha256(host, root, files)
    download_files(host, root, hashes, mirror_dir, progress=progress, keep=mirror_dir if mirror_dir.is_dir() else None)
    for rel, (_s, m) in stamp.items():
        os.utime(mirror_dir / rel, (m, m))
    stepped, _single = group_checkpoints(listing)
    newest = stepped[-1].step if stepped else None
    on_event(f"mirrored {len(files)} checkpoint file(s) of {record.name} to {mirror_dir}")
    return MirrorResult(mirror_dir.name, newest, rows)
