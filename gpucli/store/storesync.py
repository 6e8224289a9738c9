"""The pod's checkpoint uploader: every checkpoint the run keeps, and its best, copied to the run's store
(:mod:`objstore`, loaded from next to this file) while it trains.

Started by the launch beside the watchdog, in its own session, with the run's 0600 env file (the
store's credentials are read there by boto3 / huggingface_hub; never on its command line):

    python3 storesync.py --run-dir DIR --run NAME --store URL --kind trainer|own --checkpoints DIR
                         [--keep-last N] [--poll-s S] [--min-age-s S] [--node-rank R]

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
- a run over several nodes (the trainer's sharded checkpoints, every node holding its ranks' files,
  meta.json listing each node's under ``nodes``): each node runs one uploader (``--node-rank R``). Node
  R > 0 sends its files into the same checkpoint folder, then ``part-nodeR.json`` (its files' sha256
  and bytes); node 0 sends its own and writes ``manifest.json``, listing every node's files, only once
  every other node's part is there with the hashes node 0's meta.json gives for it. A node whose
  uploader died leaves that checkpoint without a manifest: not whole, never taken. Node 0 alone prunes;
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
import os
import re
import sys
import time
from pathlib import Path
from typing import Any


def _load(name: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(f"gpucli_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault(f"gpucli_{name}", module)  # dataclasses resolve their module by name
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


objstore = _load("objstore")
storelocal = _load("storelocal")  # what is on the pod to send
trainer_checkpoints, own_checkpoints = storelocal.trainer_checkpoints, storelocal.own_checkpoints
Local = storelocal.Local  # a checkpoint on the pod (annotated Any here: the module is loaded by path)
group_own, step_in_name = storelocal.group_own, storelocal.step_in_name

FLUSH = "storesync.flush"
PART = "part-node{}.json"  # one node's files of a checkpoint of a run over several nodes
STATE = "storesync.json"
LOG = "storesync.log"
REFUSED_REPEAT_S = 600.0


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
        self.sent: dict[str, tuple[dict[str, str], dict[str, dict[str, Any]]]] = {}  # several nodes: my part sent
        self.listing: dict[str, int] = {}  # the run's keys, read each poll when some checkpoint waits on parts
        self.waiting: dict[str, str] = {}  # checkpoint -> what it waits for (said once in the log)

    def load(self) -> None:
        if not self.listed:
            self.store.ensure()
            self.stored = {c.name: c for c in objstore.whole_checkpoints(self.store, self.url, self.args.run)}
            self.listed = True
            log(self.args.run_dir, f"{len(self.stored)} whole checkpoint(s) of {self.args.run} in the store already")

    def local(self, flushing: bool) -> list[Any]:
        a = self.args
        if a.kind == "trainer":
            return trainer_checkpoints(a.checkpoints)
        now = time.time()
        return [c for c in own_checkpoints(a.checkpoints, a.run_dir) if flushing or now - c.mtime >= a.min_age_s]

    def send(self, ck: Any, items: list[tuple[str, Path]]) -> dict[str, dict[str, Any]] | None:
        """These files of ``ck`` into its folder in the store: {name: sha256, bytes}; None when one changed
        or went away on the pod meanwhile (the trainer pruned it)."""
        prefix = f"{self.root}/{ck.name}"
        try:
            before = {name: path.stat() for name, path in items}
            digests = {name: ck.hashes.get(name) or sha256_file(path) for name, path in items}
            self.store.put_files([(f"{prefix}/{name}", path) for name, path in items])  # the Hub: one commit
            after = {name: path.stat() for name, path in items}
        except FileNotFoundError:
            return None
        files: dict[str, dict[str, Any]] = {}
        for name, _ in items:
            if (after[name].st_size, after[name].st_mtime_ns) != (before[name].st_size, before[name].st_mtime_ns):
                return None
            files[name] = {"sha256": digests[name], "bytes": after[name].st_size}
        self.bytes_sent += sum(f["bytes"] for f in files.values())
        return files

    def part(self, ck: Any, node: str) -> dict[str, dict[str, Any]] | None:
        """Node ``node``'s part of ``ck`` when it is in the store with the files node 0's meta.json lists."""
        key = f"{self.root}/{ck.name}/{PART.format(node)}"
        if key not in self.listing:
            return None
        try:
            part = json.loads(self.store.get_bytes(key) or b"null")
        except (ValueError, UnicodeDecodeError):
            return None
        files = part.get("files") if isinstance(part, dict) else None
        if not isinstance(files, dict) or {n: (f or {}).get("sha256") for n, f in files.items()} != ck.nodes[node]:
            return None  # an older save of the same step, or not this checkpoint's
        return files

    def upload(self, ck: Any) -> bool:
        """Every file, then the manifest. False when the checkpoint changed or went away on the pod
        meanwhile (the trainer pruned it): nothing of it counts, the next poll decides again. A run over
        several nodes: node 0's files once, then the manifest when every other node's part is there."""
        prefix = f"{self.root}/{ck.name}"
        items = sorted(ck.files.items(), key=lambda kv: kv[0] == "meta.json")
        if not ck.nodes:
            got = self.send(ck, items)
            if got is None:
                return False
            files = got
        else:
            mine = self.sent.get(ck.name)
            if mine is None or mine[0] != ck.hashes:
                got = self.send(ck, items)
                if got is None:
                    return False
                self.sent[ck.name] = mine = (dict(ck.hashes), got)
            files = dict(mine[1])
            missing = []
            for node in sorted(n for n in ck.nodes if n != "0"):
                part = self.part(ck, node)
                if part is None:
                    missing.append(node)
                else:
                    files.update({n: f for n, f in part.items() if n not in files})
            if missing:
                said = f"node {', '.join(missing)}"
                if self.waiting.get(ck.name) != said:
                    log(self.args.run_dir, f"{ck.name}: waiting for the part of {said} (not whole until then)")
                    self.waiting[ck.name] = said
                return False
            self.sent.pop(ck.name, None)
            self.waiting.pop(ck.name, None)
        sent = sum(f["bytes"] for f in files.values())
        manifest = {"format": objstore.MANIFEST_FORMAT, "run": self.args.run, "name": ck.name, "kind": ck.kind,
                    "step": ck.step, "loss": ck.loss, "val_loss": ck.val_loss, "files": files,
                    "uploaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = json.dumps(manifest, indent=1).encode()
        self.store.put_bytes(f"{prefix}/{objstore.MANIFEST}", data)
        self.bytes_sent += len(data)
        self.stored[ck.name] = objstore.parse_manifest(data, prefix)
        log(self.args.run_dir, f"uploaded {ck.name} (step {ck.step}, {len(files)} files, {sent / 1e6:.1f} MB)")
        return True

    def keep(self, pending: list[Any] = ()) -> set[str]:  # type: ignore[assignment]
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

    def prune(self, uploading: set[str], newest: int | None = None) -> None:
        """``newest``: the newest step on this node; an unfinished folder past it is another node's
        part of a checkpoint this node has not renamed into place yet, not a leftover."""
        keep = self.keep()
        listing = self.store.ls(self.root)
        folders: dict[str, list[str]] = {}
        for key in listing:
            folders.setdefault(key[len(self.root) + 1:].split("/", 1)[0], []).append(key)
        for name, keys in sorted(folders.items()):
            whole = name in self.stored
            ahead = re.fullmatch(r"step_(\d+)", name) and newest is not None and int(name[5:]) > newest
            if name in keep or (not whole and (name in uploading or ahead)):
                continue
            manifest = [k for k in keys if k.endswith("/" + objstore.MANIFEST)]
            self.store.delete(manifest)  # first: from here on nobody takes it for whole
            self.store.delete([k for k in keys if k not in manifest])
            self.stored.pop(name, None)
            log(self.args.run_dir, f"pruned {name} from the store" if whole else f"removed the unfinished {name}")

    def sync(self, flushing: bool) -> None:
        """One poll: what is new goes up (the best, then the newest first), what the pod no longer keeps goes."""
        self.load()
        local = self.local(flushing)
        pending = [c for c in local if c.name not in self.stored]
        wanted = self.keep(pending)
        pending = [c for c in pending if c.name in wanted]
        pending.sort(key=lambda c: (c.kind == "best", c.step or 0), reverse=True)
        if any(c.nodes for c in pending):
            self.listing = self.store.ls(self.root)
        for ck in pending:
            write_state(self.args.run_dir, state="uploading", checkpoint=ck.name, bytes_sent=self.bytes_sent,
                        uploaded=sorted(self.stored))
            self.upload(ck)
        self.prune({c.name for c in pending}, max((c.step or 0 for c in local if c.kind == "regular"), default=None))

    def left(self) -> list[str]:
        every = [c for c in self.local(True) if c.name not in self.stored]
        return [c.name for c in every if c.name in self.keep(every)]


class PartUploader(Uploader):
    """Node R > 0 of a run over several nodes: its files of each sharded checkpoint, then its
    ``part-nodeR.json``; node 0's uploader writes the manifest and prunes."""

    def __init__(self, args: argparse.Namespace, store: Any) -> None:
        super().__init__(args, store)
        self.node = str(args.node_rank)
        self.parts: dict[str, dict[str, str]] = {}  # checkpoint -> the hashes of the part in the store

    def load(self) -> None:
        if not self.listed:
            self.store.ensure()
            self.listed = True
            log(self.args.run_dir, f"node {self.node}: sending this node's part of every checkpoint of {self.args.run}")

    def mine(self) -> list[Any]:
        cks = [c for c in trainer_checkpoints(self.args.checkpoints) if c.kind == "regular" and c.nodes]
        return sorted(cks, key=lambda c: c.step or 0, reverse=True)[: self.args.keep_last]

    def done(self, ck: Any) -> bool:
        prefix = f"{self.root}/{ck.name}"
        if self.parts.get(ck.name) == ck.hashes or f"{prefix}/{objstore.MANIFEST}" in self.listing:
            return True
        key = f"{prefix}/{PART.format(self.node)}"
        if key in self.listing:
            try:
                part = json.loads(self.store.get_bytes(key) or b"null")
            except (ValueError, UnicodeDecodeError):
                part = None
            files = part.get("files") if isinstance(part, dict) else None
            if isinstance(files, dict) and {n: (f or {}).get("sha256") for n, f in files.items()} == ck.hashes:
                self.parts[ck.name] = dict(ck.hashes)
                return True
        return False

    def sync(self, flushing: bool) -> None:
        self.load()
        self.listing = self.store.ls(self.root)
        for ck in self.mine():
            if self.done(ck):
                continue
            write_state(self.args.run_dir, state="uploading", checkpoint=ck.name, bytes_sent=self.bytes_sent,
                        uploaded=sorted(self.parts))
            files = self.send(ck, [(n, ck.files[n]) for n in sorted(ck.hashes) if n in ck.files])
            if files is None:
                continue
            part = {"format": objstore.MANIFEST_FORMAT, "run": self.args.run, "name": ck.name, "node": int(self.node),
                    "step": ck.step, "files": files}
            self.store.put_bytes(f"{self.root}/{ck.name}/{PART.format(self.node)}", json.dumps(part, indent=1).encode())
            self.parts[ck.name] = dict(ck.hashes)
            log(self.args.run_dir, f"uploaded node {self.node}'s part of {ck.name} ({len(files)} files)")

    def left(self) -> list[str]:
        return [c.name for c in self.mine() if self.parts.get(c.name) != c.hashes
                and f"{self.root}/{c.name}/{objstore.MANIFEST}" not in self.listing]


def run(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    try:
        os.nice(10)  # the training loop first
    except OSError:
        pass
    write_state(run_dir, state="starting")  # the watchdog's end waits for an uploader that has said this
    try:
        up = (PartUploader if args.node_rank > 0 else Uploader)(args, objstore.open_store(args.store))
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
            up.sync(flushing)
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
        left = up.left() if flushing else []
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
    ap.add_argument("--node-rank", type=int, default=0, help="a run over several nodes: this node's rank")
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
