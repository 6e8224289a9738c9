"""Reading a run from its host: metrics rows, live status, checkpoints, the best one, stopping it.

Everything here works through the host interface shared by ``LocalHost`` and ``Remote``; the
trainer's files are the contract (metrics.jsonl rows, status.json, checkpoints/*/meta.json), read
without torch.
"""

from __future__ import annotations

import datetime as dt
import json
import posixpath
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from gpucli.errors import NotFoundError, TransferError
from gpucli.run.records import RunRecord, parse_iso

if TYPE_CHECKING:
    from gpucli.run.targets import Host


def parse_rows(data: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """Complete JSON lines of ``data`` and the incomplete tail to keep for next time."""
    *lines, tail = data.split(b"\n")
    rows = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn write is skipped, never fatal
        if isinstance(row, dict):
            rows.append(row)
    return rows, tail


def read_all_rows(host: Host, workdir: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    offset, tail = 0, b""
    while True:
        data, offset2 = host.read_from(f"{workdir}/metrics.jsonl", offset)
        if not data:
            break
        got, tail = parse_rows(tail + data)
        rows.extend(got)
        offset = offset2
    return rows


@dataclass(frozen=True)
class RunStatus:
    state: str  # running | finished | failed | stopped | starting | unknown
    step: int | None = None
    max_steps: int | None = None
    loss: float | None = None
    val_loss: float | None = None
    best_val_loss: float | None = None
    tok_per_s: float | None = None
    mfu: float | None = None
    elapsed_s: float | None = None
    cost_usd: float | None = None  # metered on the pod (elapsed x price), else from our clock
    usd_per_hour: float | None = None
    projected_cost_usd: float | None = None
    eta_s: float | None = None
    finished_reason: str | None = None
    process_alive: bool | None = None
    last_event: str | None = None
    log_tail: tuple[str, ...] = field(default_factory=tuple)


def summarize(record: RunRecord, rows: Iterable[dict[str, Any]], *, alive: bool | None,
              now: dt.datetime | None = None, log_tail: tuple[str, ...] = ()) -> RunStatus:
    train = [r for r in rows if r.get("kind") == "train"]
    vals = [r for r in rows if r.get("kind") == "val"]
    events = [r for r in rows if r.get("kind") == "event"]
    finished = next((e for e in reversed(events) if e.get("event") == "finished"), None)
    last = train[-1] if train else None
    step = last.get("step") if last else None
    max_steps = record.limits.max_steps
    price = record.price_per_hour_usd
    now = now or dt.datetime.now(dt.timezone.utc)
    started = parse_iso(record.started_at)
    wall_s = (now - started).total_seconds() if started else None
    elapsed = last.get("elapsed_s") if last else None
    if elapsed is None:
        elapsed = wall_s
    cost = last.get("cost_usd") if last and last.get("cost_usd") is not None else (
        None if price is None or wall_s is None else wall_s / 3600 * price)
    eta = None
    if step and max_steps and elapsed and step < max_steps and not finished:
        eta = (max_steps - step) * (elapsed / step)
    projected = None
    if price is not None and elapsed is not None:
        projected = (elapsed + (eta or 0)) / 3600 * price
        if eta is None and not finished and record.active and max_steps is None:
            # a job with no known step count (the user's own code) runs until it ends or a cap stops it
            caps = [c for c in (record.limits.budget_usd,
                                record.limits.max_hours * price if record.limits.max_hours else None) if c]
            projected = max(projected, min(caps)) if caps else None
    failed_reason = str(finished.get("reason") or "") if finished is not None else ""
    if finished is not None and failed_reason.startswith(("failed", "setup failed")):
        state = "failed"  # the user's own command (gpucli/pod/jobrun.py) exited non-zero
        if not log_tail and isinstance(finished.get("log_tail"), list):
            log_tail = tuple(str(x) for x in finished["log_tail"])
    elif finished is not None:
        state = "finished"
    elif record.status in ("stopped", "failed", "finished"):
        state = record.status
    elif alive is False:
        state = "failed" if not finished else "finished"
    elif alive:
        state = "running" if train else "starting"
    else:
        state = record.status
    # nanochat logs bits per byte, not a loss: shown in the loss's place where no row has a loss
    val_key = "val_loss" if any(isinstance(v.get("val_loss"), (int, float)) for v in vals) else "val_bpb"
    best = min((v[val_key] for v in vals if isinstance(v.get(val_key), (int, float))), default=None)
    if step is None and vals and isinstance(vals[-1].get("step"), int):
        step = vals[-1]["step"]
    return RunStatus(
        state=state, step=step, max_steps=max_steps, loss=last.get("loss") if last else None,
        val_loss=vals[-1].get(val_key) if vals else None, best_val_loss=best,
        tok_per_s=last.get("tok_per_s") if last else None, mfu=last.get("mfu") if last else None,
        elapsed_s=elapsed, cost_usd=cost, usd_per_hour=price, projected_cost_usd=projected, eta_s=eta,
        finished_reason=finished.get("reason") if finished else None, process_alive=alive,
        last_event=events[-1].get("event") if events else None, log_tail=log_tail)


def log_tail(host: Host, workdir: str, lines: int = 15) -> tuple[str, ...]:
    """The end of the trainer's console output (stdout and stderr: tracebacks land here; the
    trainer's own train.log holds its log lines only)."""
    try:
        data = host.read_file(f"{workdir}/console.log")
    except (TransferError, OSError):
        return ()
    return tuple(data.decode(errors="replace").splitlines()[-lines:])


def trainer_alive(host: Host, record: RunRecord) -> bool | None:
    """Whether the run's trainer is alive (None: it never started); a pid that another process has
    taken since is not alive."""
    from gpucli.run import procs

    return procs.alive(host, record, record.pid, record.pid_ident) if record.pid else None


def status_of(host: Host, record: RunRecord) -> RunStatus:
    rows = read_all_rows(host, record.workdir)
    alive = trainer_alive(host, record)
    tail = log_tail(host, record.workdir) if alive is False else ()
    return summarize(record, rows, alive=alive, log_tail=tail)


# --------------------------------------------------------------------------------------------------
# Checkpoints


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


def list_checkpoints(host: Host, workdir: str) -> list[CheckpointInfo]:
    """Every complete checkpoint (temp folders of an unfinished write are ignored), by step."""
    root = f"{workdir}/checkpoints"
    files = host.list_files(root)
    out = []
    for rel in sorted(files):
        if not rel.endswith("/meta.json"):
            continue
        folder = rel.rsplit("/", 1)[0]
        if folder.startswith(".") or "/" in folder:
            continue
        try:
            meta = json.loads(host.read_file(f"{root}/{rel}"))
        except (json.JSONDecodeError, TransferError):
            continue
        hashes = meta.get("files") or {"model.pt": meta.get("sha256")}
        out.append(CheckpointInfo(
            name=folder, path=f"{root}/{folder}", step=int(meta.get("step", -1)), val_loss=meta.get("val_loss"),
            train_loss=meta.get("train_loss"), kind=meta.get("kind"),
            files={k: v for k, v in hashes.items() if v}, meta=meta))
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


EXTRA_FILES = ("tokenizer.json", "data_meta.json")  # next to the weights when the trainer wrote them


def partial_dir(target: Path) -> Path:
    """Where a checkpoint is assembled before it is renamed to ``target`` (a cut download's finished
    files stay there: the next attempt skips what already matches)."""
    return target.with_name(f".tmp_{target.name}")


def download_checkpoint(host: Host, ck: CheckpointInfo, target: Path, *, with_optimizer: bool = True,
                        more: dict[str, bytes] | None = None, progress: Any = None) -> tuple[tuple[str, ...], int]:
    """The one checkpoint downloader (``fetch-best`` and the mirror): every file meta.json lists
    (without the optimizer state unless ``with_optimizer``), verified against its sha256, plus the
    tokenizer and data meta when present and ``more`` (name -> bytes) from this side; meta.json last.
    All of it lands in :func:`partial_dir` and is renamed into place only when complete, so ``target``
    is always a whole checkpoint (an older one it replaces stays until then). Returns the file names
    and the bytes downloaded."""
    tmp = partial_dir(target)
    tmp.mkdir(parents=True, exist_ok=True)
    present = host.list_files(ck.path)
    names = [n for n in ck.files if with_optimizer or not n.startswith("optim_")]
    names += [n for n in EXTRA_FILES if n in present and n not in names]
    # All together: over a long link the files (weights, optimizer shards) come on parallel channels.
    # The bar's size is known from the listing before the first byte.
    total_bytes = sum(present[n].size for n in names if n in present)

    def bar(p: Any) -> None:
        from gpucli.ssh import TransferProgress

        progress(TransferProgress(p.bytes_done, max(total_bytes, p.bytes_total), p.files_done, len(names), p.path))

    if progress is not None:
        bar(SimpleNamespace(bytes_done=0, bytes_total=0, files_done=0, path=""))
    got = host.download_files([(posixpath.join(ck.path, n), tmp / n, ck.files.get(n)) for n in names],
                              progress=bar if progress is not None else None)
    total = sum(s.bytes_total for s in got)
    for name, data in (more or {}).items():
        (tmp / name).write_bytes(data)
    meta = host.read_file(posixpath.join(ck.path, "meta.json"))
    (tmp / "meta.json").write_bytes(meta)
    swap_into_place(tmp, target)
    return tuple(names + ["meta.json"]), total + len(meta)


@dataclass(frozen=True)
class FetchResult:
    checkpoint: CheckpointInfo
    dest: Path
    files: tuple[str, ...]
    bytes: int


_FETCH_TRIES = 3


def fetch_best(host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False,
               progress: Any = None, on_event: Callable[[str], None] = lambda m: None) -> FetchResult:
    """Download the best checkpoint's weights and meta (and tokenizer, run config), each verified
    against the sha256 in meta.json (see :func:`download_checkpoint`).

    On a live run the trainer keeps only the newest checkpoints and the best: a better one can
    appear, and the one being fetched be deleted, mid-download. Then the choice is made again from a
    fresh listing (a few times at most)."""
    from gpucli.ssh import tune_heap_for_downloads

    tune_heap_for_downloads()  # ~15 % faster per GiB; a process-wide choice, made by the downloading command
    if (record.launch or {}).get("own"):  # the user's own code: its --checkpoints folder
        from gpucli.run.ownfetch import fetch_best_own

        return fetch_best_own(host, record, dest, progress=progress, on_event=on_event)
    tries = 0
    while True:
        best = best_checkpoint(list_checkpoints(host, record.workdir))
        val = f"{best.val_loss:.4f}" if best.val_loss is not None else "none logged"
        on_event(f"best checkpoint: {best.name} (val loss {val})")
        target = dest / f"{record.name}-{best.name}"
        try:
            run_yaml = host.read_file(f"{record.workdir}/run.yaml")
        except TransferError:
            run_yaml = None
        try:
            files, size = download_checkpoint(host, best, target, with_optimizer=with_optimizer,
                                              more={"run.yaml": run_yaml} if run_yaml else None, progress=progress)
            return FetchResult(best, target, files, size)
        except TransferError:
            tries += 1
            gone = not any(c.name == best.name for c in list_checkpoints(host, record.workdir))
            if gone:  # nothing of it can ever complete
                shutil.rmtree(partial_dir(target), ignore_errors=True)
            if tries >= _FETCH_TRIES or not gone:
                raise
            on_event(f"{best.name} was deleted by the trainer while downloading (a better one came); "
                     f"choosing again")


def _group_alive(host: Host, pid: int) -> bool:
    """Whether any process of the trainer's process group is left.

    The recorded pid is the detached shell that started the trainer; on SIGTERM that shell dies at
    once while python (or torchrun and its workers) keeps running to write the emergency checkpoint.
    Waiting for the pid alone would let ``down`` terminate the pod in the middle of that write.
    """
    res = host.run(f"kill -0 -- -{int(pid)} 2>/dev/null", timeout_s=15, check=False)
    return res.exit_code == 0


def stop_trainer(host: Host, record: RunRecord, *, timeout_s: float = 120.0,
                 on_event: Callable[[str], None] = lambda m: None) -> bool:
    """SIGTERM the trainer's process group (it writes its emergency checkpoint), wait for it to
    exit, then SIGKILL if it outlives ``timeout_s``. Returns whether it had been running."""
    from gpucli.run import procs

    if not record.pid or not trainer_alive(host, record):
        return False
    on_event(f"sending SIGTERM to the trainer (pid {record.pid}); it writes an emergency checkpoint")
    if procs.signal(host, record, record.pid, record.pid_ident, "TERM") != "sent":
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not trainer_alive(host, record) and (record.pid_ident is not None or not _group_alive(host, record.pid)):
            return True
        time.sleep(0.5)
    on_event(f"trainer still alive after {timeout_s:.0f} s; sending SIGKILL")
    procs.signal(host, record, record.pid, record.pid_ident, "KILL")
    return True


def swap_into_place(tmp: Path, target: Path) -> None:
    """Put the complete folder ``tmp`` at ``target``; an older copy is moved aside first and removed only
    after, so a crash in between leaves a complete folder under one of the two names."""
    if target.exists():
        old = target.with_name(f".old_{target.name}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(target)
