"""A run's checkpoint store seen from this machine (``--store``; the client and the pod's uploader are
gpucli/store/): the uploader started beside the watchdog, the credentials for the pod's 0600 env file,
and reading the store back: the newest whole checkpoint for a resume on any provider, the best for
``fetch-best`` and ``export`` when the pod is gone.

Credentials: only the variables of the store's own service travel, from this machine's environment
(and ``gpucli keys`` / the ``hf auth login`` token for HF_TOKEN), into the run's env file on the pod. They
are never on a command line, in a log or in the run record; the record keeps the URL only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, NotFoundError, TransferError, UsageError
from gpucli.plan.storecost import S3_STANDARD_USD_PER_GB_MONTH, StoreQuote, store_quote
from gpucli.run.files.checkpoints import CheckpointInfo, checkpoint_step
from gpucli.run.files.export import ExportError, ExportResult, check_repo, hub_token
from gpucli.run.files.harvest import FetchResult, mirror_root, newest_good, partial_dir, swap_into_place
from gpucli.runs import podfiles
from gpucli.runs.secretenv import lookup
from gpucli.runs.storeurl import store_url
from gpucli.ssh import sha256_file
from gpucli.store import objstore

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch
    from gpucli.runs.records import RunRecord

EventFn = Callable[[str], None]
SYNC_SCRIPT = "storesync.sh"  # in the run folder: the uploader's start line, run from code/
#: The variables each service's client reads (boto3's credential and endpoint variables; huggingface_hub's).
S3_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
           "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")
HF_VARS = ("HF_TOKEN", "HF_ENDPOINT")
#: What the pod installs for each kind of store when its Python lacks it (the `store` and `hub` extras).
CLIENTS = {"s3": ("boto3", "boto3>=1.28"), "hf": ("huggingface_hub", "huggingface_hub>=0.23")}


class StoreFailed(TransferError):
    """The store said no, or is not reachable: one line, with its own words."""


def run_store(record: RunRecord) -> str | None:
    """The store a run was launched with (its URL, from the record's launch inputs), or None."""
    return store_url(record.inputs.requested.get("store"))


def store_env(url: str | None) -> dict[str, str]:
    """The store's credentials and endpoint for the pod's env file, from this machine."""
    if not url:
        return {}
    scheme = objstore.parse_url(url).scheme
    env = {name: os.environ[name] for name in (S3_VARS if scheme == "s3" else HF_VARS) if os.environ.get(name)}
    if scheme == "hf" and "HF_TOKEN" not in env:
        hit = lookup("HF_TOKEN")
        if hit is not None:
            env["HF_TOKEN"] = hit[0]
    if scheme == "s3" and not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env):
        raise GpucliError(f"--store {url}: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set here",
                          hint="export them (and AWS_ENDPOINT_URL for R2, B2, MinIO, Wasabi): the pod gets them "
                               "in its 0600 env file")
    return env


def _opened(url: str) -> Any:
    try:
        return objstore.open_store(url)
    except objstore.StoreError as exc:
        raise StoreFailed(str(exc)) from None


# --------------------------------------------------------------------------------------------------
# On the pod: the uploader


def start_store_sync(host: Host, resolved: ResolvedLaunch, *, kind: str, checkpoints: str, keep_last: int,
                     on_event: EventFn, node_rank: int = 0) -> int | None:
    """Start gpucli/store/storesync.py beside the watchdog (its own session, the run's env file), after
    making sure the pod's Python has the store's client. Returns its pid; None without a store.
    ``node_rank``: a run over several nodes runs one on every node, each sending its node's part of
    every sharded checkpoint; node 0's writes the manifest once every part is there."""
    if not resolved.store:
        return None
    wd, py = resolved.workdir, resolved.python
    module, requirement = CLIENTS[objstore.parse_url(resolved.store).scheme]
    probe = host.run(f"{shlex.quote(py)} -c {shlex.quote('import ' + module)}", timeout_s=60, check=False)
    if probe.exit_code != 0:
        from gpucli.providers.registry import get_target  # lazy: the targets load the providers' clients

        if not get_target(resolved.provider).bootstrap:
            raise GpucliError(f"--store {resolved.store}: {module} is not installed for {py} on this host",
                              hint=f"pip install '{requirement}' (gpucli's `store` extra) into that Python")
        on_event(f"installing {requirement} on the pod for the checkpoint store")
        res = host.run(f"{shlex.quote(py)} -m pip install -q {shlex.quote(requirement)}", timeout_s=600, check=False)
        if res.exit_code != 0:
            raise GpucliError(f"installing {requirement} on the pod failed: {(res.stderr or res.stdout).strip()[-300:]}")
    podfiles.STORE.write(host, wd)
    args = [py, "../storesync.py", "--run-dir", "..", "--run", resolved.name, "--store", resolved.store,
            "--kind", kind, "--checkpoints", checkpoints, "--keep-last", str(max(1, keep_last))]
    if node_rank:
        args += ["--node-rank", str(node_rank)]
    for var, flag in (("GPUCLI_STORE_POLL_S", "--poll-s"), ("GPUCLI_STORE_FLUSH_S", "--flush-s")):
        if os.environ.get(var):  # set here at launch: the pod's uploader takes it (its own env is the pod's)
            args += [flag, os.environ[var]]
    line = " ".join(shlex.quote(a) for a in args)
    # what a vast instance started again runs (resume.sh, gpucli/run/inputs/resumescript.py): the same uploader
    host.write_file(f"{wd}/{SYNC_SCRIPT}", f"#!/bin/sh\nexec {line}\n".encode(), mode=0o755)
    pid = host.start_detached(line, cwd=f"{wd}/code", log_path=f"{wd}/storesync.out", env_file=f"{wd}/env")
    on_event(f"checkpoint uploader started (pid {pid}): every checkpoint kept, and the best, to {resolved.store}"
             + (f" (node {node_rank}'s part of each)" if node_rank else ""))
    return pid


def flush(host: Host, record: RunRecord, on_event: EventFn, *, cap_s: float | None = None) -> None:
    """``gpucli down``, after the job stopped: its uploader sends what is left (the emergency checkpoint)
    before the pod ends, as the watchdog's end action waits for it (gpucli/pod/storeflush.py)."""
    if run_store(record) is None:
        return
    wd = record.workdir
    if not host.exists(f"{wd}/storesync.json"):
        return
    cap = cap_s if cap_s is not None else float(os.environ.get("GPUCLI_STORE_FLUSH_S") or 900)
    host.write_file(f"{wd}/storesync.flush", b"down\n", mode=0o644)
    on_event(f"waiting up to {cap:g} s for the last checkpoints to reach {run_store(record)}")
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        try:
            state = json.loads(host.read_file(f"{wd}/storesync.json")[:65536])
        except (GpucliError, ValueError):
            state = {}
        if isinstance(state, dict) and state.get("state") in ("flushed", "failed"):
            left = state.get("left") or []
            if left or state.get("state") == "failed":
                on_event(f"the store did not take {', '.join(map(str, left)) or 'the checkpoints'}: "
                         f"{str(state.get('error') or 'see storesync.log')[:200]}")
            return
        time.sleep(1.0)
    on_event(f"the store's uploader did not finish in {cap:g} s: see storesync.log on the pod")


def trainer_keep_last(resolved: ResolvedLaunch) -> int:
    training = (resolved.trainer_config or {}).get("training") or {}
    value = training.get("keep_last") if isinstance(training, dict) else None
    return value if isinstance(value, int) and value > 0 else 3


def storage_rate(url: str) -> float:
    """$/GB-month of the store: ``GPUCLI_STORE_USD_PER_GB_MONTH``, else S3 Standard's list price; a Hub
    repository $0 (within its quota)."""
    rate = os.environ.get("GPUCLI_STORE_USD_PER_GB_MONTH")
    try:
        if rate and float(rate) >= 0:
            return float(rate)
    except ValueError:
        pass
    return 0.0 if objstore.parse_url(url).scheme == "hf" else S3_STANDARD_USD_PER_GB_MONTH


def quote(resolved: ResolvedLaunch, transfer_usd_per_gb: float | None = None) -> StoreQuote | None:
    """What the store costs this run (gpucli.plan.storecost), from the launch's checkpoint plan; None
    without a store or a checkpoint size. The provider's rate out: RunPod bills none; vast bills the
    offer's ``inet_up_cost`` (``transfer_usd_per_gb``, once an offer is chosen)."""
    d = resolved.disk
    if not resolved.store or d is None:
        return None
    from gpucli.providers.registry import get_target  # lazy: the targets load the providers' clients

    if transfer_usd_per_gb is None and get_target(resolved.provider).caps.bills_transfer is False:
        transfer_usd_per_gb = 0.0
    storage = storage_rate(resolved.store)
    return store_quote(checkpoint_gb=d.checkpoints.checkpoint_gb, written=d.written or 1, keep_last=d.keep_last,
                       hours=resolved.planned.hours, transfer_usd_per_gb=transfer_usd_per_gb,
                       storage_usd_per_gb_month=storage)


# --------------------------------------------------------------------------------------------------
# Reading it back


@dataclass(frozen=True)
class StorePull:
    checkpoint: objstore.StoredCheckpoint
    dest: Path
    files: tuple[str, ...]
    bytes: int


def whole(record: RunRecord) -> tuple[Any, list[objstore.StoredCheckpoint]]:
    """The run's store and its whole checkpoints (oldest first); NotFoundError when it has no store."""
    url = run_store(record)
    if url is None:
        raise NotFoundError(f"run {record.name} has no checkpoint store", hint="launch with --store s3://... or hf://...")
    store = _opened(url)
    try:
        return store, objstore.whole_checkpoints(store, objstore.parse_url(url), record.name)
    except objstore.StoreError as exc:
        raise StoreFailed(f"{url}: {exc}") from None


def download(store: Any, ck: objstore.StoredCheckpoint, target: Path, *, with_optimizer: bool = True) -> StorePull:
    """Every file of ``ck`` (without the optimizer state unless asked), each checked against the
    manifest's sha256, into a partial folder renamed to ``target`` only when complete."""
    tmp = partial_dir(target)
    tmp.mkdir(parents=True, exist_ok=True)
    names = [n for n in ck.files if with_optimizer or not n.startswith("optim_")]
    names.sort(key=lambda n: n == "meta.json")  # meta.json last, as everywhere
    total = 0
    for name in names:
        sha, size = ck.files[name]
        dest = tmp / name
        if not (dest.is_file() and dest.stat().st_size == size and sha256_file(dest) == sha):
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                store.get_file(f"{ck.prefix}/{name}", dest)
            except objstore.StoreError as exc:
                raise StoreFailed(str(exc)) from None
            total += size
            if sha256_file(dest) != sha:
                dest.unlink()
                raise StoreFailed(f"{ck.name}/{name} from the store does not match its sha256 (left out)")
    for stray in [p for p in tmp.iterdir() if p.name not in names and p.is_file()]:
        stray.unlink()
    swap_into_place(tmp, target)
    return StorePull(ck, target, tuple(names), total)


def pull_newest(record: RunRecord, on_event: EventFn) -> Path | None:
    """The newest whole checkpoint in the run's store, into this machine's mirror (where ``resume`` takes
    it from), unless the mirror already holds that step or a later one. None when the store has none."""
    if run_store(record) is None:
        return None
    try:
        store, cks = whole(record)
    except StoreFailed as exc:  # the mirror (or the volume) may still hold one: the resume goes on without the store
        on_event(f"the checkpoint store cannot be read ({exc.message}): resuming from this machine's mirror")
        return None
    ck = objstore.newest_resumable(cks)
    if ck is None:
        on_event("the checkpoint store holds no whole checkpoint of this run yet")
        return None
    if ck.kind == "own":  # your own code's files, at their paths under --checkpoints: the mirror is that folder
        target = mirror_root(record.name) / "own-checkpoints"
        on_event(f"taking {ck.name} (step {ck.step}) from the checkpoint store")
        return download(store, ck, target).dest
    mirrored = newest_good(record.name)
    step = checkpoint_step(mirrored) if mirrored is not None else None
    if mirrored is not None and step is not None and ck.step is not None and step >= ck.step:
        return mirrored
    target = mirror_root(record.name) / "checkpoints" / ck.name
    on_event(f"taking {ck.name} (step {ck.step}) from the checkpoint store")
    got = download(store, ck, target)
    for old in [p for p in target.parent.iterdir() if p.is_dir() and p.name != ck.name and not p.name.startswith(".")]:
        shutil.rmtree(old, ignore_errors=True)  # the mirror keeps the newest (these are older), as `gpucli mirror` does
    return got.dest


def moved_request(req: LaunchRequest, record: RunRecord, provider: str | None,
                  nodes: int | None = None) -> tuple[LaunchRequest, bool]:
    """``resume --provider X``: the run's request on another provider (what belonged to the old one, its
    host, volume, image, workdir and vast query, left to the new one's defaults); it needs a checkpoint
    store or a mirrored checkpoint to continue from. (request, whether it moved). A run over several
    nodes moves onto one machine (``--nodes 1``): the store's checkpoint holds every node's part and
    the trainer reshards it."""
    if provider is None or provider.strip().lower() == record.provider:
        return req, False
    if req.nodes > 1 and nodes != 1:
        raise UsageError(f"run {record.name} ran on {req.nodes} nodes: it moves to another provider on one machine",
                          hint="resume --provider X --nodes 1 (its store's newest whole checkpoint holds every node's part)")
    moved = dataclasses.replace(req, provider=provider.strip().lower(), host=None, hosts=(), identity=None,
                                volume=None, volume_size_gb=None, image=None, workdir=None, python=None,
                                query=None, nodes=nodes or req.nodes).checked()
    return moved, True


def moved_record(record: RunRecord, req: LaunchRequest, workdir: str) -> RunRecord:
    """The run's record on its new provider: the same run (name, metrics, store), its old pod remembered."""
    old = (record.instance_id,) if record.instance_id else ()
    return record.with_(provider=req.provider, workdir=workdir, ssh=None, instance_id=None, pid=None,
                        watchdog_pid=None, nodes=record.nodes[:req.nodes - 1], previous_instances=tuple(dict.fromkeys(record.previous_instances + old)),
                        launch=record.inputs.with_(request=req.to_json()["request"]))


def best_in_store(record: RunRecord) -> tuple[Any, objstore.StoredCheckpoint]:
    """The best whole checkpoint in the run's store: the trainer's newest ``best`` weights, else the
    lowest val loss (the newest step when none was measured)."""
    store, cks = whole(record)
    bests = [c for c in cks if c.kind == "best"]
    ck = max(bests, key=lambda c: c.step or 0) if bests else objstore.best_of(cks)
    if ck is None:
        raise NotFoundError(f"run {record.name}: no whole checkpoint in its store {run_store(record)}")
    return store, ck


def fetch_best(record: RunRecord, dest: Path, *, with_optimizer: bool = False) -> FetchResult:
    """``fetch-best`` from the store: the best checkpoint into ``dest/<name>``, sha256-verified."""
    store, ck = best_in_store(record)
    got = download(store, ck, dest / ck.name, with_optimizer=with_optimizer)
    info = CheckpointInfo(name=ck.name, path=ck.prefix, step=ck.step or 0, val_loss=ck.val_loss, train_loss=ck.loss,
                          kind=ck.kind, files={n: sha for n, (sha, _) in ck.files.items()},
                          meta={"reason": f"from the checkpoint store {run_store(record)}"})
    return FetchResult(checkpoint=info, dest=got.dest, files=got.files, bytes=got.bytes)


def export_from_store(record: RunRecord, dest: Path | None, *, push: str | None, private: bool,
                      on_event: EventFn) -> ExportResult:
    """``gpucli export`` with the pod gone: the store's best checkpoint brought here, exported here by the
    bundled trainer (``python -m trainer.export``: torch on this machine, the `train` extra), then kept in
    ``dest / RUN-hf`` or pushed. The Hub token goes to that process's environment, never its command line."""
    import subprocess  # only here: the export runs as its own program
    import sys  # the same interpreter as gpucli's, which has the trainer package beside it

    env = dict(os.environ)
    if push:
        check_repo(push)
        token = hub_token()
        if token is None:
            raise NotFoundError("no Hugging Face token to push with", hint="gpucli keys set hf, $HF_TOKEN, or `hf auth login`")
        env["HF_TOKEN"] = token[0]
    cache = mirror_root(record.name) / "store-best"
    got = fetch_best(record, cache)
    on_event(f"exporting {got.checkpoint.name} (step {got.checkpoint.step}) from the checkpoint store on this machine"
             + (f" and pushing to {push}" if push else ""))
    out = (cache if push or dest is None else Path(dest)) / f"{record.name}-hf"  # pushed: nothing lands in --dest
    argv = [sys.executable, "-m", "trainer.export", str(got.dest), str(out)]
    if push:
        argv += ["--push", push] + (["--private"] if private else [])
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3 * 3600, check=False)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0:
        why = (res.stderr.strip() or res.stdout.strip() or f"exit code {res.returncode}").splitlines()[-1]
        if "No module named 'torch'" in why:
            raise ExportError("an export from the store runs on this machine and needs torch",
                              hint="pip install 'gpucli[train]' (the CPU build of torch is enough)")
        raise ExportError(f"export of run {record.name} failed: {why.removeprefix('error: ')}")
    files = tuple(sorted(p.name for p in out.iterdir() if p.is_file()))
    pushed = next((ln.split(" ", 2)[-1] for ln in lines if ln.startswith("pushed to ")), None)
    summary = next((ln for ln in lines if ln.startswith("exported ")), "")
    return ExportResult(str(out), None if push else out, files, sum((out / f).stat().st_size for f in files), summary,
                        pushed)
