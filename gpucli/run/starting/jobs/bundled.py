"""The bundled trainer as a job: ``python -m trainer.train`` (or torchrun) from the synced ``trainer/``
package, configured by run.yaml, its checkpoints ``checkpoints/step_N/`` with a meta.json."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpucli.providers.registry import get_target
from gpucli.run.files import harvest
from gpucli.run.files.store import start_store_sync, store_env, trainer_keep_last
from gpucli.run.inputs.datasources import stage_data
from gpucli.run.inputs.requirements import check_trainer_requirements
from gpucli.run.inputs.resumescript import write_resume_script
from gpucli.run.starting.envstamp import ensure_environment
from gpucli.run.starting.preflight import check_trainer
from gpucli.run.starting.start import (
    metrics_until,
    run_yaml_now,
    secrets_env,
    start_job,
    step_of,
)
from gpucli.runs import podfiles
from trainer.spec.config import JOB_STARTED_ENV

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.registry import Host
    from gpucli.run.files.harvest import FetchResult, MirrorResult
    from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch
    from gpucli.runs.records import RunRecord

EventFn = Callable[[str], None]


class BundledTrainer:
    """The bundled trainer (:class:`gpucli.run.starting.jobs.base.Job`)."""

    kind = "trainer"
    checks_disk = True
    resumes_from_volume = True

    def request(self, req: LaunchRequest) -> LaunchRequest:
        return req

    def resolved(self, resolved: ResolvedLaunch, catalog: Catalog, asked: LaunchRequest) -> ResolvedLaunch:
        return resolved

    def default_name(self, profile: str, model: str, phase: str) -> str:
        return f"{model}-{profile}-{phase}"

    def labelled(self, record: RunRecord) -> RunRecord:
        return record

    def inputs(self) -> dict[str, Any]:
        return {}

    def again(self) -> BundledTrainer:
        return self

    def secret_names(self) -> tuple[str, ...]:
        return ()

    def describe(self) -> list[str]:
        return []

    def start(self, host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
              save: Callable[[RunRecord], Any], restore: Path | None = None,
              metrics: Path | None = None, node_env: Mapping[str, str] | None = None) -> RunRecord:
        """Bootstrap, sync, write run.yaml and the env file, start the trainer detached.

        ``restore`` (a checkpoint folder on this machine) and ``metrics`` (the run's metrics.jsonl so
        far) are uploaded first when resuming on a new pod: the trainer's ``--resume auto`` continues
        from that checkpoint and appends to the same metrics file."""
        wd = resolved.workdir
        target = get_target(resolved.provider)
        # exec starts in the login directory, so a relative workdir works as it is.
        host.run(f"mkdir -p -- {shlex.quote(wd)}/code {shlex.quote(wd)}/data", timeout_s=60)
        if target.bootstrap:
            resolved, record = self._environment(host, resolved, record, on_event=on_event, save=save)
        on_event(check_trainer_requirements(host, resolved, pod=target.bootstrap).describe)
        on_event("syncing the trainer code")
        stats = host.sync_up(podfiles.TRAINER.source(), f"{wd}/{podfiles.TRAINER.name}",
                             excludes=list(podfiles.TRAINER.excludes))
        on_event(f"trainer code: {stats.files_sent} files sent ({stats.bytes_sent / 1e3:.0f} kB), "
                 f"{stats.files_skipped} unchanged")
        data_env: dict[str, str] = {}
        if resolved.data is not None and resolved.data_plan is not None:
            data_env = stage_data(host, resolved.data, resolved.data_plan, workdir=wd, python=resolved.python,
                                  install=target.bootstrap, on_event=on_event)
        if restore is not None:
            on_event(f"restoring checkpoint {restore.name} from this machine")
            host.sync_up(restore, f"{wd}/checkpoints/{restore.name}", excludes=[])
            if metrics is not None and metrics.exists() and not host.exists(f"{wd}/metrics.jsonl"):
                host.write_file(f"{wd}/metrics.jsonl", metrics_until(metrics.read_bytes(), step_of(restore)),
                                mode=0o644)
        measured = int(time.time())  # run.yaml's limits are what is left at this moment: the trainer's clock starts here
        config = run_yaml_now(resolved, record)
        host.write_file(f"{wd}/run.yaml", yaml.safe_dump(config, sort_keys=False).encode(), mode=0o644)
        host.write_env_file(f"{wd}/env", {**secrets_env(resolved.env_names), **data_env, JOB_STARTED_ENV: str(measured),
                                            **(node_env or {}), **store_env(resolved.store)})
        # The machine and this configuration checked before anything is detached (--no-preflight skips it).
        record = check_trainer(host, resolved, record, on_event=on_event, save=save)
        # before the job: the watchdog's end then always knows there is an uploader to wait for. Several
        # nodes: every node's, each sending its part of the sharded checkpoints (gpucli/store/storesync.py)
        rank = (node_env or {}).get("GPUCLI_NODE_RANK", "0")
        start_store_sync(host, resolved, kind="trainer", checkpoints="checkpoints", keep_last=trainer_keep_last(resolved),
                         on_event=on_event, node_rank=int(rank) if rank.isdigit() else 0)
        record = start_job(host, resolved, record, resolved.command, what="trainer", on_event=on_event, save=save)
        if target.caps.in_place_resume:  # a container started again resumes the run
            write_resume_script(host, resolved, record)
            on_event("resume.sh written: a container started again resumes from its newest checkpoint by itself")
        return record

    @staticmethod
    def _environment(host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
                     save: Callable[[RunRecord], Any]) -> tuple[ResolvedLaunch, RunRecord]:
        """setup_pod.sh on the host: the trainer's pinned environment (gpucli.runs.trainerenv), built or
        reused on the run's volume; the launch and the record then name the Python it chose."""
        env = ensure_environment(host, resolved.workdir, resolved.python, on_event)
        record = record.with_(python=env.python, env_build_s=env.seconds)
        save(record)
        return with_python(resolved, env.python), record

    def fetch_best(self, host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False,
                   progress: Any = None, on_event: EventFn) -> FetchResult:
        return harvest.fetch_best_trainer(host, record, dest, with_optimizer=with_optimizer, progress=progress,
                                          on_event=on_event)

    def mirror(self, host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
               on_event: EventFn) -> MirrorResult:
        return harvest.mirror_trainer(host, record, keep=keep, progress=progress, on_event=on_event)

    def restore_point(self, run: str) -> Path | None:
        return harvest.newest_good(run)


BUNDLED = BundledTrainer()


def with_python(resolved: ResolvedLaunch, python: str) -> ResolvedLaunch:
    """The launch with the trainer (and the data step before it) started by ``python``: the Python
    setup_pod.sh chose on the pod, known only once it ran."""
    if python == resolved.python:
        return resolved
    old, new = shlex.quote(resolved.python), shlex.quote(python)
    command = resolved.command
    for tail in (" -m trainer.train ", " -m torch.distributed.run ", " ../fetch.py "):
        command = command.replace(old + tail, new + tail)
    plan = dict(resolved.data_plan) if resolved.data_plan is not None else None
    if plan is not None and plan.get("python") == resolved.python:
        plan["python"] = python
    return dataclasses.replace(resolved, python=python, command=command, data_plan=plan)
