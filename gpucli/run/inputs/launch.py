"""What a launch will do, decided before any machine is touched: the request, its checks, and the
resolved launch (model, batch, steps, limits, run.yaml, the command line on the pod).

``--dry-run`` prints a :class:`ResolvedLaunch` and stops; :mod:`gpucli.run.starting.start` carries it out.
Every unset option takes its value from :mod:`gpucli.runs.defaults`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import math
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpucli.errors import NothingFitsError, UsageError
from gpucli.plan.catalog import Catalog, ClusterProfile, ModelShape, SingleProfile
from gpucli.plan.disk import DiskNeed, checkpoint_disk, disk_need
from gpucli.plan.estimate import Fit, choose_micro_batch, speed_flops_per_token
from gpucli.plan.planner import PlanRequest, PriceQuote, Setup, choose_price, estimate_train
from gpucli.plan.runmodel import (
    check_fit,
    check_model,
    checkpoints_planned,
    keep_global_batch,
    resolved_model,
    run_spec,
    run_stages,
    stage_chunks,
    training_overrides,
)
from gpucli.providers.query import comparisons
from gpucli.providers.registry import get_target
from gpucli.run.host.nodes import check_request, planned_across, trainer_command
from gpucli.run.inputs.datasources import DataSource, parse_data, pod_plan
from gpucli.runs.defaults import DEFAULTS, ON_END_CHOICES
from gpucli.runs.limits import Limits
from gpucli.runs.records import PlannedSpeed
from gpucli.runs.secretenv import check_names
from gpucli.runs.storeurl import store_url
from gpucli.settings import volume_mount
from trainer.spec.config import DEMO_MAX_BYTES, JOB_STARTED_ENV, ConfigError
from trainer.spec.load import apply_override, parse_override, validated_config
from trainer.spec.modelspec import unsupported_message


@dataclass(frozen=True)
class LaunchRequest:
    """A launch as asked for; None means "the default" (resolved in :func:`resolve`). Kept in the run
    record (no secrets), so ``gpucli resume`` resolves the same launch again."""

    profile: str
    phase: str = DEFAULTS.phase
    provider: str = DEFAULTS.provider
    model: str | None = None
    data: str | None = None  # --data: a folder, pod:/path, https://..., a URL list, hf://datasets/ORG/NAME
    volume: str | None = None  # --volume: a RunPod network volume (name or id) mounted at /workspace
    volume_size_gb: int | None = None  # --volume-size: create --volume with this many GB when there is none
    limits: Limits = field(default_factory=Limits)  # max_steps: the phase's; price: the catalogue's or offers'
    name: str | None = None
    host: str | None = None  # ssh provider: user@host[:port]
    identity: str | None = None  # ssh provider: private key file
    spot: bool = False
    bid_per_gpu_usd: float | None = None
    val_interval: int | None = None
    checkpoint_interval: int | None = None
    checkpoint_every_s: float | None = None  # --checkpoint-every 1h: also a checkpoint each this many seconds
    own_params: float | None = None  # own code: --params, its model's size (for the estimate)
    own_seq_len: int | None = None  # own code: --seq-len
    own_tokens: float | None = None  # own code: --tokens it trains on
    extra: tuple[str, ...] = ()  # more --section.key=value trainer overrides
    workdir: str | None = None  # the run's folder on the host (default: per target)
    on_end: str | None = None  # what the watchdog does to a cloud pod when the run is over: stop | terminate
    python: str | None = None  # on the host (default: per target)
    image: str | None = None  # cloud pods
    disk_gb: int | None = None  # cloud pods
    ready_timeout_s: float | None = None  # per offer tried
    force: bool = False  # launch although the provider's balance is below the run's cost (never kept in the record)
    env_names: tuple[str, ...] = ()  # --env NAME: secrets by name (gpucli.runs.secretenv); never their values
    nodes: int = 1  # --nodes: machines, each with the profile's GPUs (gpucli.run.host.nodes)
    hosts: tuple[str, ...] = ()  # ssh provider: every node's user@host[:port], rank 0 first (--host repeated)
    nccl_ifname: str | None = None  # the interface the nodes reach each other on (ssh; fixed per cloud)
    link_gbps: float | None = None  # the nodes' link, for the plan (ssh: --link-gbps)
    probe_link: bool = False  # --probe-link: measure the nodes' link at launch, and refuse when that fails
    query: str | None = None  # --query: vast query words replacing the launch's offer filters field by field
    preflight: str | None = ""  # "": the job's own check of the machine before the run is detached (gpucli.run.starting.preflight); None: --no-preflight; else your own code's --preflight CMD
    store: str | None = None  # --store s3://BUCKET/PREFIX | hf://OWNER/NAME: the checkpoints' store (gpucli.run.files.store)
    mirror: bool = False  # --mirror-checkpoints/--recover: each checkpoint pulled here (its bytes are quoted)

    def checked(self) -> LaunchRequest:
        """This request, or a UsageError (one line) for the first bad value."""
        req = dataclasses.replace(self, provider=self.provider.strip().lower(),
                                  extra=tuple(s if s.startswith("--") else f"--{s}" for s in self.extra))
        # An unknown name says which names there are; a target that needs --host says so.
        get_target(req.provider).endpoint(req.host, req.identity)
        check_request(req)
        req.limits.checked()
        if req.env_names or req.store:
            req = dataclasses.replace(req, env_names=check_names(req.env_names), store=store_url(req.store))
        for flag, value in (("--bid", req.bid_per_gpu_usd), ("--val-interval", req.val_interval),
                            ("--checkpoint-interval", req.checkpoint_interval), ("--disk", req.disk_gb),
                            ("--checkpoint-every", req.checkpoint_every_s),
                            ("--ready-timeout", req.ready_timeout_s)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(f"{flag} must be a positive number, got {value}")
        if req.data is not None:
            parse_data(req.data)
        if req.query is not None:
            comparisons(req.query)  # a bad --query is said before anything is searched
        if req.volume is not None and not get_target(req.provider).caps.network_volumes:
            raise UsageError(f"--volume: {req.provider} has no network volumes",
                             hint="network volumes are RunPod's; elsewhere checkpoints are mirrored to "
                                  "this machine (--mirror-checkpoints or --recover)")
        if req.volume_size_gb is not None:
            if req.volume is None:
                raise UsageError("--volume-size goes with --volume NAME (the volume to create when there is none)")
            if isinstance(req.volume_size_gb, bool) or not isinstance(req.volume_size_gb, int) or req.volume_size_gb <= 0:
                raise UsageError(f"--volume-size must be a positive number of GB, got {req.volume_size_gb}")
        if req.on_end is not None and req.on_end not in ON_END_CHOICES:
            raise UsageError(f"--on-end must be stop or terminate, got '{req.on_end}'")
        return req

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("force")  # a resume checks the balance again
        data["data"] = str(self.data) if self.data else None
        for key, default in (("volume", None), ("volume_size_gb", None), ("nodes", 1), ("hosts", ()),
                             ("nccl_ifname", None), ("link_gbps", None), ("probe_link", False), ("query", None), ("preflight", ""),
                             ("store", None), ("mirror", False)):
            if getattr(self, key) == default:
                del data[key]  # records of one-machine runs (no --volume, --query) stay as they were
        if self.hosts:
            data["hosts"] = list(self.hosts)
        data["extra"] = list(self.extra)
        if self.env_names:
            data["env_names"] = list(self.env_names)
        else:
            del data["env_names"]  # records without --env stay as they were
        return {"request": data}

    @classmethod
    def from_json(cls, inputs: Mapping[str, Any]) -> LaunchRequest:
        """From a run record's ``launch``; records of older versions kept the limits under other names
        and the pod settings beside the request."""
        req = dict(inputs["request"])
        if "limits" not in req:
            req["limits"] = {"max_steps": req.pop("steps", None), "max_hours": req.pop("hours", None),
                             "budget_usd": req.pop("budget_usd", None),
                             "price_per_hour_usd": req.pop("price_per_hour_usd", None),
                             "stall_minutes": req.pop("stall_minutes", None)}
        for old, new in (("python", "python"), ("image", "image"), ("disk", "disk_gb"),
                         ("ready_timeout", "ready_timeout_s")):
            if new not in req and inputs.get(old) is not None:
                req[new] = inputs[old]
        req["limits"] = Limits.from_json(req["limits"])
        req["data"] = str(req["data"]) if req.get("data") else None
        req["extra"] = tuple(req.get("extra") or ())
        req["env_names"] = tuple(str(n) for n in req.get("env_names") or ())
        req["hosts"] = tuple(req.get("hosts") or ())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in req.items() if k in known})


@dataclass(frozen=True)
class ResolvedLaunch:
    name: str
    provider: str
    profile: str
    phase: str
    model: ModelShape
    gpu_id: str | None
    gpu_name: str
    n_gpus: int
    micro_batch: int
    grad_accum: int
    steps: int
    seq_len: int
    fit: str
    trainer_config: Mapping[str, Any]
    workdir: str
    python: str
    command: str  # the exact line started on the pod, from <workdir>/code
    limits: Limits  # every field resolved: steps, price (when known), stall minutes
    planned: PlannedSpeed
    data: DataSource | None
    overrides: tuple[str, ...] = field(default_factory=tuple)
    on_end: str = DEFAULTS.on_end
    batch_note: str | None = None  # why the batch differs from the profile's, when it does
    volume: str | None = None  # the network volume asked for (its mount holds the run folder and data cache)
    volume_size_gb: int | None = None  # --volume-size: the GB of the volume created when there is none
    data_plan: Mapping[str, Any] | None = None  # datasource.json: what gpucli/pod/fetch.py does first
    disk: DiskNeed | None = None  # the checkpoints, data and headroom the run folder's disk must hold
    env_names: tuple[str, ...] = ()  # secrets by name, their values read when the env file is written
    own_code: bool = False  # the user's own code runs, not the bundled trainer
    nodes: int = 1  # machines, each with n_gpus (the price and limits are all of them together)
    link_gbps: float | None = None  # the nodes' link as given (--link-gbps)
    planned_one: PlannedSpeed | None = None  # one machine's plan (a run over several: before the link's share)
    preflight: str | None = ""  # as LaunchRequest.preflight
    store: str | None = None  # the checkpoints' store (gpucli.run.files.store): its URL, never its credentials
    keep_unhealthy: bool = False  # --force on this machine or an ssh host: a machine below the health bars runs
    mirror: bool = False  # as LaunchRequest.mirror

    @property
    def pod_disk_gb(self) -> int:
        """The disk a cloud pod is created with: ``--disk``, else the default grown to fit the run."""
        if self.disk is not None and self.disk.have_gb is not None and not self.volume:
            return max(DEFAULTS.disk_gb, math.ceil(self.disk.have_gb))
        return DEFAULTS.disk_gb

    @property
    def label(self) -> str:
        return f"gpucli-{self.name}"

    @property
    def price_per_hour_usd(self) -> float | None:
        return self.limits.price_per_hour_usd


def _profile_batch(profile: SingleProfile | ClusterProfile, phase_name: str, batch_scale: float
                   ) -> tuple[int, int]:
    """(samples per GPU per step, grad accum) as the profile gives them for the phase."""
    if isinstance(profile, ClusterProfile):
        pb = profile.phases.get(phase_name)
        if pb is None and "fast" in profile.phases:  # a phase the profile has no row for: its first phase's
            fast = profile.phases["fast"]  # batch, scaled as a single-GPU profile's is
            return max(1, round(fast.micro_batch * batch_scale)), fast.grad_accum
        if pb is None:
            raise UsageError(f"profile {profile.name} has no settings for phase '{phase_name}'",
                             hint=f"its phases: {', '.join(profile.phases)}")
        return pb.micro_batch, pb.grad_accum
    per_step = max(1, round(profile.batch_size * batch_scale))
    accum = profile.grad_accum
    return max(1, per_step // accum), accum


def _with_overrides(cfg: dict[str, Any], overrides: tuple[str, ...]) -> tuple[dict[str, Any], Any]:
    """run.yaml's mapping with the ``--section.key=value`` overrides written into it (so the file on
    the pod is the whole truth: a resume or a restart by hand runs the same thing), checked by the
    trainer's own config loader before anything is rented."""
    cfg = copy.deepcopy(cfg)
    try:
        for item in overrides:
            if not item.startswith("--") or "=" not in item:
                raise ConfigError(f"trainer override '{item}' must look like --section.key=value")
            key, value = parse_override(item)
            if key.split(".")[0] == "limits":  # a cap set here would override --budget/--hours behind their back
                raise UsageError(f"--set {key}: the run's caps and price are gpucli's to set",
                                 hint="use --budget, --hours, --steps (and --price for your own machine)")
            apply_override(cfg, key, value)
        checked = validated_config(copy.deepcopy(cfg))
        check_model(checked, ConfigError)
    except ConfigError as exc:
        raise UsageError(f"trainer config: {exc}",
                         hint="--set takes section.key=value, with the keys of the trainer's run.yaml") from None
    return cfg, checked


def resolve(catalog: Catalog, req: LaunchRequest, *, run_name: str) -> ResolvedLaunch:
    """Everything a launch will do, decided before any machine is touched."""
    target = get_target(req.provider)
    profile = catalog.profile(req.profile)
    phase = catalog.phase(req.phase)
    gpu = catalog.gpus[profile.gpu] if profile.gpu else None
    if target.needs_gpu and gpu is None:
        # Said here, so a --dry-run gives the same verdict as the launch, before any offer is searched.
        raise UsageError(f"profile {profile.name} has no GPU; {target.name} pods need a GPU profile",
                         hint="pick a GPU profile (gpucli profiles), or --provider local for a CPU run")
    n_gpus = profile.count
    preset = catalog.model(req.model or DEFAULTS.model_for(gpu is not None))
    overrides = tuple(req.extra)
    stages = run_stages(phase.stages, overrides)
    # Every --set first: the fit, the speed and the disk are planned on the model the trainer builds.
    model = resolved_model(preset, overrides)
    seq_len = model.max_seq_len
    samples, accum = _profile_batch(profile, phase.name, phase.batch_scale)
    fit = "cpu"
    micro = samples
    batch_note = None
    if gpu is not None:
        fr = choose_micro_batch(model, catalog.defaults, gpu.vram_gb, n_gpus, seq_len, chunks=stage_chunks(model, stages))
        if fr.fit is Fit.NO:
            raise NothingFitsError(
                f"model {model.name} does not fit on {n_gpus}x {gpu.name} even at micro-batch 1 "
                f"(needs {fr.memory.total_gb:.0f} GB per GPU)", hint="pick a larger profile or a smaller --model")
        fit = fr.fit.value
        micro, accum, batch_note = keep_global_batch(samples, accum, fr.memory.micro_batch)
    refusal = unsupported_message(model)
    if refusal:
        # never train a different model than the one planned (a RoPE preset with a position table)
        raise UsageError(refusal, hint="pick a preset the trainer builds (gpucli models) or set its fields with --set")
    limits = req.limits
    asked_steps = training_overrides(overrides).get("max_steps")
    # Without --steps, a two-stage run goes through both stages (never the fast phase's iterations).
    steps = limits.max_steps or (asked_steps if isinstance(asked_steps, int) else None) or (
        stages.steps if stages else phase.iterations)
    val_interval = req.val_interval or max(10, steps // 20)
    # --checkpoint-every 1h replaces the default step interval (the $1000 8x H100 setup guide saves hourly, nothing else)
    ckpt_interval = req.checkpoint_interval or (steps if req.checkpoint_every_s else max(val_interval, steps // 10))
    price = limits.price_per_hour_usd
    if price is None and gpu is not None:
        p = choose_price(catalog.prices_for(gpu.id), n_gpus, "spot" if req.spot else "on-demand",
                         target.name if target.cloud else None)  # the provider's own price, never another's
        price = p.usd_per_gpu_hour * n_gpus * req.nodes if p else None  # every node bills
    if limits.budget_usd is not None and not price:
        raise UsageError("--budget needs a price per hour", hint="pass --price USD_PER_HOUR for this machine")
    limits = limits.with_(price_per_hour_usd=price, stall_minutes=limits.stall_minutes or DEFAULTS.stall_minutes,
                          idle_stop_minutes=DEFAULTS.idle_stop_minutes if limits.idle_stop_minutes is None
                          else limits.idle_stop_minutes,
                          slow_below=DEFAULTS.slow_below if limits.slow_below is None else limits.slow_below)
    source = parse_data(req.data) if req.data else None
    if req.workdir:
        workdir = req.workdir.rstrip("/")
    elif req.volume:  # the run folder on the volume: checkpoints survive a stopped or lost pod
        workdir = f"{volume_mount()}/gpucli-runs/{run_name}"
    else:
        workdir = target.default_workdir(run_name)
    py = req.python or target.default_python()
    cfg: dict[str, Any] = {
        # The preset by name: the trainer builds it from the same description the planner counted
        # (trainer/spec/presets.py), every field included; `--set model.X=...` still overrides one field.
        "model": {"preset": preset.name, "max_seq_len": preset.max_seq_len},
        "training": {
            "out_dir": "..", "batch_size": micro, "grad_accum_steps": accum, "max_steps": steps,
            "learning_rate": phase.matrix_lr, "embedding_lr": phase.embedding_lr,
            "min_lr": phase.matrix_lr / 10, "warmup_steps": max(1, min(100, steps // 20)),
            "val_interval": val_interval, "checkpoint_interval": ckpt_interval, "seq_len": seq_len,
            "log_interval": max(1, min(10, steps // 100)),
            **({"checkpoint_every_s": req.checkpoint_every_s} if req.checkpoint_every_s else {}),
        },
        "limits": limits.run_yaml(),
        "hardware": {"device": "cpu" if gpu is None else "cuda",
                     "mixed_precision": bool(getattr(profile, "bf16", True)),
                     "compile": bool(getattr(profile, "compile", gpu is not None))},
        "data": {"dir": "../data/prepared", "inputs": [source.pod_input] if source else [],
                 "progress_file": "../prepare.jsonl"},
        "notifications": {"telegram": {"enabled": True}},
    }
    knobs = {k: v for k, v in (("supervision_weight_base", phase.supervision_weight_base),
                                ("improvement_reward_scale", phase.improvement_reward_scale)) if v is not None}
    if stages is not None:
        cfg["training"].update(stage1_steps=stages.stage1_steps, stage2_steps=stages.stage2_steps)
        if model.memory:  # the chunk sizes are the memory's (the trainer refuses them without one)
            cfg["training"].update({k: v for k, v in (("stage1_chunk_size", stages.stage1_chunk_size),
                                                      ("stage2_chunk_size", stages.stage2_chunk_size)) if v})
    if getattr(model, "refine_steps", 0) and knobs:
        cfg["training"]["refinement"] = knobs  # the phase's (the cloud training guide's) refinement loss weights
    if gpu is None and not req.data:
        cfg["data"]["max_bytes"] = 8_000_000
    cfg, checked = _with_overrides(cfg, overrides)
    if checked.tracking.backend != "none" and not checked.tracking.run_name:
        cfg.setdefault("tracking", {})["run_name"] = run_name  # the tracker's run is named as gpucli's
    # What the trainer will really do once the overrides are in: the plan, limits and record follow it.
    micro, accum, seq_len = checked.training.batch_size, checked.training.grad_accum_steps, checked.training.seq_len
    if gpu is not None:
        t = checked.training
        run_chunks = tuple(c for c in (t.stage1_chunk_size or 2048, t.stage2_chunk_size) if c) if model.memory else ()
        check_fit(catalog, model, gpu, n_gpus, fit, micro, seq_len, run_chunks)
    steps = checked.resolved_max_steps()
    set_limits = {k: v for k, v in (cfg.get("limits") or {}).items() if k in limits.run_yaml()}
    limits = limits.with_(max_steps=steps, **set_limits).checked()
    price = limits.price_per_hour_usd
    trainer_args = "--config ../run.yaml --resume auto"
    if req.nodes > 1:  # a rule: several machines meet at a rendezvous on rank 0; one needs none (--standalone)
        cmd = trainer_command(py, req.nodes, max(1, n_gpus), run_name, fetch=None)
    elif n_gpus > 1:
        cmd = (f"{shlex.quote(py)} -m torch.distributed.run --standalone --nproc_per_node={n_gpus} "
               f"-m trainer.train {trainer_args}")
    else:
        cmd = f"{shlex.quote(py)} -m trainer.train {trainer_args}"
    data_plan = None
    if source is not None:
        # Fetch and prepare first, in the trainer's process group: the watchdog limits both.
        data_plan = pod_plan(source, dataclasses.asdict(checked.data), python=py,
                             cache_root=volume_mount() if req.volume else None)
        # The trainer's clock starts when the fetch does (trainer.loop.entry.work_started_at): preparing
        # the data counts against --hours and --budget in its clean stop too, not only the watchdog's.
        fetch = f"{shlex.quote(py)} ../fetch.py --spec ../datasource.json"
        cmd = trainer_command(py, req.nodes, max(1, n_gpus), run_name, fetch=fetch) if req.nodes > 1 else \
            f"{fetch} && {cmd}"
        cmd = f"export {JOB_STARTED_ENV}=$(date +%s) && {cmd}"
    planned = _planned(catalog, model, gpu.id if gpu else None, n_gpus, steps, micro, accum, seq_len,
                       price / req.nodes if price else price,
                       run_stages(None, tuple(f"--training.{k}={v}" for k, v in cfg["training"].items())))
    planned_one = planned  # one machine's speed, times the nodes, at the inter-node link's efficiency (again
    if req.nodes > 1:  # once the link is measured: gpucli/run/host/linkprobe.py)
        planned = planned_across(planned, model, req.nodes, req.provider, req.link_gbps,
                                 float(micro * accum * n_gpus * seq_len), price)
    disk = _disk_need(checked, model, gpu.vram_gb if gpu else None, n_gpus, target, req, workdir, source,
                      checkpoints_planned(checked, steps, planned.hours, limits))
    return ResolvedLaunch(
        name=run_name, provider=target.name, profile=profile.name, phase=phase.name, model=model,
        gpu_id=gpu.id if gpu else None, gpu_name=gpu.name if gpu else "CPU", n_gpus=n_gpus, micro_batch=micro,
        grad_accum=accum, steps=steps, seq_len=seq_len, fit=fit, trainer_config=cfg, workdir=workdir, python=py,
        command=cmd, limits=limits, planned=planned, data=source, overrides=overrides,
        on_end=req.on_end or DEFAULTS.on_end, batch_note=batch_note, volume=req.volume,
        volume_size_gb=req.volume_size_gb, data_plan=data_plan, disk=disk, env_names=req.env_names, nodes=req.nodes,
        link_gbps=req.link_gbps, planned_one=planned_one, preflight=req.preflight,
        store=req.store, mirror=req.mirror, keep_unhealthy=req.force and not target.cloud)


def _planned(catalog: Catalog, model: ModelShape, gpu_id: str | None, n_gpus: int, steps: int, micro: int,
             accum: int, seq_len: int, price: float | None, stages: Any = None) -> PlannedSpeed:
    """What the planner predicts for this run (GPU setups only), kept for plan-against-actual."""
    if gpu_id is None:
        return PlannedSpeed(source="no prediction for CPU runs")
    tokens = float(steps * micro * accum * n_gpus * seq_len)
    req = PlanRequest(model=model, today=dt.date.today(), tokens=tokens)
    setup = Setup(catalog.gpus[gpu_id], n_gpus, PriceQuote((price or 0) / n_gpus, "on-demand", "launch", "", None, False))
    # Each stage at its own memory chunk: time goes with FLOPs, so the steps' shares weigh them.
    shares = stages.shares() if stages is not None and model.memory else ((1.0, None),)
    flops = sum(share * speed_flops_per_token(model, seq_len, chunk) for share, chunk in shares)
    est = estimate_train(catalog, req, setup, tokens, seq_len, flops)
    return PlannedSpeed(tokens_per_s=est.tokens_per_s, hours=est.hours,
                        cost_usd=est.cost_usd if price else None, source=est.speed_source)


# -- the disk check ------------------------------------------------------------------------------------

_TOKEN_BYTES = 2.2  # prepared bytes per byte of text at most: a uint16 token per byte (byte tokenizer) + line index


def folder_bytes(path: Any) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                continue
    return total


def _data_gb(source: DataSource | None, checked: Any) -> float | None:
    """The data the run folder's disk holds: the raw text uploaded (a local --data folder) and its tokens.
    None where the size is not known before the launch (URLs, Hugging Face, a pod path)."""
    cap = checked.data.max_bytes
    if source is None:  # the demo corpus: read on the pod, only its tokens are written
        return _TOKEN_BYTES * (cap if cap is not None else DEMO_MAX_BYTES) / 1e9
    if source.kind == "local" and source.local is not None:
        raw = folder_bytes(source.local)
        return (raw + _TOKEN_BYTES * (raw if cap is None else min(raw, cap))) / 1e9
    return None


def _free_gb(workdir: str) -> tuple[float, str]:
    """Free space of the disk ``workdir`` will be on (its nearest existing folder)."""
    p = Path(workdir).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free / 1e9, f"free space on {p}"


def _disk_need(checked: Any, model: ModelShape, vram_gb: float | None, n_gpus: int, target: Any,
               req: LaunchRequest, workdir: str, source: DataSource | None,
               written: tuple[int, str] | None = None) -> DiskNeed:
    """The run's checkpoints (its own model, optimizer, keep_last, GPU count and sharding), data and
    headroom, against the disk its folder will be on where that is known before renting."""
    spec = run_spec(checked, UsageError) or model
    t, hw = checked.training, checked.hardware
    # FSDP as trainer.loop.dist.want_fsdp decides it: asked for, or 16 bytes a parameter past half a GPU.
    sharded = hw.fsdp == "on" or (hw.fsdp == "auto" and n_gpus > 1 and vram_gb is not None
                                  and 16 * spec.param_count().total > 0.5 * vram_gb * 1e9)
    ck = checkpoint_disk(spec, keep_last=t.keep_last, optimizer=t.optimizer, n_gpus=n_gpus, sharded=sharded)
    have: float | None
    if req.volume:
        have, where = None, f"network volume {req.volume}"  # its size comes with the lookup (check_disk)
    elif target.cloud and req.disk_gb:
        have, where = float(req.disk_gb), f"--disk {req.disk_gb} GB"
    elif target.cloud:  # no --disk: the pod's disk is the default, grown to what the run needs
        data = _data_gb(source, checked)
        need = disk_need(ck, keep_last=t.keep_last, data_gb=data, have_gb=None, where="").need_gb
        size = max(DEFAULTS.disk_gb, math.ceil(need))
        have = float(size)
        where = (f"the default --disk {size} GB" if size == DEFAULTS.disk_gb else
                 f"--disk {size} GB (the default {DEFAULTS.disk_gb} GB grown to hold the checkpoints)")
    elif target.caps.this_machine:
        have, where = _free_gb(workdir)
    else:
        have, where = None, "the host's disk"  # known once connected: the trainer checks before each checkpoint
    n, note = written or (None, "")
    return disk_need(ck, keep_last=t.keep_last, data_gb=_data_gb(source, checked), have_gb=have, where=where,
                     written=n, written_note=note)


def check_disk(r: ResolvedLaunch, *, volume_gb: float | None = None) -> None:
    """A UsageError, before anything is rented, when the run folder's disk cannot hold the checkpoints
    the keep-policy has at once, the data and some headroom. ``volume_gb``: the size of the network
    volume the run folder is on, once it has been looked up."""
    need = r.disk
    if need is None:
        return
    if volume_gb is not None:
        need = dataclasses.replace(need, have_gb=float(volume_gb), where=f"network volume {r.volume} ({volume_gb:g} GB)")
    if need.fits is not False:
        return
    c = need.checkpoints
    data = "data size unknown" if need.data_gb is None else f"{need.data_gb:.1f} GB of data"
    keep = need.keep_last_that_fits()
    lower = (f"lower training.keep_last (--set training.keep_last={keep} fits)" if keep else
             "a smaller --model (not even training.keep_last=1 fits)")
    if r.volume:
        fix = f"use a network volume of at least {math.ceil(need.need_gb)} GB, or {lower}"
    elif get_target(r.provider).caps.this_machine:
        fix = f"free some space there or pass --workdir on a larger disk, or {lower}"
    else:
        fix = f"pass --disk {math.ceil(need.need_gb)}, or {lower}"
    raise UsageError(f"{need.where} cannot hold this run: {c.at_once} checkpoints of {c.checkpoint_gb:.1f} GB "
                     f"(keep_last {need.keep_last} + the best + the one being written) + {data} + "
                     f"{need.headroom_gb:.1f} GB headroom = {need.need_gb:.1f} GB", hint=fix)
