"""fetch-best and the checkpoint mirror for a run of the user's own code.

The job writes whatever it writes under ``--checkpoints``; :func:`gpucli.run.owncheckpoints.choose_checkpoint`
picks what to bring back from a listing of that folder and the run's metrics rows. Every file is hashed
on the host first (``sha256sum``, one command for the lot) and downloaded against that hash: a file cut
mid-way resumes from its ``.partial`` and a changed one fails loudly instead of landing corrupted.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import NotFoundError, TransferError
from gpucli.run.monitor import CheckpointInfo, FetchResult, partial_dir, read_all_rows, trainer_alive
from gpucli.run.owncheckpoints import choose_checkpoint
from gpucli.run.records import RunRecord

if TYPE_CHECKING:
    from gpucli.run.targets import Host

LIVE_MIN_AGE_S = 10.0  # on a live run, a per-step checkpoint this fresh may still be being written


def own_checkpoints_dir(record: RunRecord) -> str | None:
    """The run's --checkpoints folder on the host, or None for a run of the bundled trainer."""
    own = (record.launch or {}).get("own")
    if not own:
        return None
    ck = str(own.get("checkpoints") or "checkpoints").strip().rstrip("/") or "checkpoints"
    return posixpath.normpath(f"{record.workdir}/code/{ck}")


def remote_sha256(host: Host, root: str, files: Iterable[str]) -> dict[str, str]:
    """sha256 of each file (relative to ``root``), computed on the host."""
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
    from gpucli.run.mirror import sha256_of
    from gpucli.run.monitor import swap_into_place
    from gpucli.run.untrusted import local_path

    tmp = partial_dir(target)
    local_path(target.parent, target.name)
    local_path(target.parent, tmp.name)
    for rel in hashes:  # every name the pod listed lands inside the folder, before any byte is written
        local_path(tmp, rel)
    tmp.mkdir(parents=True, exist_ok=True)
    total = 0
    for rel, digest in hashes.items():
        dest = local_path(tmp, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and sha256_of(dest) == digest:
            continue
        if keep is not None and local_path(keep, rel).is_file() and sha256_of(keep / rel) == digest:
            shutil.copy2(keep / rel, dest)
            continue
        total += host.download(f"{root}/{rel}", dest, sha256=digest, progress=progress).bytes_total
    swap_into_place(tmp, target)
    return total


def fetch_best_own(host: Host, record: RunRecord, dest: Path, *, progress: Any = None,
                   on_event: Callable[[str], None] = lambda m: None) -> FetchResult:
    root = own_checkpoints_dir(record)
    assert root is not None
    listing = host.list_files(root) if host.exists(root) else {}
    rows = read_all_rows(host, record.workdir)
    live = bool(trainer_alive(host, record))
    choice = choose_checkpoint(listing, rows, now=time.time(), min_age_s=LIVE_MIN_AGE_S if live else 0.0)
    if choice is None:
        raise NotFoundError(f"no checkpoint in {root} yet",
                            hint="the job writes them under --checkpoints (GPUCLI_CHECKPOINTS)")
    ck = choice.checkpoint
    on_event(f"best checkpoint: {ck.name} ({choice.reason})")
    hashes = remote_sha256(host, root, ck.files)
    step = ck.step
    if step is None:  # the overwritten file: the last step logged before it was written
        steps = [r["step"] for r in rows if isinstance(r.get("step"), int) and r.get("time", 0) <= ck.mtime + 1]
        step = max(steps, default=-1)
    from gpucli.run.untrusted import local_path

    target = local_path(dest, f"{record.name}-{ck.name}")
    size = download_files(host, root, hashes, target, progress=progress)
    info = CheckpointInfo(name=ck.name, path=root, step=step, val_loss=ck.val_loss, train_loss=None, kind="own",
                          files=dict(hashes), meta={"reason": choice.reason})
    return FetchResult(info, target, tuple(hashes), size)


def mirror_own(host: Host, record: RunRecord, mirror_dir: Path, *, progress: Any = None,
               on_event: Callable[[str], None] = lambda m: None) -> tuple[str | None, int | None]:
    """Bring the whole --checkpoints folder home into ``mirror_dir`` (files unchanged since the last
    mirror are copied locally, not downloaded again). Returns (what was mirrored, its newest step), or
    (None, None) when nothing changed."""
    root = own_checkpoints_dir(record)
    assert root is not None
    if not host.exists(root):
        return None, None
    listing = host.list_files(root)
    now = time.time()
    live = bool(trainer_alive(host, record))
    files = [rel for rel, f in sorted(listing.items())
             if not rel.rsplit("/", 1)[-1].startswith(".") and not (live and now - f.mtime < LIVE_MIN_AGE_S)]
    if not files:
        return None, None
    stamp = {rel: (listing[rel].size, int(listing[rel].mtime)) for rel in files}
    from gpucli.run.untrusted import check_names

    check_names(files)  # before any local path is made of them
    if mirror_dir.is_dir() and all((mirror_dir / rel).is_file() and (mirror_dir / rel).stat().st_size == s
                                   and int((mirror_dir / rel).stat().st_mtime) == m for rel, (s, m) in stamp.items()):
        return None, None
    hashes = remote_sha256(host, root, files)
    download_files(host, root, hashes, mirror_dir, progress=progress, keep=mirror_dir if mirror_dir.is_dir() else None)
    for rel, (_s, m) in stamp.items():
        os.utime(mirror_dir / rel, (m, m))
    from gpucli.run.owncheckpoints import group_checkpoints

    stepped, _single = group_checkpoints(listing)
    newest = stepped[-1].step if stepped else None
    on_event(f"mirrored {len(files)} checkpoint file(s) of {record.name} to {mirror_dir}")
    return mirror_dir.name, newest
