"""`gpucli plan --explain SETUP`: the chain behind one setup's estimate, and every modelling constant
with its source or marked an assumption (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpucli.errors import UsageError
from gpucli.plan import estimate as est
from gpucli.plan import serving
from gpucli.plan.catalog import Catalog
from gpucli.plan.estimate import (
    PrepareEstimate,
    choose_micro_batch,
    count_params,
    scaling_efficiency,
    speed_flops_per_token,
)
from gpucli.plan.planner import MFU_CEILING, Estimate, Plan
from gpucli.plan.serving import serve_speed


@dataclass(frozen=True)
class Explanation:
    """The chain behind one setup's estimate, each step with its inputs (all numbers, no prose)."""

    setup: str
    params: int
    flop_params: int
    n_layers: int
    d_model: int
    seq_len: int
    flops_per_token: float
    peak_tflops: float
    n_gpus: int
    mfu: float | None
    scaling: float
    speed_source: str
    tokens_per_s: float
    tokens: float
    hours: float
    usd_per_gpu_hour: float
    price_source: str
    cost_usd: float
    memory: Any  # estimate.Memory for training, DecodeMemory for generation
    fit: str
    on_front: bool
    dominated_by: str | None
    prepare: PrepareEstimate | None = None  # data preparation on the pod before training
    prepare_cost_usd: float | None = None  # its hours at this setup's price
    speed_flops_per_token: float | None = None  # FLOPs/token at the BF16 peak's rate (fp32 memory path at its own)
    constants: tuple[tuple[str, str, str], ...] = ()  # (constant, value, its source or "assumption: ...")


def constants_used(catalog: Catalog, workload: str, interconnect: str) -> tuple[tuple[str, str, str], ...]:
    """Every modelling constant behind an estimate, with its source, or marked an assumption."""
    d = catalog.defaults
    common = (
        ("CUDA overhead", f"{d.cuda_overhead_gb:g} GB", "assumption: CUDA context and allocator slack"),
        ("usable VRAM", f"{d.usable_vram_fraction:.0%}", "assumption: headroom against fragmentation"),
    )
    if workload == "generate":
        return (
            ("weights and KV bytes", f"{d.decode_bytes_per_param:g} a value", "bf16 serving"),
            ("decode bandwidth", f"{d.decode_bandwidth_efficiency:.0%} of the datasheet",
             "vLLM, Llama-3.1-8B, one request on an A100 40GB: ~77 % (johnmusgrave.com 2025)"),
            ("decode matmuls", f"{serving.DECODE_MATMUL_EFFICIENCY:.0%} of the dense peak",
             serving.DECODE_MATMUL_EFFICIENCY_SOURCE),
            ("serving memory", f"{serving.SERVE_MEMORY_FRACTION:.0%} of VRAM", serving.SERVE_MEMORY_FRACTION_SOURCE),
            ("sequences at once", f"at most {serving.SERVE_MAX_SEQUENCES}", serving.SERVE_MAX_SEQUENCES_SOURCE),
            ("context", f"{d.decode_context_tokens} tokens", serving.CONTEXT_SOURCE),
            ("copies on several GPUs", f"{d.decode_parallel_efficiency:.0%} each",
             "the job's own estimate (copies share the host)"),
            ("I/O and loading", f"+{d.decode_io_overhead_fraction:.0%}, {d.decode_load_minutes:g} min a model",
             "the job's own estimate"),
        ) + common
    return (
        ("MFU ceiling", f"{MFU_CEILING:.0%}", "dense matmul peak 77-81 % of the datasheet on an H100 (BENCHMARKS.md)"),
        ("data-parallel scaling", f"x{d.scaling_per_doubling[interconnect]:g} per doubling ({interconnect})",
         "assumption: no multi-GPU measurement of the bundled trainer yet (gpucli calibrate adds one)"),
        ("step-time model", f"matmuls {est._MATMUL_SHARE_OF_PEAK:.0%} of peak, {est._POINTWISE_BYTES:g} B pointwise, "
                            f"{est._LOSS_BYTES_PER_LOGIT:g} B a logit",
         "torch.profiler kernel tables of the bundled trainer on an H100 SXM (BENCHMARKS.md); moves MFU between "
         "shapes and GPUs"),
        ("training state", f"{d.train_state_bytes_per_param:g} B a parameter",
         "fp32 weights and gradients, AdamW's two fp32 moments"),
        ("activations", "18d + 4f B a token a layer (SwiGLU 17d + 6f)",
         "Korthikanti et al. 2022 with flash attention; checked against the trainer's H100 peaks (+1..+13 %)"),
        ("Atlas memory activations", "fit in gpucli/plan/estimate.py",
         "the trainer's saved tensors on CPU, saved_tensors_hooks (scripts/measure_saved.py, max 2 % off)"),
        ("loss", f"{est.LOSS_CHUNK_ROWS} rows x vocabulary x {d.logits_bytes_per_token_vocab:g} B",
         "the fused loss keeps one chunk of logits (trainer/model/gpt.py)"),
        ("fp32 memory path", f"x{est.TF32_SLOWDOWN:g} its FLOPs", "TF32 peak is half the BF16 one (NVIDIA datasheets)"),
    ) + common


def find_estimate(plan: Plan, name: str) -> Estimate:
    """An estimate by its label ('8x H100 SXM'), forgiving case, spaces and the GPU's id ('8xh100-sxm')."""
    def norm(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    want = norm(name)
    for e in plan.estimates:
        if want in (norm(e.setup.label), norm(f"{e.setup.n_gpus}x{e.setup.gpu.id}"),
                    *(norm(f"{e.setup.n_gpus}x{a}") for a in e.setup.gpu.aliases)):
            return e
    raise UsageError(f"no setup '{name}' in this plan",
                     hint="setups look like '" + "', '".join(e.setup.label for e in plan.front[:3]) + "'")


def explain_setup(catalog: Catalog, plan: Plan, name: str) -> Explanation:
    e = find_estimate(plan, name)
    p = count_params(plan.request.model)
    if plan.request.workload == "train":
        memory: Any = choose_micro_batch(plan.request.model, catalog.defaults, e.setup.gpu.vram_gb,
                                         e.setup.n_gpus, plan.seq_len, chunks=plan.request.chunks).memory
    else:
        memory = serve_speed(plan.request.model, e.setup.gpu, catalog.defaults,
                             context=plan.request.context_tokens).memory
    dominated_by = next((by.setup.label for d, by in plan.dominated if d is e), None)
    q = e.setup.price
    return Explanation(
        setup=e.setup.label, params=p.total, flop_params=p.flop_params, n_layers=plan.request.model.n_layers,
        d_model=plan.request.model.d_model, seq_len=plan.seq_len, flops_per_token=plan.flops_per_token,
        peak_tflops=e.setup.gpu.bf16_dense_tflops, n_gpus=e.setup.n_gpus, mfu=e.mfu,
        scaling=scaling_efficiency(e.setup.n_gpus, e.setup.gpu.interconnect, catalog.defaults),
        speed_source=e.speed_source, tokens_per_s=e.tokens_per_s, tokens=plan.tokens, hours=e.hours,
        usd_per_gpu_hour=q.usd_per_gpu_hour, price_source=f"{q.source} ({q.age_text})", cost_usd=e.cost_usd,
        memory=memory, fit=e.fit.value, on_front=any(m is e for m in plan.front), dominated_by=dominated_by,
        prepare=plan.prepare, speed_flops_per_token=speed_flops_per_token(plan.request.model, plan.seq_len),
        constants=constants_used(catalog, plan.request.workload, e.setup.gpu.interconnect),
        prepare_cost_usd=plan.prepare.hours * e.setup.usd_per_hour if plan.prepare is not None else None)
