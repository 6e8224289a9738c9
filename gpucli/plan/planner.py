"""Pure planning: setups -> time and cost -> the exact Pareto front, dominated setups, picks.

No I/O, no clock, no printing. ``today`` comes in with the request so price ages are reproducible.
The front itself is ``pareto.py`` (re-exported here: ``pareto_front``, ``dominates``, ``Front``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from gpucli.errors import NothingFitsError, UsageError
from gpucli.plan.catalog import CalibrationEntry, Catalog, Gpu, ModelShape, Price
from gpucli.plan.disk import CheckpointDisk, checkpoint_disk
from gpucli.plan.estimate import (
    Fit,
    PrepareEstimate,
    choose_micro_batch,
    count_params,
    modelled_mfu,
    prepare_estimate,
    scaling_efficiency,
    speed_flops_per_token,
    train_flops_per_token,
    train_tokens_per_s,
)
from gpucli.plan.pareto import Front, dominates, pareto_front
from gpucli.plan.serving import ORDERS, generate_assumptions, generate_run
from trainer.spec.environment import cuda_tuple, newest_build_cuda, pins, wheel_min_cuda

__all__ = [
    "DEFAULT_COUNTS", "MFU_CEILING", "BudgetView", "Estimate", "Front", "Picks", "Plan",
    "PlanRequest", "PriceQuote", "Setup", "catalog_setups", "choose_price", "dominates", "estimate_generate",
    "estimate_train", "make_plan", "pareto_front",
]

DEFAULT_COUNTS = (1, 2, 4, 8)


# --------------------------------------------------------------------------------------------------
# Requests, setups, estimates


@dataclass(frozen=True)
class PriceQuote:
    usd_per_gpu_hour: float
    kind: str
    source: str
    as_of_text: str
    age_days: int | None
    stale: bool
    provider: str | None = None
    usd_per_gpu_hour_high: float | None = None
    offer_id: str | None = None  # a live offer

    @property
    def age_text(self) -> str:
        if self.offer_id is not None:
            return "live"
        if self.age_days is None:
            return "undated"
        if self.age_days < 60:
            return f"{self.age_days} d"
        return f"{self.age_days / 30.44:.0f} mo"


@dataclass(frozen=True)
class Setup:
    gpu: Gpu
    n_gpus: int
    price: PriceQuote

    @property
    def label(self) -> str:
        return f"{self.n_gpus}x {self.gpu.name}"

    @property
    def usd_per_hour(self) -> float:
        return self.price.usd_per_gpu_hour * self.n_gpus


@dataclass(frozen=True)
class PlanRequest:
    model: ModelShape
    today: dt.date
    workload: str = "train"  # train | generate
    tokens: float | None = None  # None: tokens_per_param x params (train); required for generate
    tokens_per_param: float = 20.0
    seq_len: int | None = None
    spot: bool = False
    gpus: tuple[str, ...] = ()  # GPU ids to consider; empty = all
    max_gpus: int = 8
    counts: tuple[int, ...] = DEFAULT_COUNTS
    budget_usd: float | None = None
    deadline_hours: float | None = None
    price_per_gpu_hour: float | None = None  # override every price (e.g. a quote the user has)
    mfu: float | None = None  # override the MFU (training)
    tokenizer: str = "byte"  # how the corpus is tokenized on the pod: sets the preparation rate
    pod_cpu_cores: int | None = None  # the pod's cores for preparation (default estimate.POD_CPU_CORES)
    more_models: tuple[ModelShape, ...] = ()  # generation: the other models sharing the tokens
    order: str = "parallel"  # generation with several models: parallel (side by side) or sequence
    context_tokens: int | None = None  # generation: tokens of context a sequence (default: the catalogue's)
    stages: tuple[tuple[float, int | None], ...] = ()  # training: (share of the tokens, memory chunk) a stage
    tokens_from: str = "--tokens"  # how --tokens was counted ("50,000 examples x 3 epochs x 512 tokens")
    provider: str | None = None  # plan with this provider's catalogue prices (else surveys'), never another's

    @property
    def chunks(self) -> tuple[int, ...]:
        """The memory's chunk size in each stage (a memory model's fit is checked at each)."""
        return tuple(c for _, c in self.stages if c) if self.model.memory else ()

    @property
    def models(self) -> tuple[ModelShape, ...]:
        return (self.model, *self.more_models)


@dataclass(frozen=True)
class Estimate:
    setup: Setup
    fit: Fit
    memory_gb: float
    micro_batch: int | None
    tokens_per_s: float
    speed_source: str
    mfu: float | None
    hours: float
    cost_usd: float

    @property
    def point(self) -> tuple[float, float]:
        return (self.hours, self.cost_usd)

    @property
    def runs(self) -> bool:
        return self.fit is not Fit.NO


@dataclass(frozen=True)
class BudgetView:
    """What a budget buys on one setup: hours of renting and the tokens trained in them."""

    estimate: Estimate
    hours: float
    tokens: float
    finishes: bool  # the budget covers the whole token budget


@dataclass(frozen=True)
class Picks:
    cheapest: Estimate | None
    fastest: Estimate | None
    best_value: Estimate | None  # front member minimising cost/min_cost + hours/min_hours
    within_budget: Estimate | None  # fastest with cost <= budget
    within_deadline: Estimate | None  # cheapest with hours <= deadline
    within_both: Estimate | None  # cheapest meeting both


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    params: int
    tokens: float
    tokens_note: str
    seq_len: int
    flops_per_token: float
    estimates: tuple[Estimate, ...]
    front: tuple[Estimate, ...]
    dominated: tuple[tuple[Estimate, Estimate], ...]
    unfit: tuple[Estimate, ...]
    picks: Picks
    budget_views: tuple[BudgetView, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    disk: CheckpointDisk | None = None  # checkpoints of a training run (None for generation)
    prepare: PrepareEstimate | None = None  # training: preparing the tokens on the pod before it starts


# --------------------------------------------------------------------------------------------------


def _quote(price: Price, today: dt.date, stale_after_days: int) -> PriceQuote:
    age = price.age_days(today)
    return PriceQuote(
        usd_per_gpu_hour=price.usd_per_gpu_hour, kind=price.kind, source=price.source,
        as_of_text=price.as_of_text, age_days=age, stale=age is None or age > stale_after_days,
        provider=price.provider,
        usd_per_gpu_hour_high=(None if price.usd_per_hour_high is None else
                               price.usd_per_hour_high / (price.count if price.per == "node" and price.count else 1)))


def choose_price(prices: Sequence[Price], n_gpus: int, kind: str, provider: str | None = None) -> Price | None:
    """The price a setup is planned with: the newest dated one that applies, then the cheapest.

    Per-GPU prices apply to any count; a whole-machine price only to its own count. ``provider``: only
    that provider's prices, else the ones that name no provider (surveys), never another provider's.
    """
    usable = [p for p in prices if p.kind == kind and (p.per == "gpu" or p.count == n_gpus)]
    if provider is not None:
        usable = [p for p in usable if p.provider == provider] or [p for p in usable if p.provider is None]
    if not usable:
        return None
    return min(usable, key=lambda p: (-(p.as_of.toordinal() if p.as_of else 0), p.usd_per_gpu_hour))


def catalog_setups(catalog: Catalog, request: PlanRequest) -> list[Setup]:
    """Every (GPU, count) of the catalogue that has a price of the requested kind."""
    kind = "spot" if request.spot else "on-demand"
    wanted = {catalog.gpu(g).id for g in request.gpus} if request.gpus else None
    counts = sorted({c for c in request.counts if 1 <= c <= request.max_gpus})
    setups = []
    for gpu in catalog.gpus.values():
        if wanted is not None and gpu.id not in wanted:
            continue
        prices = catalog.prices_for(gpu.id)
        for n in counts:
            if request.price_per_gpu_hour is not None:
                quote = PriceQuote(request.price_per_gpu_hour, kind, "--price", "given", None, False)
            else:
                price = choose_price(prices, n, kind, request.provider)
                if price is None:
                    continue
                quote = _quote(price, request.today, catalog.defaults.stale_after_days)
            setups.append(Setup(gpu=gpu, n_gpus=n, price=quote))
    return setups


# How MFU moves from a measured setup to another shape or GPU: by the ratio of the two setups'
# modelled MFU (estimate.modelled_mfu, a step-time model from the trainer's H100 kernel profile).
# Unfitted to nanoGPT's pair, it gives 1.26x from its 124M point (42.0 %) to its 1.31B (53.8 %:
# 1.28x); the plain FLOPs/token power law it replaced left 124M, 300m and 25m 14-21 % off in a
# leave-one-out over the trainer's six H100 measurements (BENCHMARKS.md).
MFU_CEILING = 0.80  # the dense matmul peak itself is 77-81 % of the datasheet figure on an H100


def _same_shape(a: ModelShape, b: ModelShape) -> bool:
    return (a.d_model, a.n_layers, a.n_heads, a.d_ff, a.vocab_size) == (b.d_model, b.n_layers, b.n_heads, b.d_ff,
                                                                         b.vocab_size)


def _entry_shape(catalog: Catalog, entry: CalibrationEntry) -> ModelShape | None:
    return entry.shape or catalog.models.get(entry.model)


def _train_speed(catalog: Catalog, request: PlanRequest, setup: Setup, flops: float) -> tuple[float, float, str]:
    """(tokens/s, MFU, where it came from), from the closest measured entry of the bundled trainer:

    1. same GPU, same shape and sequence length, same GPU count: the measured tokens/s;
    2. same GPU and shape, another count: its MFU, rescaled by the data-parallel efficiency;
    3. same GPU, another shape: its MFU x the ratio of the two setups' modelled MFU (step-time model:
       matmuls and attention at their shares of peak, pointwise and loss bytes over bandwidth);
    4. another GPU of the same architecture, then any GPU: the entry's MFU (moved by the shape rule),
       said so;
    5. no entry: the catalogue default MFU.
    Each step says which entry it used and how far it had to reach. Between equally close entries the
    one added last wins: the user's own file comes after the bundled one, and both are appended to.
    """
    d = catalog.defaults
    gpu, n = setup.gpu, setup.n_gpus
    if request.mfu is not None:
        return train_tokens_per_s(flops, gpu, n, request.mfu, d), request.mfu, "--mfu"
    seq = request.seq_len or request.model.max_seq_len
    scored = []
    for i, e in enumerate(catalog.calibration):
        if e.workload != "train":
            continue
        shape = _entry_shape(catalog, e)
        if shape is None:
            continue
        e_seq = e.seq_len or shape.max_seq_len
        e_flops = speed_flops_per_token(shape, e_seq)
        e_gpu = catalog.gpus[e.gpu]
        mfu = e.mfu if e.mfu is not None else e.tokens_per_s * e_flops / (
            e.gpu_count * e_gpu.bf16_dense_tflops * 1e12 * scaling_efficiency(e.gpu_count, e_gpu.interconnect, d))
        same_shape = _same_shape(shape, request.model) and e_seq == seq
        same_gpu = e.gpu == gpu.id
        same_arch = e_gpu.architecture == gpu.architecture
        rank = (0 if same_gpu else 1 if same_arch else 2, 0 if same_shape else 1,
                abs(math.log(flops / e_flops)), 0 if e.gpu_count == n else 1, -i)
        scored.append((rank, e, shape, e_flops, mfu))
    if not scored:
        mfu = gpu.train_mfu or d.train_mfu
        source = f"MFU {mfu:.0%} for {gpu.name} (gpus.yaml)" if gpu.train_mfu else d.train_mfu_source
        return train_tokens_per_s(flops, gpu, n, mfu, d), mfu, source
    scored.sort(key=lambda x: x[0])
    (gpu_rank, shape_rank, _, count_rank, _), e, shape, e_flops, e_mfu = scored[0]
    what = f"{e.source} ({e.date}): {shape.name} on {e.gpu_count}x {catalog.gpus[e.gpu].name}"
    if gpu_rank == 0 and shape_rank == 0 and count_rank == 0:
        mfu = e_mfu
        return e.tokens_per_s, mfu, f"measured: {what}"
    # The entry's own data-parallel efficiency is divided out so the GPU count is modelled once.
    e_gpu = catalog.gpus[e.gpu]
    mfu = e_mfu / scaling_efficiency(e.gpu_count, e_gpu.interconnect, d)
    notes = []
    if count_rank:
        notes.append(f"from {e.gpu_count} GPU{'s' if e.gpu_count != 1 else ''} to {n}")
    if shape_rank or gpu_rank:
        # The step-time model (matmuls and attention at their shares of the peak, pointwise and loss bytes
        # over the memory bandwidth) on each side: another shape, and for another GPU its own peak and
        # bandwidth, so a GPU with less bandwidth for its FLOPs gets a lower MFU. An estimate, said so.
        e_gpu_spec = catalog.gpus[e.gpu]
        moved = (modelled_mfu(request.model, seq, gpu)
                 / modelled_mfu(shape, e.seq_len or shape.max_seq_len, e_gpu_spec))
        mfu *= moved
        why = []
        if shape_rank:
            why.append(f"{flops / e_flops:.2g}x the FLOPs/token")
        if gpu_rank:
            why.append(f"another GPU, estimated for {gpu.name}: roofline of its {gpu.bf16_dense_tflops:g} TFLOP/s and "
                       f"{gpu.memory_bandwidth_gbps:g} GB/s against the measured GPU's"
                       + ("" if gpu_rank == 1 else ", another architecture"))
        notes.append(f"x{moved:.2f} by the step-time model ({'; '.join(why)})")
    mfu = min(MFU_CEILING, max(0.01, mfu))
    tps = train_tokens_per_s(flops, gpu, n, mfu, d)
    return tps, mfu, f"MFU {mfu:.0%} from {what}" + (f" ({'; '.join(notes)})" if notes else "")


def estimate_train(catalog: Catalog, request: PlanRequest, setup: Setup, tokens: float, seq_len: int,
                   flops: float, memo: dict | None = None, setup_hours: float = 0.0) -> Estimate:
    """One setup's estimate. ``memo`` shares the work between setups of the same GPU and count
    (thousands of live offers are a few dozen distinct (GPU, count) pairs); ``setup_hours``: billed
    before the first step (the trainer's environment built on a cold pod)."""
    key = (setup.gpu.id, setup.n_gpus)
    if memo is not None and key in memo:
        fr, (tps, mfu, source) = memo[key]
    else:
        fr = choose_micro_batch(request.model, catalog.defaults, setup.gpu.vram_gb, setup.n_gpus, seq_len,
                                chunks=request.chunks)
        tps, mfu, source = _train_speed(catalog, request, setup, flops)
        if memo is not None:
            memo[key] = (fr, (tps, mfu, source))
    hours = tokens / tps / 3600.0 + setup_hours
    return Estimate(setup=setup, fit=fr.fit, memory_gb=fr.memory.total_gb,
                    micro_batch=fr.memory.micro_batch if fr.fit is not Fit.NO else None,
                    tokens_per_s=tps, speed_source=source, mfu=mfu, hours=hours,
                    cost_usd=hours * setup.usd_per_hour)


def estimate_generate(catalog: Catalog, request: PlanRequest, setup: Setup, tokens: float) -> Estimate:
    """A serving engine per GPU (gpucli/plan/serving.py): the batch the VRAM left after the weights
    holds, weights read once a step for the whole batch; several models side by side or in turn."""
    measured = []
    for m in request.models:
        hits = [e for e in catalog.calibration if e.workload == "generate" and e.gpu == setup.gpu.id
                and e.model == m.name]
        measured.append(hits[-1] if hits else None)
    run = generate_run(request.models, setup.gpu, setup.n_gpus, tokens, catalog.defaults, order=request.order,
                       context=request.context_tokens,
                       measured_tps=[e.tokens_per_s if e else None for e in measured])
    first, e0 = run.speeds[0], measured[0]
    if e0 is not None:
        source = f"measured: {e0.source} ({e0.date})"
    else:
        source = f"serving roofline: {first.describe(setup.gpu, catalog.defaults)}"
    if len(request.models) > 1:
        source += f"; {run.layout}"
    return Estimate(setup=setup, fit=Fit.FITS if run.fits else Fit.NO,
                    memory_gb=max(s.memory.total_gb for s in run.speeds),
                    micro_batch=min(s.batch for s in run.speeds) if run.fits else None,
                    tokens_per_s=run.tokens_per_s, speed_source=source, mfu=None, hours=run.hours,
                    cost_usd=run.hours * setup.usd_per_hour)


def _picks(runnable: Sequence[Estimate], front: Sequence[Estimate], request: PlanRequest) -> Picks:
    if not runnable:
        return Picks(None, None, None, None, None, None)
    cheapest = min(runnable, key=lambda e: (round(e.cost_usd, 6), e.hours))
    fastest = min(runnable, key=lambda e: (round(e.hours, 6), e.cost_usd))
    min_cost = max(cheapest.cost_usd, 1e-12)
    min_hours = max(fastest.hours, 1e-12)
    best_value = min(front, key=lambda e: e.cost_usd / min_cost + e.hours / min_hours)
    budget, deadline = request.budget_usd, request.deadline_hours
    in_budget = [e for e in runnable if budget is not None and e.cost_usd <= budget + 1e-9]
    in_deadline = [e for e in runnable if deadline is not None and e.hours <= deadline + 1e-9]
    both = [e for e in in_budget if deadline is not None and e.hours <= deadline + 1e-9]
    return Picks(
        cheapest=cheapest, fastest=fastest, best_value=best_value,
        within_budget=min(in_budget, key=lambda e: (e.hours, e.cost_usd)) if in_budget else None,
        within_deadline=min(in_deadline, key=lambda e: (e.cost_usd, e.hours)) if in_deadline else None,
        within_both=min(both, key=lambda e: (e.cost_usd, e.hours)) if both else None)


def make_plan(catalog: Catalog, request: PlanRequest, setups: Sequence[Setup] | None = None) -> Plan:
    """Estimate every setup, then split them into the front, the dominated and the ones that do not fit."""
    if request.workload not in ("train", "generate"):
        raise UsageError(f"unknown workload '{request.workload}'", hint="use train or generate")
    if request.order not in ORDERS:
        raise UsageError(f"unknown order '{request.order}'", hint="use parallel or sequence")
    if request.more_models and request.workload != "generate":
        raise UsageError("several models are planned for --workload generate only",
                         hint="plan one model at a time for training")
    params = count_params(request.model).total
    seq_len = request.seq_len or request.model.max_seq_len
    notes: list[str] = []
    if request.tokens is not None:
        tokens = float(request.tokens)
        tokens_note = f"{_si(tokens)} tokens ({request.tokens_from})"
    elif request.workload == "generate":
        raise UsageError("--workload generate needs --tokens N (how many tokens to generate)")
    else:
        tokens = request.tokens_per_param * params
        tokens_note = (f"{_si(tokens)} tokens = {request.tokens_per_param:g} tokens/param x {_si(params)} params"
                       + (" (Chinchilla)" if request.tokens_per_param == 20 else ""))
    flops = train_flops_per_token(request.model, seq_len)
    # The fp32 memory path at its rate; each stage at its own chunk (time goes with FLOPs: shares weigh them).
    speed_flops = sum(share * speed_flops_per_token(request.model, seq_len, chunk)
                      for share, chunk in (request.stages if request.model.memory and request.stages else ((1.0, None),)))
    if setups is None:
        setups = catalog_setups(catalog, request)
    if not setups:
        kind = "spot" if request.spot else "on-demand"
        raise NothingFitsError(f"no {kind} prices for the GPUs asked for",
                               hint="drop --gpu/--spot, raise --max-gpus, or pass --price USD")
    if request.workload == "train":
        setups, refused = _trainable(setups)
        notes.extend(refused)
        if not setups:
            raise NothingFitsError("no GPU asked for has kernels in the trainer's torch builds",
                                   hint="plan another GPU (--gpu)")
        memo: dict = {}
        # the pod's environment is built before the first step (a cold volume): once per run, on the bill
        env_h = catalog.defaults.env_build_minutes / 60.0
        estimates = [estimate_train(catalog, request, s, tokens, seq_len, speed_flops, memo, env_h) for s in setups]
    else:
        estimates = [estimate_generate(catalog, request, s, tokens) for s in setups]
    runnable = [e for e in estimates if e.runs]
    unfit = tuple(e for e in estimates if not e.runs)
    if not runnable:
        biggest = max(e.memory_gb for e in estimates)
        raise NothingFitsError(
            f"model {request.model.name} ({_si(params)} params) fits on none of the {len(estimates)} setups "
            f"considered (needs about {biggest:.0f} GB per GPU even at micro-batch 1)",
            hint="allow more GPUs with --max-gpus, larger GPUs with --gpu, or a shorter --seq-len")
    front = pareto_front(runnable, attrgetter("hours", "cost_usd"))
    if any(e.setup.price.stale for e in runnable) and not any(e.setup.price.offer_id for e in runnable):
        notes.append(f"* prices older than {catalog.defaults.stale_after_days} days (or undated) are stale; "
                     "`gpucli plan --live` uses current offers")
    prep = None
    if request.workload == "train":
        notes.extend(_environment_notes(catalog, front.members))
        prep = prepare_estimate(tokens, request.tokenizer, *((request.pod_cpu_cores,) if request.pod_cpu_cores else ()))
        cheapest = min(runnable, key=attrgetter("cost_usd"))
        notes.append(f"data preparation on the pod, before training: {_si(tokens)} tokens / "
                     f"({_si(prep.tokens_per_s_per_core)} tokens/s/core x {prep.cores} cores) = "
                     f"{prep.hours * 60:.1f} min ({prep.tokenizer} tokenizer), "
                     f"${prep.hours * cheapest.setup.usd_per_hour:.2f} on {cheapest.setup.label}; it runs under "
                     "the run's --hours/--budget (--explain SETUP shows it per setup)")
    if request.workload == "generate":
        notes.extend(generate_assumptions(catalog.defaults, request.models, request.tokens or 0.0, request.order,
                                          request.context_tokens))
    budget_views: tuple[BudgetView, ...] = ()
    if request.budget_usd is not None:
        budget_views = tuple(
            BudgetView(estimate=e, hours=request.budget_usd / e.setup.usd_per_hour,
                       tokens=request.budget_usd / e.setup.usd_per_hour * 3600 * e.tokens_per_s,
                       finishes=e.cost_usd <= request.budget_usd + 1e-9)
            for e in runnable if e.setup.usd_per_hour > 0)
    return Plan(request=request, params=params, tokens=tokens, tokens_note=tokens_note, seq_len=seq_len,
                flops_per_token=flops, estimates=tuple(estimates), front=front.members,
                dominated=front.dominated, unfit=unfit, picks=_picks(runnable, front.members, request),
                budget_views=budget_views, notes=tuple(notes), prepare=prep,
                disk=checkpoint_disk(request.model) if request.workload == "train" else None)


def _trainable(setups: Sequence[Setup]) -> tuple[list[Setup], list[str]]:
    """The setups whose GPU the trainer's pinned torch has kernels for (a GPU needing a newer CUDA than
    every pinned build is never recommended), and a note naming those left out."""
    newest = newest_build_cuda()
    out = [s for s in setups if not (newest and s.gpu.min_cuda and cuda_tuple(s.gpu.min_cuda) > cuda_tuple(newest))]
    gone = sorted({s.gpu.name for s in setups} - {s.gpu.name for s in out})
    return out, ([f"left out: {', '.join(gone)}: no kernels in the trainer's torch builds (CUDA {newest} "
                  "at most, trainer/requirements.txt)"] if gone else [])


def _environment_notes(catalog: Catalog, front: Sequence[Estimate]) -> list[str]:
    """What the plan's hours include for the trainer's environment, and which GPUs need a newer driver."""
    notes = [f"each setup's hours include {catalog.defaults.env_build_minutes:g} min for the trainer's pinned "
             f"environment (torch {pins().torch}), built once on the pod's volume (gpus.yaml env_build_minutes)"]
    needs: dict[str, list[str]] = {}
    for e in front:
        cuda = wheel_min_cuda(e.setup.gpu.min_cuda)
        if cuda and e.setup.gpu.min_cuda and cuda_tuple(e.setup.gpu.min_cuda) >= (12, 8):
            needs.setdefault(cuda, []).append(e.setup.gpu.name)
    for cuda, names in sorted(needs.items()):
        names = sorted(set(names))
        notes.append(f"{', '.join(names)} need{'s' if len(names) == 1 else ''} a host driver with CUDA {cuda}+ "
                     f"(torch's cu{cuda.replace('.', '')} build has their kernels): launches rent only such hosts")
    return notes


def _si(x: float) -> str:
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{suffix}"
    return f"{x:.3g}"
