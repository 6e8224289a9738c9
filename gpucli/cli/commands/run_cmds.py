"""The run lifecycle: launch, status/ls, tail, fetch-best, down, sync, ssh."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import typer

from gpucli.cli.commands.access_cmds import ssh, sync  # registered here: their place in the help
from gpucli.cli.complete import run_names

RUN_ARG = typer.Argument(None, metavar="[RUN]", help="Run name (default: the newest run).",
                         autocompletion=run_names)
JSON_OPT = typer.Option(False, "--json", help="Print JSON.")

# Set by `gpucli sweep` (cli/commands/sweep_cmd.py): launch resolves its options (task.yaml, your config,
# the defaults) into a request and hands it here instead of launching, so a sweep launches exactly what
# `gpucli launch` with the same options would.
RESOLVED: ContextVar[Callable[[Any, Any], None] | None] = ContextVar("launch_resolved", default=None)


def launch(
    task_file: Path = typer.Argument(None, metavar="[TASK.yaml]", help="Your own code's task file (keys: run, "
                                     "code, setup, checkpoints, data, profile, provider, limits, env, env_from_local); options "
                                     "given here override it."),
    profile: str | None = typer.Option(None, "--profile", "-p", help="Profile: cpu, h100, 8xA100, ... (gpucli profiles)."),
    code: str = typer.Option(None, "--code", help="Your own training code: a folder, or git+https://host/org/"
                             "repo@ref (cloned on the pod). Runs --run instead of the bundled trainer."),
    run_cmd: str = typer.Option(None, "--run", help="Your training command (bash, from the code folder)."),
    setup: str = typer.Option(None, "--setup", help="Run once per pod before --run (e.g. pip install -r ...)."),
    checkpoints: str = typer.Option(None, "--checkpoints", help="Where your code writes checkpoints, relative to "
                                    "the code folder (default checkpoints/): fetch-best and the mirror read it."),
    metrics_regex: str = typer.Option(None, "--metrics-regex", help="Regex with named groups step and loss "
                                      "(or val_loss) for log lines gpucli does not know."),
    params: str = typer.Option(None, "--params", help="Your own code: its model's size (680M, 1.3B) for a time, "
                               "cost and disk estimate (or --model PRESET)."),
    seq_len: int = typer.Option(None, "--seq-len", help="Your own code: its sequence length (for the estimate)."),
    tokens: str = typer.Option(None, "--tokens", help="Your own code: the tokens it trains on (20B, 500M)."),
    grace: float = typer.Option(None, "--grace", help="Seconds your job gets between SIGTERM and SIGKILL to save "
                                "(default 60; below the watchdog's grace)."),
    phase: str = typer.Option(None, "--phase", help="Training phase: fast (default) or extreme."),
    model: str = typer.Option(None, "--model", "-m", help="Model preset (default: tiny on CPU, 124m on GPUs)."),
    provider: str | None = typer.Option(None, "--provider", help="local, ssh, runpod, vast, any (every cloud whose "
                                        "key is set, cheapest run first, the next offer when one fails) or a list "
                                        "(runpod,vast). Default: local; a GPU profile this machine lacks: any."),
    retry_until_up: str = typer.Option(None, "--retry-until-up", metavar="DURATION", help="With --provider any or a "
                                       "list: when every offer failed, search again (backing off) until this long "
                                       "has passed (30m, 2h)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Launch without asking when gpucli chose the provider."),
    pick: str = typer.Option(None, "--pick", help="cheapest, fastest or best: the setup `gpucli plan` picks for the "
                             "model, with its hours and dollars as --hours and --budget unless given."),
    host: list[str] = typer.Option([], "--host", help="ssh provider: user@host[:port]; repeat it for --nodes "
                                   "(rank 0 first)."),
    hosts_file: Path = typer.Option(None, "--hosts-file", help="ssh provider: one user@host[:port] a line, rank 0 "
                                    "first."),
    nodes: int = typer.Option(1, "--nodes", help="Machines, each with the profile's GPUs (--profile 8xH100 --nodes 4 "
                              "is 32 GPUs); torchrun's c10d rendezvous on rank 0."),
    nccl_ifname: str = typer.Option(None, "--nccl-ifname", help="ssh provider, --nodes > 1: the network interface "
                                    "the nodes reach each other on (checked on every node)."),
    link_gbps: float = typer.Option(None, "--link-gbps", help="ssh provider, --nodes > 1: the nodes' link in Gbit/s, "
                                    "for the plan (without it the link is measured at launch: 64 MB from each node "
                                    "to rank 0; a probe that fails is a warning)."),
    probe_link: bool = typer.Option(False, "--probe-link", help="ssh provider, --nodes > 1: measure the link at launch "
                                    "and refuse to start when that fails."),
    identity: Path = typer.Option(None, "--identity", "-i", help="ssh provider: private key file."),
    data: str | None = typer.Option(None, "--data", help="Training text: a folder (synced), pod:/path (already on the "
                             "pod), an https:// URL or a file listing URLs, or hf://datasets/ORG/NAME[/GLOB]; "
                             "prepared on the pod (default: a demo corpus)."),
    volume: str = typer.Option(None, "--volume", help="RunPod network volume (name or id) at /workspace: the run "
                               "folder, checkpoints and prepared data live there and are reused."),
    volume_size: int = typer.Option(None, "--volume-size", help="GB of the --volume to create (in the data centre "
                                    "of the chosen GPU) when your account has none of that name; it is kept "
                                    "after the run and billed monthly until you delete it."),
    hours: float | None = typer.Option(None, "--hours", help="Stop after this many hours (a final checkpoint is written)."),
    budget: float | None = typer.Option(None, "--budget", help="Stop when the run has cost this many dollars."),
    price: float = typer.Option(None, "--price", help="$/hour of the machine (default: the catalogue's)."),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps (default: the phase's iterations)."),
    name: str | None = typer.Option(None, "--name", help="Run name (default: model-profile-phase)."),
    spot: bool = typer.Option(False, "--spot", help="Rent an interruptible (spot) pod."),
    bid: float = typer.Option(None, "--bid", help="Spot bid in $/GPU-hour (default: just above the floor)."),
    image: str = typer.Option(None, "--image", help="Container image for cloud pods."),
    disk: int = typer.Option(None, "--disk", help="Disk for cloud pods, GB (default 50)."),
    ready_timeout: float = typer.Option(None, "--ready-timeout", help="Seconds to wait for a pod's SSH, per offer "
                                        "tried (default 600; the provider is polled every GPUCLI_PROVIDER_POLL_S, "
                                        "default 5)."),
    python: str = typer.Option(None, "--python", help="Python on the pod (default: python3; local: this one). For the bundled trainer on "
                                "a pod, the Python its pinned environment starts from: used as it is when it has it."),
    env: list[str] = typer.Option([], "--env", metavar="NAME", help="A secret by name (repeatable), e.g. --env "
                                  "WANDB_API_KEY: its value comes from your environment or `gpucli keys` (HF_TOKEN "
                                  "also from `hf auth login`) into the pod's 0600 env file, never a command line."),
    tracker: str = typer.Option(None, "--tracker", help="Also log the bundled trainer's metrics to wandb or "
                                "trackio (the package must be on the pod: gpucli[wandb], gpucli[trackio]); the run's "
                                "name and config are attached. wandb takes WANDB_API_KEY by name (--env)."),
    set_: list[str] = typer.Option([], "--set", help="Trainer override, e.g. --set training.val_interval=20."),
    val_interval: int = typer.Option(None, "--val-interval", help="Steps between validations."),
    checkpoint_every: str = typer.Option(None, "--checkpoint-every", help="A checkpoint every 1h, 30m, ... of "
                                         "training (besides the step interval), or every N steps (a number)."),
    workdir: str = typer.Option(None, "--workdir", help="The run's folder on the host (default: gpucli-runs/RUN)."),
    stall_minutes: float | None = typer.Option(None, "--stall-minutes", help="The pod's watchdog ends a run with no new "
                                        "metrics for this long (default 30)."),
    idle_stop: str = typer.Option(None, "--idle-stop", help="The pod's watchdog ends a run whose GPUs all sit at "
                                  "or under 5 % this long (default 30m; 0 or off: never), checkpoint first."),
    slow_below: float | None = typer.Option(None, "--slow-below", help="Say (status, tail, the log) when the "
                                            "run's tokens/s after warm-up is under this share of the plan's (default 0.7; 0: off)."),
    replace_slow: bool = typer.Option(False, "--replace-slow", help="A slow run is checkpointed and its machine "
                                      "ended; `gpucli watch --recover` continues it on a new one."),
    on_end: str = typer.Option(None, "--on-end", help="When the run is over, the watchdog stops (default; the "
                               "disk and checkpoints stay) or terminates the pod. RunPod's kept disk is host-local "
                               "and lost at a $0 balance: --volume keeps checkpoints on a network volume "
                               "(docs/clouds.md)."),
    preflight: str = typer.Option(None, "--preflight", help="Your own code: a check command (bash, from the code "
                                  "folder) run after --setup and before --run, within GPUCLI_PREFLIGHT_TIMEOUT_S "
                                  "(default 900 s); a non-zero exit ends the machine and the launch."),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="Detach the run without the preflight (the "
                                      "bundled trainer's: the GPU, its matmul speed against its peak, the all-reduce, "
                                      "the disk and a few steps of this configuration, before the long run)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run, and do nothing."),
    force: bool = typer.Option(False, "--force", help="Launch even when the provider's balance is below "
                               "--budget (or the planned cost), or a GPU profile on a local machine without one; "
                               "keep a pod billed more than 5% above its quote."),
    query: str = typer.Option(None, "--query", help="Offer filters in vast query words, e.g. \"reliability>=0.9 "
                              "inet_down>=200\": each field named replaces gpucli's default filter of it."),
    store: str = typer.Option(None, "--store", help="Also upload every checkpoint the run keeps, and its best, to "
                              "s3://BUCKET/PREFIX (any S3-compatible service: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                              "AWS_ENDPOINT_URL) or hf://[datasets/]OWNER/NAME (HF_TOKEN), from the pod as it trains; "
                              "resume, --recover and fetch-best read it when the pod is gone."),
    mirror_checkpoints: bool = typer.Option(False, "--mirror-checkpoints",
                                            help="Stay attached and copy each new checkpoint to this machine."),
    recover: bool = typer.Option(False, "--recover", help="Stay attached, mirror checkpoints, and resume on a new "
                                 "pod when a spot pod is taken away."),
    on: str = typer.Option(None, "--on", metavar="RUN", help="Run on the machine RUN has (a finished run's, a "
                           "box's): nothing rented; its environment, code and prepared data reused where unchanged."),
    json_: bool = JSON_OPT,
) -> None:
    """Rent (or use) a machine, sync code and data, and start the bundled trainer (or your own --run) detached."""
    from gpucli.cli import render_runs as render
    from gpucli.errors import UsageError
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.inputs import precedence
    from gpucli.run.inputs.launch import LaunchRequest
    from gpucli.run.life import lifecycle
    from gpucli.runs.limits import Limits, parse_idle_stop

    machine = None
    if on is not None:  # the machine of a run: its provider, endpoint and profile unless given
        from gpucli.run.life import warm

        machine = warm.machine(on)
    # the command line, then task.yaml, then your config, then the defaults (gpucli/run/inputs/precedence.py)
    chosen = precedence.launch_choices(dict(
        profile=profile, provider=provider, name=name, data=data, spot=spot, budget=budget, hours=hours,
        stall_minutes=stall_minutes, phase=phase, model=model, disk=disk, image=image, ready_timeout=ready_timeout,
        python=python, on_end=on_end, store=store, host=tuple(host), identity=str(identity) if identity else None,
        run=run_cmd, code=code, setup=setup, checkpoints=checkpoints, metrics_regex=metrics_regex, grace=grace),
        task_file=task_file, machine=machine)
    task = chosen.task
    if task is None and preflight is not None:
        raise UsageError("--preflight CMD goes with --run (your own code); the bundled trainer has its own",
                         hint="--no-preflight skips the bundled trainer's")
    if task is None and (setup or checkpoints or metrics_regex or grace is not None or params or seq_len or tokens):
        raise UsageError("--setup, --checkpoints, --metrics-regex, --grace, --params, --seq-len and --tokens go "
                         "with --run (your own code)")
    if no_preflight and preflight is not None:
        raise UsageError("--preflight CMD and --no-preflight contradict each other")
    if preflight is not None and not preflight.strip():
        raise UsageError("--preflight needs a command")
    provider, profile, phase, model, name, data = (chosen[k] for k in ("provider", "profile", "phase", "model",
                                                                       "name", "data"))
    disk, image, ready_timeout, python, on_end, store = (chosen[k] for k in ("disk", "image", "ready_timeout",
                                                                             "python", "on_end", "store"))
    budget, hours, stall_minutes, spot = chosen["budget"], chosen["hours"], chosen["stall_minutes"], bool(chosen["spot"])
    host, identity = list(chosen["host"] or ()), chosen["identity"]
    if params or seq_len is not None or tokens:
        from gpucli.plan.estimate import parse_quantity

        try:
            given_own: dict[str, Any] = {"own_params": parse_quantity(params) if params else None,
                         "own_tokens": parse_quantity(tokens) if tokens else None}
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if seq_len is not None and seq_len < 1:
            raise UsageError(f"--seq-len must be at least 1, got {seq_len}")
        given_own["own_seq_len"] = seq_len
    else:
        given_own = {}
    if profile is None and pick is None:
        raise UsageError("--profile is required", hint="gpucli profiles lists them (or set one: "
                                                       "gpucli config set profile NAME)")
    if tracker is not None:
        from gpucli.runs.secretenv import tracker_settings

        extra_set, env = tracker_settings(tracker, own=task is not None, env=env)
        set_ = [*set_, *extra_set]
    given: dict[str, Any] = {k: v for k, v in (("phase", phase), ("provider", provider)) if v is not None}
    if checkpoint_every is not None:
        from gpucli.plan.runmodel import parse_checkpoint_every

        given.update(parse_checkpoint_every(checkpoint_every))
    hosts = tuple(host)
    if hosts_file is not None:
        from gpucli.run.host.nodes import read_hosts_file

        hosts += read_hosts_file(str(hosts_file))
    if len(hosts) > 1 and nodes == 1:
        nodes = len(hosts)  # the hosts say how many nodes
    req = LaunchRequest(
        profile=profile or "cpu", **given, **given_own, model=model, data=data, volume=volume, volume_size_gb=volume_size,
        name=name, host=hosts[0] if hosts else None, hosts=hosts if len(hosts) > 1 else (), nodes=nodes,
        nccl_ifname=nccl_ifname, link_gbps=link_gbps, probe_link=probe_link,
        identity=str(identity) if identity else None, spot=spot, bid_per_gpu_usd=bid, val_interval=val_interval,
        extra=tuple(set_), workdir=workdir, on_end=on_end, python=python, image=image, disk_gb=disk,
        ready_timeout_s=ready_timeout, force=force, env_names=tuple(env), query=query, store=store,
        mirror=bool(recover or mirror_checkpoints),
        preflight=None if no_preflight else (preflight or ""),
        limits=Limits(max_steps=steps, max_hours=hours, budget_usd=budget, price_per_hour_usd=price,
                      stall_minutes=stall_minutes, idle_stop_minutes=parse_idle_stop(idle_stop),
                      slow_below=slow_below, replace_slow=replace_slow))
    if (hand_over := RESOLVED.get()) is not None:
        hand_over(req, task)
        return
    catalog = load_catalog()
    if pick is not None:  # the plan's choice (gpucli/run/inputs/pick.py)
        from gpucli.run.inputs.pick import picked
        from gpucli.runs.notice import Notice

        req, line = picked(catalog, req, pick)
        render.notice(Notice("info", line))
    if dry_run:
        from gpucli.cli.commands.launch_any import dry_run_across

        if machine is None and dry_run_across(catalog, req, task, given=provider is not None, json_=json_):
            return
        resolved, job = lifecycle.plan(catalog, req, task)
        lines = job.describe()
        from gpucli.cli.render_launch import launch_plan

        launch_plan(resolved, json_=json_, task=lines if job.kind == "own" else None)
        return
    if machine is not None:
        prepared = warm.prepare_on(catalog, req, machine, task=task)
        with render.status_line() as step:
            record = warm.launch_on(prepared, machine, on_step=step, on_notice=render.notice)
    else:
        from gpucli.cli.commands.launch_any import launch_across

        record = launch_across(catalog, req, task, given=provider is not None, retry=retry_until_up, yes=yes)
        if record is None:  # one provider
            prepared = lifecycle.prepare(catalog, req, task=task)
            with render.status_line() as step:
                record = lifecycle.launch(prepared, on_step=step, on_notice=render.notice)
    render.launched(record, json_=json_)
    if recover or mirror_checkpoints:
        lifecycle.watch(record.name, catalog, mirror=True, recover=recover, on_notice=render.notice)


def resume(
    run: str = RUN_ARG,
    from_scratch: bool = typer.Option(False, "--from-scratch", help="Start over when no checkpoint can be found."),
    nodes: int = typer.Option(None, "--nodes", help="A run over several machines: resume on its first N nodes "
                              "(the others' checkpoint shards are brought to node 0)."),
    provider: str = typer.Option(None, "--provider", help="Continue on another provider (local, ssh, runpod, vast) "
                                 "from the newest whole checkpoint in the run's store (--store) or this machine's mirror."),
    json_: bool = JSON_OPT,
) -> None:
    """Continue a stopped or preempted run: a new pod of the same profile, the newest checkpoint, same run."""
    from gpucli.cli import render_runs as render
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.life import lifecycle

    with render.status_line() as step:
        record = lifecycle.resume(run, load_catalog(), from_scratch=from_scratch, on_step=step,
                                  on_notice=render.notice, nodes=nodes, provider=provider)
    render.launched(record, json_=json_)


def mirror(run: str = RUN_ARG, json_: bool = JSON_OPT) -> None:
    """Copy the run's newest checkpoint and its metrics to this machine (for `gpucli resume`); a stopped
    pod is started for it and stopped again."""
    from gpucli.cli import render_runs as render
    from gpucli.run.files.podwake import reading
    from gpucli.run.starting.jobs import mirror_once
    from gpucli.runs import records as runs

    record = runs.resolve(run, on_bad=render.warn)  # a stopped pod is started, read and stopped again
    with reading(record, on_event=render.info, on_warn=render.warn) as host, \
            render.transfer_progress("mirroring") as progress:
        result = mirror_once(host, record, progress=progress, on_event=render.info)
    if json_:
        from gpucli.cli import render_json
        from gpucli.run.files.harvest import mirror_root

        render_json.mirrored(record, result, mirror_root(record.name))
        return
    render.mirrored(record, result)


def watch(
    run: str = RUN_ARG,
    mirror_: bool = typer.Option(True, "--mirror/--no-mirror", help="Copy each new checkpoint to this machine."),
    recover: bool = typer.Option(False, "--recover", help="Resume on a new pod when a spot pod is taken away."),
    poll: float = typer.Option(30.0, "--poll", help="Seconds between checks."),
    json_: bool = typer.Option(False, "--json", help="Each notice as a JSON line, then how the watch ended."),
    detach: bool = typer.Option(False, "--detach", help="With --on: start the watcher there and return."),
    on: str = typer.Option(None, "--on", metavar="USER@HOST[:PORT]", help="Run the watcher on that always-on "
                           "machine over SSH (gpucli copied there; the provider key in a 0600 env file)."),
    identity: Path = typer.Option(None, "--identity", "-i", help="SSH private key for --on."),
    watcher_status: bool = typer.Option(False, "--status", help="Whether the watcher on the other machine runs, "
                                        "the end of its log; the run's record it keeps brought back here."),
    stop: bool = typer.Option(False, "--stop", help="End the watcher on the other machine."),
) -> None:
    """Stay attached to a run: mirror checkpoints, notice preemption, and (with --recover) resume."""
    from gpucli.cli import render_runs as render
    from gpucli.errors import UsageError
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.life import lifecycle

    if not poll > 0:
        raise UsageError(f"--poll must be a positive number of seconds, got {poll}")
    if detach or on or watcher_status or stop:
        from gpucli.run.oversee import remotewatch

        if watcher_status or stop:
            st = remotewatch.stop(run) if stop else remotewatch.status(run)
            render.remote_watch(st, json_=json_)
            return
        if not (detach and on):
            raise UsageError("--detach and --on go together: gpucli watch RUN --detach --on USER@HOST")
        remotewatch.detach(run, on, identity=str(identity) if identity else None, recover=recover, mirror=mirror_,
                           poll_s=poll, on_step=render.info)
        return
    if json_:
        from gpucli.cli import render_json

        how = lifecycle.watch(run, load_catalog(), mirror=mirror_, recover=recover, poll_s=poll,
                              on_notice=render_json.notice)
        render_json.watch_ended(run or "", how)
        return
    lifecycle.watch(run, load_catalog(), mirror=mirror_, recover=recover, poll_s=poll, on_notice=render.notice)


def status(run: str = RUN_ARG, json_: bool = JSON_OPT) -> None:
    """State, step, latest loss, tok/s, elapsed, $ so far, $ per hour, projected total, ETA."""
    from gpucli.cli import render_runs as render
    from gpucli.run.oversee import reconcile
    from gpucli.runs import records as runs

    record = runs.resolve(run, on_bad=render.warn)
    seen = reconcile.status(record)  # read, then do what the read found due (one explicit step)
    if record.nodes and json_:  # one JSON object: the run's status with its nodes
        from gpucli.cli.render import json_out
        from gpucli.run.starting.multinode import node_statuses

        json_out({**render._status_dict(record, seen),
                  "nodes": [dataclasses.asdict(n) for n in node_statuses(record)],
                  **({"link": dataclasses.asdict(record.link)} if record.link else {})})
        return
    render.run_status(record, seen, json_=json_)
    if record.nodes:
        from gpucli.cli.render_nodes import node_table
        from gpucli.run.starting.multinode import node_statuses

        node_table(node_statuses(record), json_=False, link=record.link)


def ls(json_: bool = JSON_OPT, all_: bool = typer.Option(False, "--all", help="Check every run's host.")) -> None:
    """Every run with its state and cost; the day's total."""
    from gpucli.cli import render_runs as render
    from gpucli.run.oversee import reconcile

    render.runs_table(reconcile.statuses(check_all=all_, on_bad=render.warn), json_=json_)


def tail(
    run: str = RUN_ARG,
    follow: bool = typer.Option(True, "--follow/--no-follow", help="Keep watching (default) or print once."),
    json_: bool = typer.Option(False, "--json", help="Stream the raw metrics rows as JSON lines."),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between reads."),
) -> None:
    """Live metrics of a run: loss, ppl, lr, tok/s, MFU, ETA, $ so far, validation and events; before the
    first step, what it is doing. Following ends with the run (exit status 1 when it failed)."""
    from gpucli.cli import render_runs as render
    from gpucli.errors import GpucliError
    from gpucli.providers.registry import open_host
    from gpucli.run.watch.follow import follow_run, snapshot
    from gpucli.runs import records as runs

    record = runs.resolve(run, on_bad=render.warn)
    if not follow:
        with open_host(record) as host:
            now = snapshot(host, record)
        render.tail_once(record, now, json_=json_)
        return
    failure = render.tail_live(record, follow_run(lambda: open_host(record), record, poll_s=poll,
                                                  on_reconnect=render.warn), json_=json_)
    if failure:
        raise GpucliError(failure)


def fetch_best(
    run: str = RUN_ARG,
    dest: Path = typer.Option(Path("checkpoints"), "--dest", help="Folder to put the checkpoint in."),
    with_optimizer: bool = typer.Option(False, "--with-optimizer", help="Also the optimizer state (to resume)."),
    from_store: bool = typer.Option(False, "--from-store", help="Take it from the run's checkpoint store (--store), "
                                    "not the pod (the default once the pod cannot be reached)."),
    json_: bool = JSON_OPT,
) -> None:
    """Download the checkpoint with the lowest validation loss, verified by sha256 (a stopped pod is
    started for it and stopped again)."""
    from gpucli.cli import render_runs as render
    from gpucli.errors import GpucliError
    from gpucli.run.files import store
    from gpucli.run.files.podwake import reading
    from gpucli.run.starting.jobs import fetch_best as do_fetch
    from gpucli.runs import records as runs

    record = runs.resolve(run, on_bad=render.warn)
    if not from_store:
        try:  # a stopped pod is started, read and stopped again (never terminated)
            with reading(record, on_event=render.info, on_warn=render.warn) as host, \
                    render.transfer_progress("downloading") as progress:
                result = do_fetch(host, record, dest, with_optimizer=with_optimizer, progress=progress,
                                  on_event=render.info)
            render.fetched(result, json_=json_)
            return
        except GpucliError as exc:
            if store.run_store(record) is None:
                raise
            render.warn(f"the pod cannot be reached ({exc.message}): taking the best checkpoint from the store")
    render.fetched(store.fetch_best(record, dest, with_optimizer=with_optimizer), json_=json_)


def down(
    run: str = RUN_ARG,
    strays: bool = typer.Option(False, "--strays", help="Find gpucli-labelled pods no run owns, and end them."),
    keep: bool = typer.Option(False, "--keep-pod", help="Stop the trainer but leave the pod running."),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --strays: end them without asking."),
    json_: bool = typer.Option(False, "--json", help="Print JSON (with --strays: they are ended only with --yes)."),
) -> None:
    """Stop the trainer (it writes an emergency checkpoint), then release the machine. A sweep's name ends
    every run of the sweep."""
    from gpucli.cli import render_runs as render
    from gpucli.run.oversee import control
    from gpucli.runs import records as runs

    if strays and json_:
        from gpucli.cli import render_json

        found = control.find_strays(on_notice=render.notice)
        if found and yes:
            control.end_strays(found, on_notice=render.notice)
        render_json.strays(found, ended=bool(found and yes))
        return
    if strays:
        found = control.find_strays(on_notice=render.notice)
        render.strays(found)
        if found and (yes or render.confirm(f"terminate {len(found)} pod(s)?")):
            control.end_strays(found, on_notice=render.notice)
        return
    from gpucli.run.life import sweep as sweeps

    if run is not None and sweeps.exists(run) and not (runs.runs_dir() / f"{run}.json").exists():
        from gpucli.cli import render_sweep  # a sweep's name: every run of it (as `gpucli sweep down`)

        ended = sweeps.end(run, lambda name: control.down(name, on_step=render.info, on_notice=render.notice))
        render_sweep.ended(run, ended, json_=json_)
        return
    result = control.down(run, keep_pod=keep, on_step=render.info, on_notice=render.notice)
    if json_:
        from gpucli.cli import render_json

        render_json.downed(result)
        return
    render.downed(result)


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
    app.command("status")(status)
    app.command("ls")(ls)
    app.command("tail")(tail)
    app.command("fetch-best")(fetch_best)
    app.command("down")(down)
    app.command("sync")(sync)
    app.command("ssh")(ssh)
    app.command("resume")(resume)
    app.command("mirror")(mirror)
    app.command("watch")(watch)
