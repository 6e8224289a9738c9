"""Carrying out a resolved launch: provision (cloud) -> wait (deadline) -> bootstrap -> sync -> start the
trainer and its watchdog -> record.

Every step reports through an ``on_event`` callback (the CLI renders it); nothing here prints. The
run record is written before anything waits, and the pod id goes into it the moment the provider
returns one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, UsageError
from gpucli.run.launch import ResolvedLaunch
from gpucli.run.records import RunRecord, now_iso, parse_iso

if TYPE_CHECKING:
    from gpucli.run.ownrun import OwnCode
    from gpucli.run.targets import Host, Provisioner
    from gpucli.ssh import SshTarget

EventFn = Callable[[str], None]
POD_SETUP = Path(__file__).resolve().parents[1] / "pod" / "setup_pod.sh"
POD_WATCHDOG = Path(__file__).resolve().parents[1] / "pod" / "watchdog.py"


def trainer_package_dir() -> Path:
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.origin:
        raise GpucliError("the bundled trainer package is not installed", hint="reinstall gpucli")
    return Path(spec.origin).resolve().parent


def secrets_env() -> dict[str, str]:
    """The pod's 0600 env file: Telegram's token and chat id when configured (and the API base a test
    points elsewhere). Nothing else of this machine's environment goes to the pod."""
    from gpucli.settings import load_keys

    keys = load_keys()
    env = {}
    for var, key in (("TELEGRAM_BOT_TOKEN", "telegram"), ("TELEGRAM_CHAT_ID", "telegram-chat")):
        value = os.environ.get(var) or keys.get(key)
        if value:
            env[var] = value
    if os.environ.get("TELEGRAM_API_BASE"):
        env["TELEGRAM_API_BASE"] = os.environ["TELEGRAM_API_BASE"]
    return env


def _step_of(checkpoint: Path) -> int:
    import json

    try:
        return int(json.loads((checkpoint / "meta.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return int(checkpoint.name.rsplit("_", 1)[-1])


def metrics_until(data: bytes, step: int) -> bytes:
    """The metrics rows up to a checkpoint's step: the steps after it are trained again on the new
    pod, so dropping them makes the curve join up instead of repeating a stretch."""
    import json

    keep = []
    for line in data.splitlines(keepends=True):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int) or row["step"] <= step:
            keep.append(line if line.endswith(b"\n") else line + b"\n")
    return b"".join(keep)


def record_for(resolved: ResolvedLaunch) -> RunRecord:
    return RunRecord(
        name=resolved.name, provider=resolved.provider, created_at=now_iso(), profile=resolved.profile,
        phase=resolved.phase, model=resolved.model.name, n_gpus=resolved.n_gpus, gpu=resolved.gpu_id,
        workdir=resolved.workdir, status="provisioning", label=resolved.label, limits=resolved.limits,
        planned=resolved.planned, python=resolved.python)


def start_on_host(host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
                  save: Callable[[RunRecord], Any], restore: Path | None = None,
                  metrics: Path | None = None, own: OwnCode | None = None,
                  node_env: Mapping[str, str] | None = None, watch_args: tuple[str, ...] = ()) -> RunRecord:
    """Bootstrap, sync, write run.yaml and the env file, start the trainer detached.

    ``restore`` (a checkpoint folder on this machine) and ``metrics`` (the run's metrics.jsonl so
    far) are uploaded first when resuming on a new pod: the trainer's ``--resume auto`` continues
    from that checkpoint and appends to the same metrics file. ``own``: the user's own command
    instead of the trainer (:func:`start_own`)."""
    import yaml

    from gpucli.run.requirements import check_trainer_requirements
    from gpucli.run.targets import get_target

    if own is not None:
        return start_own(host, resolved, record, own, on_event=on_event, save=save, restore=restore,
                         metrics=metrics, node_env=node_env, watch_args=watch_args)

    wd = resolved.workdir
    # exec starts in the login directory, so a relative workdir works as it is.
    host.run(f"mkdir -p -- {shlex.quote(wd)}/code {shlex.quote(wd)}/data", timeout_s=60)
    if get_target(resolved.provider).bootstrap:
        on_event("bootstrapping the pod (setup_pod.sh)")
        host.write_file(f"{wd}/setup_pod.sh", POD_SETUP.read_bytes(), mode=0o755)
        res = host.run(f"cd {shlex.quote(wd)} && sh ./setup_pod.sh {shlex.quote(resolved.python)}",
                       timeout_s=900, check=False)
        if res.exit_code != 0:
            raise GpucliError(f"pod bootstrap failed: {(res.stderr or res.stdout).strip()[-300:]}")
    on_event(check_trainer_requirements(host, resolved, pod=get_target(resolved.provider).bootstrap).describe)
    on_event("syncing the trainer code")
    host.sync_up(trainer_package_dir(), f"{wd}/code/trainer", excludes=["__pycache__", "*.pyc"])
    data_env: dict[str, str] = {}
    if resolved.data is not None and resolved.data_plan is not None:
        from gpucli.run.datasources import stage_data

        data_env = stage_data(host, resolved.data, resolved.data_plan, workdir=wd, python=resolved.python,
                              install=get_target(resolved.provider).bootstrap, on_event=on_event)
    if restore is not None:
        on_event(f"restoring checkpoint {restore.name} from this machine")
        host.sync_up(restore, f"{wd}/checkpoints/{restore.name}", excludes=[])
        if metrics is not None and metrics.exists() and not host.exists(f"{wd}/metrics.jsonl"):
            host.write_file(f"{wd}/metrics.jsonl", metrics_until(metrics.read_bytes(), _step_of(restore)),
                            mode=0o644)
    config = run_yaml_now(resolved, record)
    host.write_file(f"{wd}/run.yaml", yaml.safe_dump(config, sort_keys=False).encode(), mode=0o644)
    host.write_env_file(f"{wd}/env", {**secrets_env(), **data_env, **(node_env or {})})
    on_event("starting the trainer")
    pid = host.start_detached(resolved.command, cwd=f"{wd}/code", log_path=f"{wd}/console.log",
                              env_file=f"{wd}/env")
    from gpucli.run.procs import identify

    record = record.with_(status="running", pid=pid, started_at=now_iso(), pid_ident=identify(host, resolved.python, pid))
    save(record)
    on_event(f"trainer started (pid {pid})")
    watchdog_pid = start_watchdog(host, resolved, record, watch_args)
    record = record.with_(watchdog_pid=watchdog_pid, watchdog_ident=identify(host, resolved.python, watchdog_pid))
    save(record)
    on_event(f"watchdog started (pid {watchdog_pid}): ends the run's billing when it is over or stuck")
    return record


def start_own(host: Host, resolved: ResolvedLaunch, record: RunRecord, own: OwnCode, *, on_event: EventFn,
              save: Callable[[RunRecord], Any], restore: Path | None = None,
              metrics: Path | None = None, node_env: Mapping[str, str] | None = None,
              watch_args: tuple[str, ...] = ()) -> RunRecord:
    """The own-code launch: env file (before a clone: it holds the git token), runner and code, data,
    the mirrored checkpoints folder on a resume, then jobrun detached and the watchdog watching its
    process group. A --setup is waited for: when it fails the launch fails with its last lines."""
    from gpucli.run import ownrun
    from gpucli.run.procs import identify
    from gpucli.run.targets import get_target

    wd = resolved.workdir
    q = shlex.quote(wd)
    # status.json of an earlier attempt in the same folder would read as this one's end; a cloud launch
    # is always a new pod (a resume included), where --setup runs again whatever its folder holds.
    stale = f"{q}/status.json {q}/.verdict-read" + (f" {q}/.setup-done" if get_target(resolved.provider).cloud else "")
    host.run(f"mkdir -p -- {q}/code {q}/data && rm -f -- {stale}", timeout_s=60)
    host.write_env_file(f"{wd}/env", {**ownrun.job_env(own, secrets_env()), **(node_env or {})})
    ownrun.put_code(host, resolved, own, on_event)
    source = resolved.data
    if source is not None and source.kind == "local" and source.local is not None:
        on_event(f"syncing data from {source.local}")
        stats = host.sync_up(source.local, f"{wd}/data/src")
        on_event(f"data: {stats.files_sent} files sent, {stats.files_skipped} unchanged")
    elif source is not None and source.kind == "pod" and source.pod_path:
        # already there: GPUCLI_DATA (data/src) links to it, nothing is uploaded
        host.run(f"test -e {shlex.quote(source.pod_path)} && ln -sfn -- {shlex.quote(source.pod_path)} "
                 f"{q}/data/src", timeout_s=60)
    elif source is not None:
        raise UsageError(f"--data {source.spec}: your own code takes a local folder or pod:/path",
                         hint="https:// and hf:// data are fetched and prepared for the bundled trainer; "
                              "download them in your --setup command instead")
    if restore is not None:
        on_event(f"restoring the mirrored {own.checkpoints}/ from this machine")
        host.sync_up(restore, own.checkpoints_dir(wd), excludes=[])
        if metrics is not None and metrics.exists() and not host.exists(f"{wd}/metrics.jsonl"):
            host.write_file(f"{wd}/metrics.jsonl", metrics.read_bytes(), mode=0o644)
    on_event("starting the job")
    pid = host.start_detached(ownrun.job_command(resolved, own), cwd=f"{wd}/code", log_path=f"{wd}/console.log",
                              env_file=f"{wd}/env")
    record = record.with_(status="running", pid=pid, started_at=now_iso(),
                          pid_ident=identify(host, resolved.python, pid))
    save(record)
    on_event(f"job started (pid {pid}): {own.task.run}")
    watchdog_pid = start_watchdog(host, resolved, record, watch_args)
    record = record.with_(watchdog_pid=watchdog_pid, watchdog_ident=identify(host, resolved.python, watchdog_pid))
    save(record)
    on_event(f"watchdog started (pid {watchdog_pid}): ends the run's billing when it is over or stuck")
    if own.task.setup:
        ownrun.wait_for_setup(host, wd, lambda: host.is_running(pid), on_event=on_event)
    return record


def run_yaml_now(resolved: ResolvedLaunch, record: RunRecord) -> dict[str, Any]:
    """run.yaml with the hour and dollar limits reduced by what provisioning and setup already cost:
    the pod has been billing since it was created, the trainer's clock starts now."""
    import copy
    import datetime as dt

    config = copy.deepcopy(dict(resolved.trainer_config))
    created = parse_iso(record.created_at)
    if created is None:
        return config
    spent_h = (dt.datetime.now(dt.timezone.utc) - created).total_seconds() / 3600
    config["limits"] = resolved.limits.remaining(spent_h).run_yaml()
    return config


def start_watchdog(host: Host, resolved: ResolvedLaunch, record: RunRecord, watch_args: tuple[str, ...] = ()) -> int:
    """Start gpucli/pod/watchdog.py next to the trainer, in its own session (see its docstring).
    ``watch_args``: a node's watch of its peers in a run over several machines (gpucli.run.nodes)."""
    from gpucli.settings import watchdog_grace_s, watchdog_poll_s, watchdog_startup_minutes

    wd = resolved.workdir
    from gpucli.run.procs import GONE, PROCID
    from gpucli.run.targets.podside import write_watchdog_env

    host.write_file(f"{wd}/watchdog.py", POD_WATCHDOG.read_bytes(), mode=0o755)
    host.write_file(f"{wd}/procid.py", PROCID.read_bytes(), mode=0o644)  # imported by the watchdog
    created = parse_iso(record.created_at)
    args = [resolved.python, "../watchdog.py", "--run-dir", "..", "--pgid", str(record.pid),
            "--provider", resolved.provider, "--poll-s", f"{watchdog_poll_s():g}",
            "--grace-s", f"{watchdog_grace_s():g}", "--on-end", resolved.on_end, *resolved.limits.watchdog_args()]
    if created is not None:
        args += ["--started-at", f"{created.timestamp():.0f}"]
    if record.pid_ident and record.pid_ident != GONE:
        args += ["--pgid-ident", record.pid_ident]
    args += list(watch_args)
    if watch_args:
        host.write_file(f"{wd}/peers.py", (POD_WATCHDOG.parent / "peers.py").read_bytes(), mode=0o644)
    startup = watchdog_startup_minutes()
    if startup is not None:
        args += ["--startup-minutes", f"{startup:g}"]
    return host.start_detached(" ".join(shlex.quote(a) for a in args), cwd=f"{wd}/code", log_path=f"{wd}/watchdog.out",
                               env_file=write_watchdog_env(host, wd, resolved.provider))


def launch(resolved: ResolvedLaunch, *, on_event: EventFn, save: Callable[[RunRecord], Any],
           ssh: SshTarget | None = None, provision: Provisioner | None = None,
           inputs: Mapping[str, Any] | None = None, record: RunRecord | None = None,
           restore: Path | None = None, metrics: Path | None = None, own: OwnCode | None = None) -> RunRecord:
    """Run the launch sequence. ``provision`` (cloud targets) creates the pod and returns its endpoint;
    it gets ``on_created(instance_id)`` to record the id before it waits. ``record`` continues an
    existing run (a resume); ``restore``/``metrics`` are uploaded before the trainer starts. ``save``
    writes the record (it is called before anything waits)."""
    from gpucli.run.targets import get_target

    if record is None:
        record = record_for(resolved).with_(launch=dict(inputs) if inputs is not None else None)
        if own is not None:
            record = record.with_(model="own-code", phase="own-code")
    else:
        record = record.with_(status="provisioning", pid=None, watchdog_pid=None, ended_at=None, end_reason=None,
                              message=None, ssh=ssh if provision is None else None, limits=resolved.limits)
    save(record)  # written before anything waits
    try:
        if provision is not None:
            def on_created(instance_id: str) -> None:
                nonlocal record
                assert record is not None  # saved above, before anything waits
                record = record.with_(instance_id=instance_id)
                save(record)

            ssh = provision(on_created=on_created, on_event=on_event)
        record = record.with_(ssh=ssh, status="starting")
        save(record)
        with get_target(record.provider).open(record) as host:
            if record.ssh is not None and host.host_key:
                record = record.with_(ssh=dataclasses.replace(record.ssh, host_key=host.host_key))
                save(record)
            return start_on_host(host, resolved, record, on_event=on_event, save=save, restore=restore,
                                 metrics=metrics, own=own)
    except BaseException as exc:
        message = str(exc) if isinstance(exc, GpucliError) else f"{type(exc).__name__}: {exc}"
        save(record.with_(status="failed", ended_at=now_iso(), message=message[:500]))
        raise
