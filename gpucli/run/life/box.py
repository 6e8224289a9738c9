"""A dev box (``gpucli up``): a machine rented (or an SSH host, or this one) with the environment ready and
no job, that ends itself after an idle window. Its record is a run record with ``launch.box`` (so ``ls``,
``status``, ``ssh``, ``ssh-config``, ``forward``, ``exec`` and ``down`` take it as they take a run), and
``gpucli launch --on BOX`` puts jobs on it (gpucli.run.life.warm).

On the machine, gpucli/pod/idlewatch.py is started first, the moment the machine runs commands (a laptop shut
at any later step leaves nothing billing past the idle window or the caps): it ends the box once there has
been no job, no SSH session and no GPU at work for the idle window, or at ``--hours`` / ``--budget``. Then
the environment is set up (setup_pod.sh once per machine), the trainer code synced and the 0600 env file
written, as a launch does before its job starts.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, UsageError
from gpucli.providers.podside import write_watchdog_env
from gpucli.providers.registry import get_target
from gpucli.run.host.procs import identify
from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch
from gpucli.run.life.lifecycle import cleanup_failed, prepare
from gpucli.run.starting import start
from gpucli.run.starting.envstamp import ensure_environment
from gpucli.runs import podfiles
from gpucli.runs import records as runs
from gpucli.runs.launchinputs import BoxInputs
from gpucli.runs.records import RunRecord
from gpucli.settings import watchdog_poll_s

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.registry import Host

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h)?$")


def parse_idle(text: str) -> float:
    """``30m``, ``2h``, ``90s`` or a number of minutes -> minutes (positive)."""
    m = _DURATION.match(text.strip())
    if not m or float(m[1]) <= 0:
        raise UsageError(f"--idle-stop {text!r}: expected a duration like 30m, 2h or 90s")
    return float(m[1]) * {"s": 1 / 60, "m": 1.0, "h": 60.0, None: 1.0}[m[2]]


def ssh_ports(record: RunRecord) -> list[int]:
    """The ports the box's sshd takes sessions on, as seen inside the machine: the endpoint's, and 22 behind a
    cloud provider's port mapping."""
    ports = [record.ssh.port] if record.ssh is not None else []
    if get_target(record.provider).cloud and 22 not in ports:
        ports.append(22)
    return ports


def up(catalog: Catalog, req: LaunchRequest, *, idle_minutes: float, on_step: Callable[[str], None],
       on_notice: Callable[[Any], None]) -> RunRecord:
    """Rent (or reach) the machine, start its idle watch, set up its environment; the box's record."""
    name = req.name or runs.unique_name(f"box-{req.profile.lower()}")
    prepared = prepare(catalog, dataclasses.replace(req, name=name))
    resolved = prepared.resolved
    box = BoxInputs(idle_minutes=idle_minutes, on_end=resolved.on_end)
    record = start.record_for(resolved).with_(phase="box", model="-", launch=prepared.inputs.with_(box=box))
    runs.save(record)  # written before anything waits
    try:
        if prepared.provision is not None:
            def on_created(instance_id: str) -> None:
                nonlocal record
                record = record.with_(instance_id=instance_id)
                runs.save(record)

            ssh = prepared.provision(on_created=on_created, on_event=on_step)
            billed = prepared.provision.billed_usd_per_hour
            if billed:
                record = record.with_(limits=record.limits.with_(price_per_hour_usd=float(billed)))
        else:
            ssh = prepared.ssh
        record = record.with_(ssh=ssh, status="starting")
        runs.save(record)
        with get_target(record.provider).open(record) as host:
            if record.ssh is not None and host.host_key:
                record = record.with_(ssh=dataclasses.replace(record.ssh, host_key=host.host_key))
                runs.save(record)
            record = _ready(host, resolved, record, idle_minutes, on_step)
    except BaseException as exc:
        message = str(exc) if isinstance(exc, GpucliError) else f"{type(exc).__name__}: {exc}"
        runs.save(record.with_(status="failed", ended_at=runs.now_iso(), message=message[:500]))
        cleanup_failed(name, on_notice)
        raise
    finally:
        runs.release_name(name)
    return record


def _ready(host: Host, resolved: ResolvedLaunch, record: RunRecord, idle_minutes: float, on_step: Callable[[str], None]) -> RunRecord:
    wd = resolved.workdir
    host.run(f"mkdir -p -- {shlex.quote(wd)}/code", timeout_s=60)
    podfiles.BOX.write(host, wd)  # idlewatch.py, with the watchdog's code it ends the machine through
    created = runs.parse_iso(record.created_at)
    args = [resolved.python, "../idlewatch.py", "--run-dir", "..", "--machine-dir", "../..",
            "--provider", resolved.provider, "--idle-minutes", f"{idle_minutes:g}", "--on-end", resolved.on_end,
            "--poll-s", f"{min(watchdog_poll_s(), max(1.0, idle_minutes * 60 / 10)):g}"]
    for port in ssh_ports(record):
        args += ["--ssh-port", str(port)]
    limits = resolved.limits
    for flag, value in (("--max-hours", limits.max_hours), ("--budget-usd", limits.budget_usd),
                        ("--price-per-hour-usd", record.price_per_hour_usd)):
        if value is not None:
            args += [flag, f"{value:g}"]
    if created is not None:
        args += ["--started-at", f"{created.timestamp():.0f}"]
    pid = host.start_detached(" ".join(shlex.quote(a) for a in args), cwd=f"{wd}/code", log_path=f"{wd}/watchdog.out",
                              env_file=write_watchdog_env(host, wd, resolved.provider))
    record = record.with_(watchdog_pid=pid, watchdog_ident=identify(host, resolved.python, pid))
    runs.save(record)
    on_step(f"idle watch started (pid {pid}): ends the box after {idle_minutes:g} min with no job, no SSH "
            "session and idle GPUs" + (", or at its cap" if limits.max_hours or limits.budget_usd else ""))
    if get_target(resolved.provider).bootstrap:
        env = ensure_environment(host, wd, resolved.python, on_step)
        record = record.with_(python=env.python, env_build_s=env.seconds)
        runs.save(record)
    on_step("syncing the trainer code")
    host.sync_up(podfiles.TRAINER.source(), f"{wd}/{podfiles.TRAINER.name}", excludes=list(podfiles.TRAINER.excludes))
    host.write_env_file(f"{wd}/env", start.secrets_env(resolved.env_names))
    record = record.with_(status="running", started_at=runs.now_iso())
    runs.save(record)
    return record

