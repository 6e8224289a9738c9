"""The user's own training command as a job (:class:`gpucli.run.starting.jobs.base.Job`): :class:`OwnCode`.

The pod-side runner (``gpucli/pod/jobrun.py`` with ``logparse.py``) is uploaded beside the run folder
and started detached where the bundled trainer would be: its pid is the process group the watchdog
watches and signals, its ``metrics.jsonl`` and ``status.json`` are what ``tail``/``status`` read.

Layout on the host (``wd`` is the run's folder)::

    wd/code/            the --code folder (synced) or the git clone; the command runs here
    wd/code/<ckpts>/    --checkpoints (default ``checkpoints``), what fetch-best and the mirror read
    wd/data/src/        --data
    wd/env              0600: Telegram, the task's env, a git token; sourced, never on a command line
    wd/jobrun.py, ...  the runner and what it loads (gpucli.runs.podfiles.OWN_CODE), the watchdog (WATCHDOG)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, UsageError
from gpucli.plan.disk import disk_need
from gpucli.plan.owncode import OWN_KEEP_LAST, own_code_estimate
from gpucli.providers.registry import get_target
from gpucli.run.files import harvest
from gpucli.run.files.store import start_store_sync, store_env
from gpucli.run.inputs.datasources import links_line
from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch
from gpucli.run.starting.preflight import check_own, timeout_s
from gpucli.run.starting.start import secrets_env, start_job
from gpucli.runs import podfiles
from gpucli.runs.records import PlannedSpeed, RunRecord
from gpucli.runs.secretenv import task_env_names
from gpucli.runs.task import GitCode, Task, load_task
from gpucli.settings import load_keys, watchdog_grace_s
from gpucli.ssh import DEFAULT_EXCLUDES, load_ignore, walk_local

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.registry import Host
    from gpucli.run.files.harvest import FetchResult, MirrorResult

EventFn = Callable[[str], None]

JOB_FILES = tuple(f.name for f in podfiles.OWN_CODE.files if f.source.startswith("pod/"))
BIG_FILE_BYTES = 100 << 20  # code folders hold code: bigger files (weights, data) are left out of the sync
GRACE_MARGIN_S = 10.0  # the job's grace ends this long before the watchdog's (and down's) SIGKILL
DOWN_TIMEOUT_S = 120.0  # gpucli down's wait for the trainer (gpucli.run.watch.monitor.stop_trainer)
SETUP_TIMEOUT_S = 3600.0  # a --setup that runs longer than this ends the launch
SETUP_POLL_S = 0.5
ACK_WAIT_S = 30.0  # a failed setup's runner waits this long for the launch to read its verdict


@dataclass(frozen=True)
class OwnCode:
    """A resolved own-code launch: the task and what the pod needs to run it."""

    task: Task
    grace_s: float  # SIGTERM to SIGKILL for the job (below the watchdog's grace and down's timeout)
    checkpoints: str  # relative to the code folder, no trailing slash

    def checkpoints_dir(self, workdir: str) -> str:
        return posixpath.normpath(f"{workdir}/code/{self.checkpoints}")

    def secret_names(self) -> tuple[str, ...]:
        return tuple(self.task.env_from_local)

    def describe(self) -> list[str]:
        """The resolved task, a line a key (``--dry-run``)."""
        t = self.task
        code = f"{t.code.url}@{t.code.ref or 'default branch'} (cloned on the host)" if isinstance(t.code, GitCode) \
            else f"{t.code.resolve()} (synced)"
        lines = [f"task: {t.source}" if t.source else "task: from the command line", f"code: {code}",
                 f"run: {t.run}", f"setup: {t.setup or '-'}", f"checkpoints: {self.checkpoints}/",
                 f"data: {t.data.resolve() if t.data else '-'}",
                 f"metrics: TensorBoard events, trainer_state.json and metrics.csv under the code folder, console "
                 f"lines{' + ' + t.metrics_regex if t.metrics_regex else ''}, $GPUCLI_METRICS",
                 f"grace: {self.grace_s:g} s between SIGTERM and SIGKILL"]
        if t.env:
            lines.append("env: " + ", ".join(k for k, _ in t.env) + " (in the 0600 env file)")
        if t.env_from_local:
            lines.append("env_from_local: " + ", ".join(t.env_from_local) + " (values from this machine, in the "
                         "0600 env file only)")
        return lines

    # -- the job contract: resolve -------------------------------------------------------------------

    kind = "own"
    checks_disk = False  # no model of the trainer's: its checkpoint sizes are unknown before the launch
    resumes_from_volume = False  # a resume uploads the mirrored --checkpoints folder

    def request(self, req: LaunchRequest) -> LaunchRequest:
        """The trainer's resolution is reused for the machine, price and limits; its smallest preset
        keeps a memory check for a model that will never be trained from refusing a small GPU."""
        return req if req.model else dataclasses.replace(req, model="tiny")

    def resolved(self, resolved: ResolvedLaunch, catalog: Catalog, asked: LaunchRequest) -> ResolvedLaunch:
        """The trainer's resolution with the job runner as its command and no step count (the job's
        own code decides how many steps it takes); the time, cost and disk of a model of the size the
        launch names (--model or --params, with --tokens), or a plain word that there is none."""
        est = own_code_estimate(catalog, gpu_id=resolved.gpu_id, n_gpus=resolved.n_gpus,
                                usd_per_hour=resolved.price_per_hour_usd, model=resolved.model if asked.model else None,
                                params=asked.own_params, seq_len=asked.own_seq_len, tokens=asked.own_tokens)
        planned = PlannedSpeed(source=est.missing or est.source, tokens_per_s=est.tokens_per_s, hours=est.hours,
                               cost_usd=est.cost_usd)
        disk = None if est.checkpoint is None else disk_need(
            est.checkpoint, keep_last=OWN_KEEP_LAST, data_gb=None, have_gb=None,
            where=f"your code's checkpoints (AdamW and keep_last {OWN_KEEP_LAST} assumed; {est.shape_note})")
        resolved = dataclasses.replace(resolved, limits=resolved.limits.with_(max_steps=None), disk=disk,
                                       planned=planned, own_code=True,
                                       model=est.shape if est.shape is not None else resolved.model)
        return dataclasses.replace(resolved, command=job_command(resolved, self))

    def default_name(self, profile: str, model: str, phase: str) -> str:
        return default_name(self.task, profile)

    def labelled(self, record: RunRecord) -> RunRecord:
        return record.with_(model="own-code", phase="own-code")

    def inputs(self) -> dict[str, Any]:
        return {"own": task_to_json(self.task)}

    def again(self) -> OwnCode:
        return resolve_own(self.task)

    # -- start ---------------------------------------------------------------------------------------

    def start(self, host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
              save: Callable[[RunRecord], Any], restore: Path | None = None,
              metrics: Path | None = None, node_env: Mapping[str, str] | None = None) -> RunRecord:
        """Env file (before a clone: it holds the git token), runner and code, data, the mirrored
        checkpoints folder on a resume, then jobrun detached and the watchdog watching its process
        group. A --setup is waited for: when it fails the launch fails with its last lines."""
        wd = resolved.workdir
        q = shlex.quote(wd)
        # status.json of an earlier attempt in the same folder would read as this one's end; a cloud launch
        # is always a new pod (a resume included), where --setup runs again whatever its folder holds.
        stale = f"{q}/status.json {q}/.verdict-read {q}/preflight.json" + (f" {q}/.setup-done" if get_target(resolved.provider).cloud else "")
        host.run(f"mkdir -p -- {q}/code {q}/data && rm -f -- {stale}", timeout_s=60)
        host.write_env_file(f"{wd}/env", {**job_env(self, secrets_env(resolved.env_names + self.task.env_from_local)),
                                            **(node_env or {}), **store_env(resolved.store)})
        put_code(host, resolved, self, on_event)
        put_data(host, resolved, on_event)
        if restore is not None:
            on_event(f"restoring the mirrored {self.checkpoints}/ from this machine")
            host.sync_up(restore, self.checkpoints_dir(wd), excludes=[])
            if metrics is not None and metrics.exists() and not host.exists(f"{wd}/metrics.jsonl"):
                host.write_file(f"{wd}/metrics.jsonl", metrics.read_bytes(), mode=0o644)
        if not (node_env or {}).get("GPUCLI_NODE_RANK", "0").strip("0"):  # before the job, as the trainer's
            start_store_sync(host, resolved, kind="own", checkpoints=posixpath.normpath(f"code/{self.checkpoints}"),
                             keep_last=3, on_event=on_event)
        record = start_job(host, resolved, record, job_command(resolved, self), what="job", on_event=on_event,
                           save=save, detail=f": {self.task.run}")
        if self.task.setup or resolved.preflight:  # --preflight CMD: after --setup, before --run (gpucli.run.starting.preflight)
            pid = record.pid
            assert pid is not None  # start_job recorded it
            try:
                wait_for_setup(host, wd, lambda: host.is_running(pid), on_event=on_event)
            except GpucliError:
                if resolved.preflight:
                    check_own(host, resolved, record, on_event=on_event, save=save)  # the preflight's own line
                raise
            if resolved.preflight:
                record = check_own(host, resolved, record, on_event=on_event, save=save)
        return record

    # -- harvest and resume --------------------------------------------------------------------------

    def fetch_best(self, host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False,
                   progress: Any = None, on_event: EventFn) -> FetchResult:
        return harvest.fetch_best_folder(host, record, self.checkpoints_dir(record.workdir), dest,
                                         with_optimizer=with_optimizer, progress=progress, on_event=on_event)

    def mirror(self, host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
               on_event: EventFn) -> MirrorResult:
        return harvest.mirror_folder(host, record, self.checkpoints_dir(record.workdir), progress=progress,
                                     on_event=on_event)

    def restore_point(self, run: str) -> Path | None:
        return harvest.own_mirror(run)


def checkpoints_folder(text: str | None) -> str:
    """--checkpoints as the run folder names it: relative to the code folder, no trailing slash."""
    return (text or "checkpoints").strip().rstrip("/") or "checkpoints"


def from_record(data: Mapping[str, Any]) -> OwnCode:
    """The job a run record's ``launch.own`` describes, as it was launched (nothing checked again: the
    code folder need not be on this machine to read the run's checkpoints)."""
    task = task_from_json(data)
    grace = task.grace_s if task.grace_s is not None else min(60.0, max_grace_s())
    return OwnCode(task=task, grace_s=grace, checkpoints=checkpoints_folder(task.checkpoints))


def max_grace_s() -> float:
    return max(1.0, min(watchdog_grace_s(), DOWN_TIMEOUT_S) - GRACE_MARGIN_S)


def resolve_own(task: Task) -> OwnCode:
    """The task checked for a launch: code folder present, grace within the watchdog's."""
    if isinstance(task.code, Path) and not task.code.is_dir():
        raise UsageError(f"--code {task.code}: not a folder")
    if task.data is not None and not task.data.is_dir():
        raise UsageError(f"--data {task.data}: not a folder")
    if isinstance(task.code, Path):
        # Before anything is rented: a bad ignore pattern ([z-a]) or an unreadable folder is one line now,
        # not a failed launch after the pod is up.
        code_excludes(task.code, lambda _: None)
    if task.data is not None:
        load_ignore(task.data, DEFAULT_EXCLUDES)
    ceiling = max_grace_s()
    grace = task.grace_s if task.grace_s is not None else min(60.0, ceiling)
    if grace > ceiling:
        raise UsageError(f"--grace {grace:g} s must stay below the watchdog's grace less {GRACE_MARGIN_S:g} s "
                         f"({ceiling:g} s)", hint="raise GPUCLI_WATCHDOG_GRACE_S, or give the job less time")
    ck = checkpoints_folder(task.checkpoints)
    if ck.startswith("/") or ".." in ck.split("/"):
        raise UsageError(f"--checkpoints {ck}: must be a folder inside the code folder")
    return OwnCode(task=task, grace_s=grace, checkpoints=ck)


def task_to_json(task: Task) -> dict[str, Any]:
    """The task for the run record (``gpucli resume``); no values of ``env`` or ``env_from_local``,
    only their names (:mod:`gpucli.runs.secretenv`)."""
    data = dataclasses.asdict(task)
    if isinstance(task.code, GitCode):
        data["code"] = {"git": task.code.url, "ref": task.code.ref}
    else:
        data["code"] = str(task.code.resolve())
    data["data"] = str(task.data.resolve()) if task.data else None
    data["env"] = task_env_names(task.env)
    data["env_from_local"] = list(task.env_from_local)
    data["source"] = str(task.source) if task.source else None
    return data


def task_from_json(data: Mapping[str, Any]) -> Task:
    known = {f.name for f in dataclasses.fields(Task)}
    d = {k: v for k, v in data.items() if k in known}
    code = d.get("code")
    d["code"] = GitCode(code["git"], code.get("ref")) if isinstance(code, Mapping) else Path(code or ".")
    d["data"] = Path(d["data"]) if d.get("data") else None
    d["source"] = Path(d["source"]) if d.get("source") else None
    d["env"] = task_env_from_names(d.get("env") or (), d["source"])
    d["env_from_local"] = tuple(str(n) for n in d.get("env_from_local") or ())
    return Task(**d)


def default_name(task: Task, profile: str) -> str:
    """``<code folder>-<profile>`` in run-name characters."""
    base = task.code.url.rstrip("/").rsplit("/", 1)[-1] if isinstance(task.code, GitCode) \
        else task.code.resolve().name
    slug = re.sub(r"[^a-z0-9-]+", "-", base.lower().removesuffix(".git")).strip("-") or "job"
    return f"{slug[:40]}-{profile}".strip("-")


def job_command(resolved: ResolvedLaunch, own: OwnCode) -> str:
    """The line started on the host from ``wd/code``: jobrun with the task's commands."""
    task = own.task
    args = [resolved.python, "../jobrun.py", "--run-dir", "..", "--cwd", ".", "--cmd", task.run,
            "--grace-s", f"{own.grace_s:g}", "--name", resolved.name, "--checkpoints", own.checkpoints]
    if task.setup:
        args += ["--setup", task.setup]
    if resolved.preflight:
        args += ["--preflight", resolved.preflight, "--preflight-timeout-s", f"{timeout_s():g}"]
    if task.setup or resolved.preflight:
        args += ["--ack-wait-s", f"{ACK_WAIT_S:g}"]
    if task.metrics_regex:
        args += ["--metrics-regex", task.metrics_regex]
    if resolved.limits.price_per_hour_usd:
        args += ["--price-per-hour-usd", f"{resolved.limits.price_per_hour_usd:g}"]
    if resolved.gpu_id is None:
        args += ["--gpus", "0"]  # a CPU profile: the host's GPUs are not this run's
    venv = venv_dir(resolved, task)
    if venv is not None:
        args += ["--venv", venv]
    return " ".join(shlex.quote(a) for a in args)


def venv_dir(resolved: ResolvedLaunch, task: Task) -> str | None:
    """The job's own environment on a local or SSH host: one per code folder (and Python), reused by
    every run of that folder, beside the run folders (``<runs>/.venvs/<hash>``). None on a pod: a
    pod's image Python is the job's, as it is the trainer's."""
    if get_target(resolved.provider).cloud:
        return None
    source = f"{task.code.url}@{task.code.ref or ''}" if isinstance(task.code, GitCode) else str(task.code.resolve())
    digest = hashlib.sha256(f"{source}\0{resolved.python}".encode()).hexdigest()[:16]
    return f"{posixpath.dirname(resolved.workdir.rstrip('/'))}/.venvs/{digest}"


def code_excludes(root: Path, on_event: Callable[[str], None]) -> list[str]:
    """What the code sync leaves out: the defaults (``.git`` among them), the folder's own
    ``.gitignore``, and files over :data:`BIG_FILE_BYTES` (named, so nothing is missed silently)."""
    excludes = list(DEFAULT_EXCLUDES)
    gitignore = root / ".gitignore"
    if gitignore.is_file():
        excludes += gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
    links: list[str] = []
    big = [f for f in walk_local(root, load_ignore(root, excludes), links) if f.size > BIG_FILE_BYTES]
    if links:
        on_event(links_line(links, "code"))
    for f in big:
        on_event(f"leaving {f.rel} ({f.size / 1e6:.0f} MB) out of the code sync: use --data for big files")
        excludes.append("/" + f.rel.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?"))
    return excludes


def git_token() -> str | None:
    return os.environ.get("GPUCLI_GIT_TOKEN") or load_keys().get("git") or None


def clone(host: Host, workdir: str, code: GitCode, on_event: Callable[[str], None]) -> None:
    """Clone (or update) the repo into ``wd/code`` on the host. A token reaches git through a
    credential helper reading the 0600 env file's ``GPUCLI_GIT_TOKEN``: never on a command line."""
    wd = shlex.quote(workdir)
    ref = f" (ref {code.ref})" if code.ref else ""
    on_event(f"cloning {code.url}{ref} on the host")
    helper = ("!f() { echo username=x-access-token; echo \"password=$GPUCLI_GIT_TOKEN\"; }; f")
    git = f"git -c credential.helper= -c {shlex.quote('credential.helper=' + helper)}"
    url = shlex.quote(code.url)
    script = (f"cd {wd} && set -a && . ./env && set +a && "
              f"if [ -d code/.git ]; then {git} -C code fetch --quiet origin; "
              f"else rm -rf code.clone && {git} clone --quiet {url} code.clone && "
              f"cp -a code.clone/. code/ && rm -rf code.clone; fi")
    if code.ref:
        r = shlex.quote(code.ref)
        # a branch at what the remote has now (a local branch of an earlier clone may be behind), else a
        # tag or commit
        script += (f" && (git -C code checkout --quiet --detach origin/{r} 2>/dev/null"
                   f" || git -C code checkout --quiet --detach {r})")
    res = host.run(script, timeout_s=900, check=False)
    if res.exit_code != 0:
        raise GpucliError(f"git clone of {code.url} failed: {(res.stderr or res.stdout).strip()[-300:]}",
                          hint="a private repo needs a token: set GPUCLI_GIT_TOKEN (or `gpucli keys set git`)")


ALERT_SENDERS = {f.name: f.source.removeprefix("trainer/") for f in podfiles.OWN_CODE.files
                 if f.source.startswith("trainer/")}
"""The bundled trainer's alert senders (standard library only) jobrun loads: name on the pod -> file in trainer/."""


def put_code(host: Host, resolved: ResolvedLaunch, own: OwnCode, on_event: Callable[[str], None]) -> None:
    """Upload the runner beside the run folder, then the code (sync or clone)."""
    wd = resolved.workdir
    podfiles.OWN_CODE.write(host, wd)  # with the Telegram and webhook senders jobrun uses
    code = own.task.code
    if isinstance(code, GitCode):
        clone(host, wd, code, on_event)
        return
    on_event(f"syncing the code from {code}")
    stats = host.sync_up(code, f"{wd}/code", excludes=code_excludes(code, on_event))
    on_event(f"code: {stats.files_sent} files sent, {stats.files_skipped} unchanged")


def put_data(host: Host, resolved: ResolvedLaunch, on_event: Callable[[str], None]) -> None:
    """--data for own code: a local folder synced to ``wd/data/src``, or a pod path linked there."""
    wd = resolved.workdir
    source = resolved.data
    if source is not None and source.kind == "local" and source.local is not None:
        on_event(f"syncing data from {source.local}")
        stats = host.sync_up(source.local, f"{wd}/data/src")
        on_event(f"data: {stats.files_sent} files sent, {stats.files_skipped} unchanged")
    elif source is not None and source.kind == "pod" and source.pod_path:
        # already there: GPUCLI_DATA (data/src) links to it, nothing is uploaded
        host.run(f"test -e {shlex.quote(source.pod_path)} && ln -sfn -- {shlex.quote(source.pod_path)} "
                 f"{shlex.quote(wd)}/data/src", timeout_s=60)
    elif source is not None:
        raise UsageError(f"--data {source.spec}: your own code takes a local folder or pod:/path",
                         hint="https:// and hf:// data are fetched and prepared for the bundled trainer; "
                              "download them in your --setup command instead")


def job_env(own: OwnCode, secrets: Mapping[str, str]) -> dict[str, str]:
    """The 0600 env file: the task's env, then the secrets (which win on a clash)."""
    env = dict(own.task.env)
    token = git_token() if isinstance(own.task.code, GitCode) else None
    if token:
        env["GPUCLI_GIT_TOKEN"] = token
    env.update(secrets)
    return env


@dataclass(frozen=True)
class JobState:
    state: str  # running | finished | failed | unknown
    phase: str | None
    reason: str | None
    log_tail: tuple[str, ...]


def job_state(host: Host, workdir: str) -> JobState:
    try:
        data = json.loads(host.read_file(f"{workdir}/status.json"))
    except (GpucliError, OSError, ValueError, RecursionError):
        return JobState("unknown", None, None, ())
    if not isinstance(data, dict):
        return JobState("unknown", None, None, ())
    tail = data.get("log_tail")
    tail = tail[-50:] if isinstance(tail, list) else []

    def text(value: Any) -> str | None:  # the pod's words: a string, bounded, or nothing
        return value[:500] if isinstance(value, str) else None

    return JobState(text(data.get("state")) or "unknown", text(data.get("phase")), text(data.get("reason")),
                    tuple(x[-2000:] for x in tail if isinstance(x, str)))


def wait_for_setup(host: Host, workdir: str, alive: Callable[[], bool], *, timeout_s: float = SETUP_TIMEOUT_S,
                   on_event: Callable[[str], None]) -> None:
    """Poll status.json until the job is past --setup. A failed setup raises with its last lines (the
    launch then records the run failed and releases the pod); so does a runner that died without a
    word, or a setup past ``timeout_s``."""
    on_event("running --setup / --preflight on the host (its output: `gpucli tail`, or the run's train.log)")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = job_state(host, workdir)
        if st.state == "failed":
            try:  # the runner may exit now (and the watchdog end the pod)
                host.write_file(f"{workdir}/.verdict-read", b"", mode=0o644)
            except (GpucliError, OSError):
                pass
            lines = "\n".join(st.log_tail[-10:])
            what = (st.reason or "").removeprefix("setup ")
            raise GpucliError(f"--setup failed ({what or 'no reason given'}); its last lines:\n{lines}")
        if st.state == "finished" or st.phase == "run":
            return
        if not alive():
            st = job_state(host, workdir)
            if st.state in ("finished", "running") and st.phase != "setup":
                return
            raise GpucliError("the job runner ended during --setup without a status",
                              hint="see console.log in the run's folder")
        time.sleep(SETUP_POLL_S)
    raise GpucliError(f"--setup still running after {timeout_s:.0f} s; the launch is ended")


def task_env_from_names(stored: Iterable[object], source: Path | None) -> tuple[tuple[str, str], ...]:
    """A recorded task's ``env`` again (``gpucli resume``): names whose values are read from the task
    file once more. Records of older versions kept ``[name, value]`` pairs; those are taken as they are."""
    entries = list(stored or ())
    pairs = [e for e in entries if isinstance(e, (list, tuple)) and len(e) == 2]
    if len(pairs) == len(entries):
        return tuple((str(p[0]), str(p[1])) for p in pairs)
    names = [str(e) for e in entries]
    if not names:
        return ()
    values: dict[str, str] = {}
    if source is not None and source.is_file():
        values = dict(load_task(source).env)
    missing = [n for n in names if n not in values]
    if missing:
        raise UsageError(f"task env {', '.join(missing)}: the run record keeps names, not values, and "
                         f"{source or 'the task file'} no longer gives them",
                         hint="restore the task file's env: entries, or launch again")
    return tuple((n, values[n]) for n in names)
