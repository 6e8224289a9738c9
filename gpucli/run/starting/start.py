"""What every job gets on its host when it starts, whatever its kind (:mod:`gpucli.run.starting.jobs`): the env
file's secrets, the process started detached and recorded (:func:`start_job`), the watchdog beside it,
the run.yaml limits less what provisioning and setup cost, the metrics cut back on a resume.

Every step reports through an ``on_event`` callback (the CLI renders it); nothing here prints. The
run record is written before anything waits, and the pod id goes into it the moment the provider
returns one.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError
from gpucli.providers.podside import write_watchdog_env
from gpucli.run.files.checkpoints import checkpoint_step
from gpucli.run.host.owner import handover_path, marker_path, this_launcher
from gpucli.run.host.procs import identify
from gpucli.run.inputs.launch import ResolvedLaunch
from gpucli.run.watch.gpuwatch import start_sampler
from gpucli.runs import podfiles
from gpucli.runs.records import RunRecord, RunState, now_iso, parse_iso
from gpucli.runs.runid import claim_command, new_run_id
from gpucli.runs.secretenv import resolve
from gpucli.settings import (
    load_keys,
    watchdog_grace_s,
    watchdog_launch_minutes,
    watchdog_poll_s,
    watchdog_startup_minutes,
)
from trainer.spec.metricsrow import parse_line

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

EventFn = Callable[[str], None]
POD_SETUP = podfiles.ENVIRONMENT.file("setup_pod.sh").path
POD_WATCHDOG = podfiles.WATCHDOG.file("watchdog.py").path
trainer_package_dir = podfiles.trainer_package_dir


def secrets_env(names: tuple[str, ...] = ()) -> dict[str, str]:
    """The pod's 0600 env file: Telegram's token and chat id when configured (and the API base a test
    points elsewhere), and the secrets asked for by name (``--env``, ``env_from_local``: see
    :mod:`gpucli.runs.secretenv`). Nothing else of this machine's environment goes to the pod."""
    keys = load_keys()
    env = {}
    for var, key in (("TELEGRAM_BOT_TOKEN", "telegram"), ("TELEGRAM_CHAT_ID", "telegram-chat")):
        value = os.environ.get(var) or keys.get(key)
        if value:
            env[var] = value
    hook = os.environ.get("GPUCLI_WEBHOOK_URL") or keys.get("webhook")
    if hook:
        env["GPUCLI_WEBHOOK_URL"] = hook
    if os.environ.get("TELEGRAM_API_BASE"):
        env["TELEGRAM_API_BASE"] = os.environ["TELEGRAM_API_BASE"]
    if names:
        env.update(resolve(names))
    return env


def step_of(checkpoint: Path) -> int:
    """The step of a checkpoint folder on this machine: its meta.json, else its ``step_N`` name."""
    step = checkpoint_step(checkpoint)
    return step if step is not None else int(checkpoint.name.rsplit("_", 1)[-1])


def metrics_until(data: bytes, step: int) -> bytes:
    """The metrics rows up to a checkpoint's step, without the old pod's ``finished`` event: the steps
    after it are trained again on the new pod, so dropping them makes the curve join up instead of
    repeating a stretch."""
    keep = []
    for line in data.splitlines(keepends=True):
        row = parse_line(line)
        if row is None:
            continue  # not a row (torn, malformed): nothing a reader would read
        if row.step is None or row.step <= step:
            keep.append(line if line.endswith(b"\n") else line + b"\n")
    return b"".join(keep)


def record_for(resolved: ResolvedLaunch) -> RunRecord:
    return RunRecord(launcher=this_launcher(),
        name=resolved.name, provider=resolved.provider, created_at=now_iso(), profile=resolved.profile,
        phase=resolved.phase, model=resolved.model.name, n_gpus=resolved.n_gpus, gpu=resolved.gpu_id,
        workdir=resolved.workdir, status=RunState.PROVISIONING, label=resolved.label, limits=resolved.limits,
        planned=resolved.planned, python=resolved.python, run_id=new_run_id())


def start_job(host: Host, resolved: ResolvedLaunch, record: RunRecord, command: str, *, what: str, on_event: EventFn,
              save: Callable[[RunRecord], Any], detail: str = "") -> RunRecord:
    """The end of every job's start (:meth:`gpucli.run.starting.jobs.base.Job.start`): ``command`` started detached
    from ``wd/code`` with the 0600 env file, its pid and identity recorded the moment it runs, then the
    watchdog that ends the billing beside it. ``what`` names it in the progress lines."""
    wd = resolved.workdir
    on_event(f"starting the {what}")
    pid = host.start_detached(command, cwd=f"{wd}/code", log_path=f"{wd}/console.log", env_file=f"{wd}/env")
    record = record.with_(status="running", pid=pid, started_at=now_iso(), pid_ident=identify(host, resolved.python, pid))
    hand_over(host, wd, record)
    save(record)
    _start_gpu_sampler(host, resolved, pid, on_event)
    on_event(f"{what} started (pid {pid}){detail}; the watchdog (pid {record.watchdog_pid}) ends the run's "
             "billing when it is over or stuck")
    return record


def _start_gpu_sampler(host: Host, resolved: ResolvedLaunch, pid: int, on_event: EventFn) -> None:
    """nvidia-smi samples beside the job (gpucli.run.watch.gpuwatch); a failure to start it is a notice only."""
    try:
        sampler = start_sampler(host, resolved, pid)
    except GpucliError as exc:
        on_event(f"GPU sampler not started ({exc}); status shows no GPU use")
        return
    if sampler is not None:
        on_event(f"GPU sampler started (pid {sampler}): status and tail show GPU use")


def run_yaml_now(resolved: ResolvedLaunch, record: RunRecord) -> dict[str, Any]:
    """run.yaml with the hour and dollar limits reduced by what provisioning and setup already cost:
    the pod has been billing since it was created, the trainer's clock starts now."""
    config = copy.deepcopy(dict(resolved.trainer_config))
    created = parse_iso(record.created_at)
    if created is None:
        return config
    spent_h = (dt.datetime.now(dt.timezone.utc) - created).total_seconds() / 3600
    config["limits"] = resolved.limits.remaining(spent_h).run_yaml()
    return config


def watch_from_now(host: Host, resolved: ResolvedLaunch, record: RunRecord, *, save: Callable[[RunRecord], Any],
                   on_event: EventFn, watch_args: tuple[str, ...] = ()) -> RunRecord:
    """Start the watchdog as soon as the host runs commands, before anything is set up: until the
    launch hands it the trainer (:func:`hand_over`) it ends the pod at the run's hour or dollar cap,
    or when the launch shows no sign of life (a SIGKILLed laptop process never hands over).
    ``watch_args``: a node's watch of its peers in a run over several machines (gpucli.run.host.nodes)."""
    wd = resolved.workdir
    if record.run_id:  # the folder is this run's before anything is written in it (gpucli/runs/runid.py)
        res = host.run(claim_command(wd, record.run_id, time.strftime("%Y%m%d-%H%M%S")), timeout_s=60)
        moved = next((ln[6:] for ln in res.stdout.splitlines() if ln.startswith("MOVED ")), None)
        if moved:
            on_event(f"the host had a folder of an earlier run named {record.name}: moved aside to {moved}")
    host.run(f"mkdir -p -- {shlex.quote(wd)}/code && rm -f -- {shlex.quote(handover_path(wd))} "
             f"&& touch -- {shlex.quote(marker_path(wd))}", timeout_s=60)
    watchdog_pid = start_watchdog(host, resolved, record, watch_args)
    record = record.with_(watchdog_pid=watchdog_pid, watchdog_ident=identify(host, resolved.python, watchdog_pid))
    save(record)
    on_event(f"watchdog started (pid {watchdog_pid}): ends the pod at the run's limits, or if this launch dies")
    return record


#: At most one touch of the launch's marker a minute: the watchdog's silence window is an hour, and each
#: touch is a round trip the launch (and the pod's bill) waits for.
BEAT_S = 60.0


def heartbeat(host: Host, workdir: str) -> Callable[[], None]:
    """Touch the launch's marker on the host, at most once every :data:`BEAT_S`: the early watchdog's
    sign that the launch is alive (its errors are left to the step that follows)."""
    marker = shlex.quote(marker_path(workdir))
    last = [time.monotonic()]  # watch_from_now has just touched it

    def beat() -> None:
        if time.monotonic() - last[0] >= BEAT_S:
            last[0] = time.monotonic()
            try:
                host.run(f"touch -- {marker}", timeout_s=30, check=False)
            except GpucliError:
                pass  # the step that follows says what is wrong with the host

    return beat


def touching(host: Host, workdir: str, on_event: EventFn, beat: Callable[[], None] | None = None) -> EventFn:
    """``on_event`` that also touches the launch's marker on the host (:func:`heartbeat`)."""
    beat = beat or heartbeat(host, workdir)

    def event(text: str) -> None:
        beat()
        on_event(text)

    return event


class Beating:
    """The host as a starting job sees it: each upload's progress is also a heartbeat, so an upload longer
    than the watchdog's silence window (one big file adds no new entry to the folders it watches for an
    hour) is never taken for a dead launch. Everything else is the host's own."""

    def __init__(self, host: Host, beat: Callable[[], None]) -> None:
        self._host, self._beat = host, beat

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    def sync_up(self, local_dir: Any, remote_dir: str, **kw: Any) -> Any:
        given = kw.pop("progress", None)

        def progress(p: Any) -> None:
            self._beat()
            if given is not None:
                given(p)

        return self._host.sync_up(local_dir, remote_dir, progress=progress, **kw)


def hand_over(host: Host, workdir: str, record: RunRecord) -> None:
    """Give the started trainer (its process group and identity) to the watchdog waiting for it."""
    host.write_file(handover_path(workdir), f"{record.pid} {record.pid_ident or ''}\n".encode(), mode=0o644)


def abandon(host: Host, workdir: str) -> None:
    """A failed launch tells the watchdog waiting for its trainer that none will come (best effort:
    without it the watchdog still ends the pod once the launch is silent)."""
    try:
        host.run(f"test -e {shlex.quote(handover_path(workdir))} || "
                 f"echo abandoned > {shlex.quote(handover_path(workdir))}", timeout_s=15, check=False)
    except Exception:  # noqa: BLE001 - the launch's own error is the one to report
        pass


def start_watchdog(host: Host, resolved: ResolvedLaunch, record: RunRecord, watch_args: tuple[str, ...] = ()) -> int:
    """Start gpucli/pod/watchdog.py in its own session (see its docstring), waiting for the trainer's
    process group in ``.trainer`` (:func:`hand_over`)."""
    wd = resolved.workdir
    podfiles.WATCHDOG.write(host, wd)  # watchdog.py and the procid.py it loads
    created = parse_iso(record.created_at)
    args = [resolved.python, "../watchdog.py", "--run-dir", "..", "--pgid-file", "../.trainer",
            "--provider", resolved.provider, "--poll-s", f"{watchdog_poll_s():g}",
            "--grace-s", f"{watchdog_grace_s():g}", "--on-end", resolved.on_end, *resolved.limits.watchdog_args()]
    if resolved.planned.tokens_per_s and not resolved.own_code:  # the slow check's yardstick (slowrun.py)
        args += ["--planned-tokens-per-s", f"{resolved.planned.tokens_per_s:.6g}"]
    if created is not None:
        args += ["--started-at", f"{created.timestamp():.0f}"]
    args += list(watch_args)
    if watch_args:
        podfiles.PEERS.write(host, wd)
    startup = watchdog_startup_minutes()
    if startup is not None:
        args += ["--startup-minutes", f"{startup:g}"]
    silence = watchdog_launch_minutes()
    if silence is not None:
        args += ["--launch-minutes", f"{silence:g}"]
    # rank 0 of a RunPod Instant Cluster ends the whole cluster (gpucli/pod/watchdog.py pod_calls)
    rank0 = not watch_args or "--node-rank" not in watch_args or \
        watch_args[list(watch_args).index("--node-rank") + 1] == "0"
    cluster = record.inputs.cluster_id if rank0 else None  # its nodes run as "ssh" hosts
    return host.start_detached(" ".join(shlex.quote(a) for a in args), cwd=f"{wd}/code", log_path=f"{wd}/watchdog.out",
                               env_file=write_watchdog_env(host, wd, resolved.provider, cluster or None))
