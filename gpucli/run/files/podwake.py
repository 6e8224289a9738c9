"""Reading a run whose pod was kept stopped (issue 41 rule 6): start it, read it, stop it again.

``--on-end stop`` (and a cap or a stall ending a run so) keeps the pod's disk, and with it the run's
checkpoints, while the GPU no longer bills. ``fetch-best`` and ``mirror`` read that disk over SSH, so
they start the pod (RunPod ``POST /v2/pods/{id}/action {"action": "start"}``, api-reference-v2
openapi.json podAction; vast ``PUT /api/v0/instances/{id}/ {"state": "running"}``, manage_instance.yaml
and vast-cli start_instance), wait with a deadline for SSH, read, and stop it again (RunPod ``stop``,
vast ``{"state": "stopped"}``): also when the read fails or is interrupted (Ctrl-C; gpucli turns
SIGTERM and SIGHUP into the same interrupt, gpucli/cli/app.py). It is never terminated here.

Why a start for reading never resumes the run nor stops again at once: the container's start command
runs at every start (vast onstart, "/root/onstart.sh runs automatically on container startup",
vast-ai/docs guides/reference/faq/instances.mdx; RunPod create ``args``, pods/templates/manage-templates.mdx
L27). It runs the boot guard and the run's ``resume.sh`` (gpucli/providers/bootguard.py,
gpucli/run/inputs/resumescript.py). ``resume.sh`` reads the run folder: a run that is over there (status.json
finished or failed not by a signal, or the watchdog's ``watchdog.json`` "ending"/"done", written before
its stop call) starts nothing and leaves the pod up; the boot guard then stops the pod after its window
unless a reader touches ``.hold`` in the run folder. So this module touches ``.hold`` from a second SSH
connection while it reads (each touch another window), and stops the pod itself when done; if this
process dies (SIGKILL, a closed laptop), the guard stops the pod one window after the last touch.

A pod stopped while its run was *not* over (an outbid vast instance, a pod RunPod stopped at a $0
balance, a stop from the provider's console) has no such end in its folder, and this side cannot tell
it from a finished run whose record was not read since (both are a stopped pod). There a start resumes
the run, as the provider's own start would; the read says so and stops the pod again all the same (the
trainer's emergency checkpoint is kept on the disk): ``gpucli resume`` is the way to continue it.
"""

from __future__ import annotations

import dataclasses
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, ProviderError
from gpucli.providers.api import Instance, InstanceNotFound, InstanceState, Provider
from gpucli.providers.bootguard import HOLD, window_s
from gpucli.providers.registry import get_target, open_host
from gpucli.run.inputs.resumescript import OVER_CHECK
from gpucli.runs import records as runs
from gpucli.runs.defaults import DEFAULTS
from gpucli.runs.endedby import ended_by_in
from gpucli.runs.records import RunRecord
from gpucli.settings import provider_poll_s

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

EventFn = Callable[[str], None]
STOPPED = (InstanceState.STOPPED, InstanceState.EXITED)
STOP_WAIT_S = 180.0  # until the provider reports the pod stopped again
SSH_TRIES_S = 5.0  # between SSH attempts once the provider says the pod runs (sshd may still be starting)


def _quiet(_: str) -> None:
    return None


def _client(record: RunRecord) -> Provider:
    return get_target(record.provider).client()  # type: ignore[attr-defined, no-any-return]  # every cloud target has one


def _stopped_pod(record: RunRecord) -> Instance | None:
    """The run's pod when its provider can start it again and reports it stopped; else None."""
    target = get_target(record.provider)
    if not target.cloud or not target.caps.stop_supported or not record.instance_id:
        return None
    try:
        inst = _client(record).get(record.instance_id)
    except InstanceNotFound:
        return None  # gone: the read fails its own way (or takes the store)
    return inst if inst.state in STOPPED else None


def _endpoint(record: RunRecord, inst: Instance) -> RunRecord:
    """The record with the started pod's SSH endpoint: the recorded one while the provider still offers it,
    else the provider's first route (a restart may publish a new port). The pinned host key stays."""
    if record.ssh is None:
        return record
    routes = inst.routes()
    if not routes or any((r.host, r.port) == (record.ssh.host, record.ssh.port) for r in routes):
        return record
    return record.with_(ssh=dataclasses.replace(record.ssh, host=routes[0].host, port=routes[0].port))


def _wait_running(record: RunRecord, deadline: float, on_event: EventFn) -> Instance:
    client = _client(record)
    pod = record.instance_id or ""
    seen_running = False
    while True:
        inst = client.get(pod)
        if inst.ssh_ready:
            return inst
        if inst.state is InstanceState.RUNNING and not seen_running:
            seen_running = True
            on_event(f"pod {pod} runs; waiting for its SSH endpoint")
        if inst.state in (InstanceState.TERMINATED, InstanceState.FAILED):
            raise ProviderError(f"pod {pod} did not start: {inst.raw_status}")
        if time.monotonic() >= deadline:
            raise ProviderError(f"pod {pod} did not start within the deadline ({inst.raw_status})")
        time.sleep(provider_poll_s())


def _connect(record: RunRecord, deadline: float) -> Host:
    """SSH to the started pod, again until ``deadline`` while its sshd comes up."""
    while True:
        try:
            return open_host(record)
        except GpucliError:
            if time.monotonic() + SSH_TRIES_S >= deadline:
                raise
            time.sleep(SSH_TRIES_S)


def _holding(record: RunRecord, every_s: float, done: threading.Event) -> threading.Thread:
    """Touch ``.hold`` in the run folder every ``every_s`` from a connection of its own until ``done``:
    the boot guard started with the pod keeps it up while the read goes on."""
    hold = shlex.quote(f"{record.workdir}/{HOLD}")

    def loop() -> None:
        while not done.is_set():
            try:
                with open_host(record) as host:
                    while not done.wait(every_s):
                        host.run(f"touch -- {hold}", timeout_s=30, check=False)
            except Exception:  # noqa: BLE001 - a lost connection: connect again; the read reports its own errors
                done.wait(min(every_s, 5.0))

    thread = threading.Thread(target=loop, name=f"hold-{record.name}", daemon=True)
    thread.start()
    return thread


def _stop_again(record: RunRecord, on_event: EventFn) -> str | None:
    """Stop the pod (never terminate it) and wait until its provider says it is stopped. Returns what
    went wrong, or None."""
    client = _client(record)
    pod = record.instance_id or ""
    deadline = time.monotonic() + STOP_WAIT_S
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            client.stop(pod)
            if client.get(pod).state in STOPPED:
                on_event(f"pod {pod} stopped again (its disk keeps the checkpoints)")
                return None
            last = "the provider does not report it stopped yet"
        except InstanceNotFound:
            return f"pod {pod} is gone"
        except GpucliError as exc:
            last = exc.message
        time.sleep(provider_poll_s())
    return last


@contextmanager
def reading(record: RunRecord, *, on_event: EventFn = _quiet, on_warn: EventFn | None = None,
            ready_timeout_s: float | None = None) -> Iterator[Host]:
    """A connected host for reading the run: :func:`open_host` for a pod that runs, and for a pod kept
    stopped the start-read-stop of the module docstring, saying what it does and what the start costs."""
    inst = _stopped_pod(record)
    if inst is None:
        with open_host(record) as host:
            yield host
        return
    warn = on_warn or on_event
    pod = record.instance_id
    price = record.limits.price_per_hour_usd or inst.price_per_hour_usd
    cost = f"${price:.3f}/h while it runs" if price else "its hourly price while it runs"
    on_event(f"pod {pod} is stopped: starting it to read the run ({cost}); it is stopped again afterwards, "
             "never terminated")
    timeout = float(ready_timeout_s or DEFAULTS.ready_timeout_s)
    done = threading.Event()
    holder: threading.Thread | None = None
    failed = True
    try:
        started = _client(record).start(pod or "")
        deadline = time.monotonic() + timeout
        inst = started if started is not None and started.ssh_ready else _wait_running(record, deadline, on_event)
        moved = _endpoint(record, inst)
        if moved is not record:
            record = moved
            runs.save(record)  # the endpoint the pod answers on now
        with _connect(record, deadline) as host:
            host.run(f"touch -- {shlex.quote(f'{record.workdir}/{HOLD}')}", timeout_s=30, check=False)
            holder = _holding(record, max(1.0, min(60.0, window_s(timeout) / 5)), done)
            on_event(f"pod {pod} answers SSH")
            try:  # which path stopped the pod, as its watchdog wrote it: into the record (gpucli/runs/endedby.py)
                ended_by = ended_by_in(host.read_from(f"{record.workdir}/watchdog.json", 0, 64 << 10)[0])
            except (GpucliError, OSError):
                ended_by = None
            if ended_by is not None and ended_by != record.ended_by:
                record = record.with_(ended_by=ended_by)
                runs.save(record)
            over = host.run(f"{shlex.quote(record.python)} -c {shlex.quote(OVER_CHECK)} "
                            f"{shlex.quote(record.workdir)}", timeout_s=30, check=False)
            if over.stdout.strip() == "0":
                warn(f"run {record.name} was not over on pod {pod}: its start resumed it there (as the "
                     "provider's own start would); the pod is stopped again after the read "
                     f"(`gpucli resume {record.name}` continues the run)")
            yield host
        failed = False
    finally:
        done.set()
        if holder is not None:
            holder.join(timeout=35)
        problem = _stop_again(record, on_event)
        if problem is not None:
            line = (f"pod {pod} could NOT be stopped again ({problem}): it bills {cost.split(' while')[0]}; its "
                    f"boot guard stops it after its window; stop it sooner in the provider's console")
            if failed:
                warn(line)  # the read's own error is the one raised
            else:
                raise ProviderError(line)
