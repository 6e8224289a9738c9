"""The pod's checkpoint uploader: every checkpoint the run keeps, and its best, copied to the run's store
(:mod:`objstore`, loaded from next to this file) while it trains.

Started by the launch beside the watchdog, in its own session, with the run's 0600 env file (the
store's credentials are read there by boto3 / huggingface_hub; never on its command line):

    python3 storesync.py --run-dir DIR --run NAME --store URL --kind trainer|own --checkpoints DIR
                         [--keep-last N] [--poll-s S] [--min-age-s S]

Why a process of its own, in the trainer's Python: the watchdog (gpucli/pod) is standard library only
and must stay so (it ends the billing; nothing it imports may fail to install), while S3 and the Hub
want their own clients (boto3, huggingface_hub). A separate process, at a lower CPU priority, keeps the
upload's threads and hashing out of the training loop's way, and a failing store out of its failures.

What it does each poll (``--poll-s``):

- finds the whole checkpoints as fetch-best finds them: the bundled trainer's ``step_N/`` folders (they
  appear by an atomic rename, meta.json holds the files and their sha256) and ``best/``; your own
  code's per-step files and folders under ``--checkpoints``, whole once untouched for ``--min-age-s``;
- uploads each one not yet in the store, newest first, its ``manifest.json`` (step, loss, val loss,
  sha256 and bytes per file) after every other file: a checkpoint cut mid-upload has no manifest and
  is never taken for a whole one;
- keeps in the store what the pod keeps: the newest ``--keep-last`` and the best by val loss (each
  pruned checkpoint loses its manifest first);
- never writes to the pod's disk beyond its log and state (files are streamed from where they are)
  and never deletes a local file.

A store that fails is retried with backoff (5 s doubling to 5 min); one that refuses (credentials,
permissions, no such bucket) is said in one line of ``storesync.log``, again every 10 minutes, and the
training goes on with its checkpoints on the pod. When the watchdog asks (``storesync.flush``: the job is
over), everything left is uploaded at once, whatever its age, then ``storesync.json`` says ``flushed``
and the process exits; the watchdog runs the pod's end action only after that (or its deadline).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _load_objstore():  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("gpucli_objstore", Path(__file__).with_name("objstore.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault("gpucli_objstore", module)  # dataclasses resolve their module by name
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


objstore = _load_objstore()

FLUSH = "storesync.flush"
STATE = "storesync.json"
LOG = "storesync.log"
REFUSED_REPEAT_S = 600.0
# The checkpoint-naming rules of gpucli/run/checkpoints.py (fetch-best), for the user's own code; a test
# holds the two to the same answers.
_KEYWORD_STEP = re.compile(r"(?:global_step|step|iteration|iter|checkpoint|ckpt)[-_=]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![A-Za-z\d])(?<!rank)(?<!rank_)(?<!of)(?<!of_)(\d+)")
_SKIP = re.compile(r"(^\.|\.tmp$|\.partial$|\.lock$|\.incomplete$)")
_LOGS = re.compile(r"^events\.out\.tfevents\.|^hparams\.yaml$|^metrics\.csv$")


#: The credentials this process has from the run's env file: never written to its log or state, whatever
#: a service's error message quotes back.
SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN")


def redact(text: str) -> str:
    for var in SECRET_VARS:
        value = os.environ.get(var) or ""
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def log(run_dir: Path, message: str) -> None:
    message = redact(message)
    with open(run_dir / LOG, "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} storesync: {message}\n")


def write_state(run_dir: Path, **fields: object) -> None:
    tmp = run_dir / f".{STATE}.tmp"
    tmp.write_text(redact(json.dumps(dict(fields, time=time.time(), pid=os.getpid(), pgid=os.getpgrp()))))
    tmp.replace(run_dir / STATE)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


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
        out.append(Local(name=f"best_step_{step:06d}" if best else folder.name, kind="best" if best else "regular",
                         step=step, files={n: folder / n for n in [*names, "meta.json"]}, hashes=hashes,
                         loss=_num(meta.get("train_loss")), val_loss=_num(meta.get("val_loss"))))
    return out


def step_in_name(name: str) -> int | None:
    stem = re.sub(r"\.(pt|pth|bin|ckpt|safetensors|json|npz|npy|pkl|tar|zip|h5)$", "", name, flags=re.IGNORECASE)
    m = _KEYWORD_STEP.search(stem)
    if m:
        return int(m.group(1))
    if re.fullmatch(r"version_\d+|v\d+|run_?\d+", stem):
        return None
    m = _NUMBER.search(stem)
    return int(m.group(1)) if m else None


def group_own(rels: list[str]) -> dict[tuple[str, int], list[str]]:
    """The per-step checkpoints among relative paths, keyed as gpucli.run.checkpoints.group_checkpoints
    keys them: (a folder with a step, or a folder + "/" for the files of one step in it, step)."""
    groups: dict[tuple[str, int], list[str]] = {}
    for rel in sorted(rels):
        parts = rel.split("/")
        if any(_SKIP.search(p) for p in parts) or _LOGS.search(parts[-1]):
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


def watchdog_done(run_dir: Path) -> bool:
    """The watchdog has ended the run without asking (killed mid-flush, an older watchdog): the job is
    over all the same, so the uploader sends what is left and exits instead of polling forever."""
    try:
        return json.loads((run_dir / "watchdog.json").read_text()).get("state") == "done"
    except (OSError, ValueError, AttributeError):
        return False


# ---- uploading -----------------------------------------------------------------------------------


class Uploader:
    def __init__(self, args: argparse.Namespace, store: Any) -> None:
        self.args, self.store = args, store
        self.url = objstore.parse_url(args.store)
        self.root = objstore.run_prefix(self.url, args.run)
        self.bytes_sent = 0
        self.stored: dict[str, Any] = {}
        self.listed = False  # what the store holds is read once it answers

    def load(self) -> None:
        if not self.listed:
            self.store.ensure()
            self.stored = {c.name: c for c in objstore.whole_checkpoints(self.store, self.url, self.args.run)}
            self.listed = True
            log(self.args.run_dir, f"{len(self.stored)} whole checkpoint(s) of {self.args.run} in the store already")

    def local(self, flushing: bool) -> list[Local]:
        a = self.args
        if a.kind == "trainer":
            return trainer_checkpoints(a.checkpoints)
        now = time.time()
        return [c for c in own_checkpoints(a.checkpoints, a.run_dir) if flushing or now - c.mtime >= a.min_age_s]

    def upload(self, ck: Local) -> bool:
        """Every file, then the manifest. False when the checkpoint changed or went away on the pod
        meanwhile (the trainer pruned it): nothing of it counts, the next poll decides again."""
        prefix = f"{self.root}/{ck.name}"
        files: dict[str, dict[str, Any]] = {}
        items = sorted(ck.files.items(), key=lambda kv: kv[0] == "meta.json")
        try:
            before = {name: path.stat() for name, path in items}
            digests = {name: ck.hashes.get(name) or sha256_file(path) for name, path in items}
            self.store.put_files([(f"{prefix}/{name}", path) for name, path in items])  # the Hub: one commit
            after = {name: path.stat() for name, path in items}
        except FileNotFoundError:
            return False
        for name, _ in items:
            if (after[name].st_size, after[name].st_mtime_ns) != (before[name].st_size, before[name].st_mtime_ns):
                return False
            files[name] = {"sha256": digests[name], "bytes": after[name].st_size}
        sent = sum(f["bytes"] for f in files.values())
        manifest = {"format": objstore.MANIFEST_FORMAT, "run": self.args.run, "name": ck.name, "kind": ck.kind,
                    "step": ck.step, "loss": ck.loss, "val_loss": ck.val_loss, "files": files,
                    "uploaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = json.dumps(manifest, indent=1).encode()
        self.store.put_bytes(f"{prefix}/{objstore.MANIFEST}", data)
        self.bytes_sent += sent + len(data)
        self.stored[ck.name] = objstore.parse_manifest(data, prefix)
        log(self.args.run_dir, f"uploaded {ck.name} (step {ck.step}, {len(files)} files, {sent / 1e6:.1f} MB)")
        return True

    def keep(self, pending: list[Local] = ()) -> set[str]:  # type: ignore[assignment]
        """The store keeps what the pod keeps: the newest keep_last, the best by val loss, the newest best
        (of what is there and what is about to be: an old checkpoint is never sent only to be pruned)."""
        cks: list[Any] = [*self.stored.values(), *pending]
        keep: set[str] = set()
        for kinds in (("regular",), ("own",)):
            some = [c for c in cks if c.kind in kinds]
            some.sort(key=lambda c: (c.step if c.step is not None else -1), reverse=True)
            keep.update(c.name for c in some[: self.args.keep_last])
            scored = [c for c in some if c.val_loss is not None]
            if scored:
                keep.add(min(scored, key=lambda c: (c.val_loss, -(c.step or 0))).name)
        bests = [c for c in cks if c.kind == "best"]
        if bests:
            keep.add(max(bests, key=lambda c: c.step or 0).name)
        return keep

    def prune(self, uploading: set[str]) -> None:
        keep = self.keep()
        listing = self.store.ls(self.root)
        folders: dict[str, list[str]] = {}
        for key in listing:
            folders.setdefault(key[len(self.root) + 1:].split("/", 1)[0], []).append(key)
        for name, keys in sorted(folders.items()):
            whole = name in self.stored
            if name in keep or (not whole and name in uploading):
                continue
            manifest = [k for k in keys if k.endswith("/" + objstore.MANIFEST)]
            self.store.delete(manifest)  # first: from here on nobody takes it for whole
            self.store.delete([k for k in keys if k not in manifest])
            self.stored.pop(name, None)
            log(self.args.run_dir, f"pruned {name} from the store" if whole else f"removed the unfinished {name}")


def run(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    try:
        os.nice(10)  # the training loop first
    except OSError:
        pass
    write_state(run_dir, state="starting")  # the watchdog's end waits for an uploader that has said this
    try:
        up = Uploader(args, objstore.open_store(args.store))
    except objstore.StoreError as exc:
        log(run_dir, f"the store {args.store} cannot be used: {exc}; checkpoints stay on the pod only")
        write_state(run_dir, state="failed", error=str(exc))
        return 2
    (run_dir / FLUSH).unlink(missing_ok=True)  # a request left from the job's previous start (a resume) is not for this one
    log(run_dir, f"uploading checkpoints of {args.run} to {args.store} (keep last {args.keep_last} + best)")
    delay, said_at, said = 0.0, 0.0, ""
    flush_since: float | None = None
    while True:
        flushing = (run_dir / FLUSH).exists() or watchdog_done(run_dir)
        error = None
        try:
            up.load()
            pending = [c for c in up.local(flushing) if c.name not in up.stored]
            wanted = up.keep(pending)
            pending = [c for c in pending if c.name in wanted]
            pending.sort(key=lambda c: (c.kind == "best", c.step or 0), reverse=True)  # the best, then newest first
            for ck in pending:
                write_state(run_dir, state="uploading", checkpoint=ck.name, bytes_sent=up.bytes_sent,
                            uploaded=sorted(up.stored))
                up.upload(ck)
            up.prune({c.name for c in pending})
        except objstore.StoreError as exc:
            error = exc
        if error is None:
            delay = 0.0
            if said:
                log(run_dir, "the store works again")
                said = ""
        else:
            now = time.monotonic()
            line = f"the store refuses writes: {error}" if error.refused else f"upload failed: {error}"
            if line != said or now - said_at >= REFUSED_REPEAT_S:
                log(run_dir, f"{line}; training goes on, its checkpoints stay on the pod; trying again with backoff")
                said, said_at = line, now
            delay = min(max(5.0, delay * 2), 300.0)
        every = [c for c in up.local(True) if c.name not in up.stored] if flushing else []
        left = [c.name for c in every if c.name in up.keep(every)]
        flush_since = (flush_since or time.monotonic()) if flushing else None
        late = flush_since is not None and time.monotonic() - flush_since > args.flush_s
        if flushing and (not left or late or (error is not None and error.refused)):
            write_state(run_dir, state="flushed", uploaded=sorted(up.stored), bytes_sent=up.bytes_sent,
                        left=left, error=str(error) if error else None)
            log(run_dir, "job over: everything uploaded" if not left else f"job over: NOT uploaded: {', '.join(left)}")
            return 0 if not left else 1
        write_state(run_dir, state="failing" if error else "watching", uploaded=sorted(up.stored),
                    bytes_sent=up.bytes_sent, error=str(error) if error else None)
        time.sleep(delay if error else (0.5 if flushing else args.poll_s))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--run", required=True)
    ap.add_argument("--store", required=True, help="s3://BUCKET/PREFIX or hf://[datasets/]OWNER/NAME[/PREFIX]")
    ap.add_argument("--kind", choices=("trainer", "own"), default="trainer")
    ap.add_argument("--checkpoints", type=Path, help="default: RUN_DIR/checkpoints")
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--poll-s", type=float, default=10.0)
    ap.add_argument("--min-age-s", type=float, default=10.0, help="own code: a checkpoint untouched this long is whole")
    ap.add_argument("--flush-s", type=float, default=float(os.environ.get("GPUCLI_STORE_FLUSH_S") or 900),
                    help="once the job is over, give up on what is left after this long (the watchdog's wait)")
    args = ap.parse_args(argv)
    args.run_dir = args.run_dir.resolve()
    ck = args.checkpoints or Path("checkpoints")
    args.checkpoints = ck if ck.is_absolute() else args.run_dir / ck
    args.keep_last = max(1, args.keep_last)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
