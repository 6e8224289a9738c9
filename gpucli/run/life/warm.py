"""``gpucli launch --on RUN``: the next run on a machine a run already has (live, or finished with its machine
kept: every local and SSH host, a cloud pod still up, a dev box). Nothing is rented; the new run has its own
record, folder (beside RUN's), caps and watchdog. What the machine already holds is reused:

- the environment: the trainer's pinned venv on the machine is reused by its pin hash (gpucli.run.starting.envstamp);
- the code: RUN's synced code is copied into the new folder on the machine first (``cp -a`` keeps the
  mtimes), so the sync sends only the files changed here since;
- the data: a ``--data`` folder the same way, and the prepared tokens by content hash: RUN's prepared data is
  adopted into the machine's cache under the key ``fetch.py`` gives the raw files and the prepare options, so
  the new run reuses it when its inputs hash the same and prepares afresh when they do not; the demo corpus
  when run.yaml's ``data`` section is the same.

The machine is billed once: the runs on it record which machine they share (``launch.on``), and
``ls`` counts the machine's cost once (gpucli.runs.machines). A machine that is gone or busy (a job of one
of its runs still running there) is refused in one line before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from gpucli.errors import GpucliError, UsageError
from gpucli.providers.registry import get_target, open_host
from gpucli.run.host.nodes import as_run, node_workdir
from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch, check_disk, resolve
from gpucli.run.life.lifecycle import PreparedLaunch, cleanup_failed
from gpucli.run.starting import start
from gpucli.run.starting.jobs import job_for
from gpucli.run.starting.multinode import start_nodes
from gpucli.run.watch.monitor import trainer_alive
from gpucli.runs import podfiles
from gpucli.runs import records as runs
from gpucli.runs.launchinputs import OnMachine
from gpucli.runs.machines import is_box, machine_root
from gpucli.runs.notice import Notice
from gpucli.runs.records import RunRecord
from gpucli.runs.secretenv import resolve as secrets_present

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.registry import Host
    from gpucli.runs.task import Task

CACHE = ".gpucli-data"  # beside the run folders on the machine: prepared data by content hash


@dataclass(frozen=True)
class Machine:
    """The machine a run has, as a next run on it sees it."""

    base: RunRecord  # the run named with --on
    root: str  # the run that rented (or first used) the machine: its bill is the machine's
    box: bool  # a dev box (gpucli up): its own idle watch ends it, not the runs' watchdogs

    @property
    def provider(self) -> str:
        return self.base.provider

    @property
    def folder(self) -> str:
        """Where the machine's run folders are."""
        return posixpath.dirname(self.base.workdir.rstrip("/")) or "."

    @property
    def nodes(self) -> int:
        """The machines the base run had: one, or its nodes (local node agents, your own SSH hosts)."""
        return 1 + len(self.base.nodes)

    @property
    def hosts(self) -> list[str]:
        """``user@host[:port]`` of every node, rank 0 first (SSH only)."""
        if not get_target(self.provider).caps.endpoint_given:
            return []
        targets = [self.base.ssh, *(n.ssh for n in self.base.nodes)]
        return [f"{t.user}@{t.host}" + (f":{t.port}" if t.port != 22 else "") for t in targets if t is not None]

    @property
    def identity(self) -> str | None:
        return self.base.ssh.identity_file if self.base.ssh is not None and get_target(self.provider).caps.endpoint_given \
            else None

    @property
    def profile(self) -> str:
        return self.base.profile


def machine(on: str) -> Machine:
    """The machine of run ``on`` (its name), read from the records only."""
    base = runs.resolve(on)
    if base.nodes and get_target(base.provider).cloud:
        raise UsageError(f"run {base.name} ran on a rented group of {1 + len(base.nodes)} machines; --on takes "
                         "one machine, or the nodes of a run on this machine or your own SSH hosts",
                         hint="launch on several rented machines with --nodes")
    if not get_target(base.provider).caps.this_machine and base.ssh is None:
        raise UsageError(f"run {base.name} never reached a machine (it has no SSH endpoint)",
                         hint="launch without --on")
    root = machine_root(base)
    try:
        rooted = runs.load(root)
    except GpucliError:
        rooted = base
    return Machine(base=base, root=root, box=is_box(rooted))


def sharing(root: str) -> list[RunRecord]:
    """Every run on the machine ``root`` rented, itself first."""
    return sorted((r for r in runs.list_runs() if machine_root(r) == root),
                  key=lambda r: (r.name != root, r.created_at))


def check_free(m: Machine, host: Host, *, wait_s: float = 0.0) -> None:
    """A UsageError when a job of one of the machine's runs is still running there, or a launch on it is
    under way (after waiting up to ``wait_s`` for it to end)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _check_free(m, host)
        except UsageError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(2.0)


def _check_free(m: Machine, host: Host) -> None:
    for r in sharing(m.root):
        if r.status in ("provisioning", "starting") and not is_box(r):
            raise UsageError(f"the machine of {m.base.name} is busy: run {r.name} is being launched there",
                             hint=f"wait for it, or `gpucli down {r.name}`")
        if r.pid and trainer_alive(host, r):
            raise UsageError(f"the machine of {m.base.name} is busy: run {r.name} is still running there",
                             hint=f"wait for it to end, or `gpucli down {r.name}` first")


def open_machine(m: Machine) -> Host:
    """The machine, connected; a UsageError (one line) when it is gone."""
    target = get_target(m.provider)
    if target.cloud and m.base.instance_id:
        try:
            state = target.pod_state(m.base)
        except GpucliError as exc:
            raise UsageError(f"cannot tell whether the machine of {m.base.name} is there: {exc}") from None
        if state is None or state.over or state.state != "running":
            what = state.describe if state is not None else "no pod"
            raise UsageError(f"the machine of {m.base.name} is gone or stopped ({what})",
                             hint="launch without --on to rent a new one (or `gpucli up` a box that stays)")
    try:
        return open_host(m.base, connect_timeout_s=20)
    except GpucliError as exc:
        raise UsageError(f"the machine of {m.base.name} cannot be reached: {exc}",
                         hint="launch without --on to rent a new one") from None


def prepare_on(catalog: Catalog, req: LaunchRequest, m: Machine, *, task: Task | None = None) -> PreparedLaunch:
    """The launch checked and resolved for the machine ``m``: its provider and endpoint, its price (the
    machine's, so caps and costs match its bill), a folder beside the base run's; nothing searched or rented."""
    if req.provider != m.provider:
        raise UsageError(f"--on {m.base.name}: that machine is {m.provider}'s, not {req.provider}'s")
    if req.nodes not in (1, m.nodes) or req.volume:
        raise UsageError(f"--on runs on the {'one machine' if m.nodes == 1 else f'{m.nodes} nodes'} "
                         f"{m.base.name} had: another --nodes and --volume are for a new rental")
    # every node the run had (one, or several), ranks as before
    req = dataclasses.replace(req, nodes=m.nodes, hosts=tuple(m.hosts) if len(m.hosts) > 1 else req.hosts)
    job = job_for(task)
    secrets_present(req.env_names + job.secret_names())
    price = req.limits.price_per_hour_usd or m.base.limits.price_per_hour_usd
    asked = dataclasses.replace(req, python=req.python or m.base.python,
                                limits=req.limits.with_(price_per_hour_usd=price)).checked()
    name = runs.reserve_name(asked.name, exact=True) if asked.name else runs.reserve_name(
        job.default_name(m.profile, asked.model or m.base.model, asked.phase))
    try:
        workdir = asked.workdir or posixpath.join(m.folder, name)
        want = dataclasses.replace(job.request(asked), workdir=workdir)
        resolved = resolve(catalog, want, run_name=name)
        if job.checks_disk and get_target(m.provider).caps.this_machine:
            check_disk(resolved)
        if m.box:  # the box's idle watch ends the machine; this run's watchdog only ends the run
            resolved = dataclasses.replace(resolved, on_end="keep")
        if resolved.data_plan is not None:  # prepared data by content hash, in the machine's cache
            resolved = dataclasses.replace(resolved, data_plan={**resolved.data_plan,
                                                                "cache_root": posixpath.join(m.folder, CACHE)})
        resolved = job.resolved(resolved, catalog, asked)
    except BaseException:
        runs.release_name(name)
        raise
    return PreparedLaunch(asked, resolved, None, m.base.ssh, job)


def launch_on(prepared: PreparedLaunch, m: Machine, *, on_step: Callable[[str], None],
              on_notice: Callable[[Any], None], wait_free_s: float = 0.0) -> RunRecord:
    """Start the prepared run on the machine (on every node a run over several had, ranks as before):
    checked free, what it holds copied in, then the launch sequence without its rental
    (gpucli.run.starting.multinode: the run's own watchdog first, the job handed to it). ``wait_free_s``: how long
    a machine still busy with a job that is ending is waited for (a sweep's next trial)."""
    resolved = prepared.resolved
    inputs = prepared.inputs.with_(on=OnMachine(machine=m.root, after=m.base.name))
    try:
        with open_machine(m) as host:
            check_free(m, host, wait_s=wait_free_s)
            seed(host, m, resolved, prepared.request, on_step)
        _seed_nodes(m, resolved, on_step)
        record = prepared.job.labelled(start.record_for(resolved).with_(
            launch=inputs, instance_id=None if m.box else m.base.instance_id,
            previous_instances=()))
        return start_nodes(prepared, on_step=on_step, on_warn=lambda t: on_notice(Notice("warn", t)),
                           on_info=lambda t: on_notice(Notice("info", t)), resume=record)
    except BaseException:
        if m.box or not get_target(m.provider).cloud:
            pass  # the machine is the box's or nobody's to end: a failed run leaves it as it was
        else:
            cleanup_failed(resolved.name, on_notice)
        raise
    finally:
        runs.release_name(resolved.name)


def _seed_nodes(m: Machine, resolved: ResolvedLaunch, on_step: Callable[[str], None]) -> None:
    """The base run's other nodes (none on one machine): each node's folder beside the base run's node
    folder there, its code copied; node 0 is seeded as one machine is."""
    for node in m.base.nodes:
        src, dst = as_run(m.base, node).workdir.rstrip("/"), node_workdir(resolved.workdir, node.rank)
        with open_host(as_run(m.base, node), connect_timeout_s=20) as host:
            if host.exists(dst):
                raise UsageError(f"{dst} already exists on node {node.rank}", hint="pick another --name")
            host.run(f"mkdir -p -- {shlex.quote(dst)}", timeout_s=60)
            if host.exists(f"{src}/code"):
                host.run(f"cp -a -- {shlex.quote(src)}/code {shlex.quote(dst)}/code", timeout_s=600)
                on_step(f"node {node.rank}: code copied from {m.base.name}'s folder there")


def _same_data(base: RunRecord, req: LaunchRequest) -> bool:
    asked = base.inputs.requested.get("data")
    return (asked or None) == (req.data or None)


def seed(host: Host, m: Machine, resolved: ResolvedLaunch, req: LaunchRequest, on_step: Callable[[str], None]) -> None:
    """Copy into the new run's folder what the base run's folder holds and the new run would send again:
    its code (the sync then sends only what changed), its synced --data, and its prepared data where it is
    known to be the same (by content hash, or an equal demo data section)."""
    src, dst = m.base.workdir.rstrip("/"), resolved.workdir.rstrip("/")
    qs, qd = shlex.quote(src), shlex.quote(dst)
    if host.exists(dst):
        raise UsageError(f"{dst} already exists on the machine", hint="pick another --name")
    host.run(f"mkdir -p -- {qd}/data", timeout_s=60)
    if host.exists(f"{src}/code"):
        host.run(f"cp -a -- {qs}/code {qd}/code", timeout_s=600)
        on_step(f"code: copied {m.base.name}'s from the machine; only what changed is synced")
    same = _same_data(m.base, req)
    if same and host.exists(f"{src}/data/src"):
        host.run(f"cp -a -- {qs}/data/src {qd}/data/src", timeout_s=1800)
    prepared = f"{src}/data/prepared"
    if resolved.data_plan is not None and host.exists(f"{prepared}/meta.json"):
        _adopt(host, m, resolved, on_step)
    elif resolved.data is None and same and host.exists(f"{prepared}/meta.json") and _demo_same(host, src, resolved):
        host.run(f"cp -al -- {qs}/data/prepared/. {qd}/data/prepared 2>/dev/null || "
                 f"cp -a -- {qs}/data/prepared/. {qd}/data/prepared", timeout_s=1800)
        on_step(f"data: {m.base.name}'s prepared demo corpus reused (same data settings)")


def _demo_same(host: Host, src: str, resolved: ResolvedLaunch) -> bool:
    try:
        base_cfg = yaml.safe_load(host.read_file(f"{src}/run.yaml")) or {}
    except (GpucliError, yaml.YAMLError):
        return False
    return isinstance(base_cfg, dict) and base_cfg.get("data") == resolved.trainer_config.get("data")


# Run on the machine with its Python: the base run's raw inputs hashed as fetch.py keys its cache, and its
# prepared folder hard-linked there under that key (never overwriting one that is there).
_ADOPT = """
import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import fetch
spec = json.loads(Path(sys.argv[2]).read_text())
raw, prepared, cache = Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
key = fetch.content_key(raw, spec["prepare_args"], fetch.Progress(Path(os.devnull)))
target = cache / key
if not (target / "meta.json").exists():
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / (key + ".adopting")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    if subprocess.run(["cp", "-al", str(prepared.resolve()), str(tmp)]).returncode != 0:
        subprocess.run(["cp", "-a", str(prepared.resolve()), str(tmp)], check=True)
    os.replace(tmp, target)
print(key)
"""


def _adopt(host: Host, m: Machine, resolved: ResolvedLaunch, on_step: Callable[[str], None]) -> None:
    """The base run's prepared --data into the machine's content-hash cache, when its options are the new
    run's: fetch.py of the new run then finds it under the same key if and only if the inputs hash the same."""
    src = m.base.workdir.rstrip("/")
    try:
        base_plan = json.loads(host.read_file(f"{src}/datasource.json"))
    except (GpucliError, ValueError):
        return
    plan = resolved.data_plan
    if plan is None or not isinstance(base_plan, dict) or base_plan.get("prepare_args") != plan.get("prepare_args"):
        return
    raw = base_plan.get("pod_path") if base_plan.get("kind") == "pod" else f"{src}/{base_plan.get('raw_dir')}"
    if not raw or (base_plan.get("prepared_dir") and host.exists(f"{src}/{base_plan['prepared_dir']}") is False):
        return
    # an SSH host's writes make no folders (this machine's do): without it, every --on with --data over SSH failed
    host.run(f"mkdir -p -- {shlex.quote(src)}/.adopt", timeout_s=60)
    podfiles.ADOPT.write(host, f"{src}/.adopt")
    py = shlex.quote(resolved.python)
    args = " ".join(shlex.quote(a) for a in (f"{src}/.adopt", f"{src}/datasource.json", raw,
                                                 f"{src}/data/prepared", plan["cache_root"]))
    res = host.run(f"{py} -c {shlex.quote(_ADOPT)} {args}", timeout_s=1800, check=False)
    if res.exit_code == 0:
        on_step(f"data: {m.base.name}'s prepared data kept in the machine's cache under its content hash "
                f"{res.stdout.strip()[:12]}; reused when the inputs hash the same")
