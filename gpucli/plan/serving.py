"""Generation as a serving engine does it (pure): many sequences decoded together, the weights read
once per decode step for the whole batch, a KV cache per sequence, compute-bound past the roofline's knee.

One decode step of a batch of ``B`` sequences, each holding ``c`` tokens of context on average:

    memory time  = (weight bytes + B x c x KV bytes per token) / (bandwidth x bandwidth efficiency)
    compute time = B x 2 x N / (dense peak x decode matmul efficiency)
    step time    = max(memory time, compute time)      (the roofline; B tokens per step)

``B`` is what the VRAM left after the weights holds: each sequence reserves its whole context of KV
cache (vLLM's PagedAttention allocates it as it grows; reserving the whole context is the safe side),
capped by the engine's limit on concurrent sequences. The knee is the batch past which the step is
compute-bound: more batch then adds no tokens/s.

Several models: ``parallel`` gives each model its own GPUs (a copy per GPU, models side by side, a
model queued behind another where there are fewer GPUs than models); ``sequence`` runs the models one
after another, each on every GPU. Either way each model is loaded once per GPU it runs on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpucli.plan.schema import Defaults, Gpu, ModelShape

GB = 1e9

ORDERS = ("parallel", "sequence")

# What a serving engine does, with where each number comes from (printed by `plan --workload generate`).
SERVE_MEMORY_FRACTION = 0.90
SERVE_MEMORY_FRACTION_SOURCE = "vLLM's default gpu_memory_utilization 0.9 (vLLM engine arguments)"
SERVE_MAX_SEQUENCES = 256
SERVE_MAX_SEQUENCES_SOURCE = "vLLM's default max_num_seqs 256 (vLLM engine arguments)"
DECODE_MATMUL_EFFICIENCY = 0.50
DECODE_MATMUL_EFFICIENCY_SOURCE = ("assumption: decode matmuls (B rows) at half the dense peak; the step is "
                                   "bandwidth-bound below the knee, so this moves only large batches")
CONTEXT_SOURCE = "a 512-token sample, prompt and output together, as the generation job was sized; --context changes it"


@dataclass(frozen=True)
class ServeMemory:
    """Per GPU, GB: the weights, the KV cache of the whole batch, overhead."""

    weights_gb: float
    kv_cache_gb: float  # batch x context x KV bytes a token
    overhead_gb: float
    kv_gb_per_sequence: float
    batch: int

    @property
    def total_gb(self) -> float:
        return self.weights_gb + self.kv_cache_gb + self.overhead_gb


@dataclass(frozen=True)
class ServeSpeed:
    """One copy of one model on one GPU."""

    model: str
    memory: ServeMemory
    fits: bool
    batch: int  # sequences decoded together
    knee_batch: float  # the batch past which a step is compute-bound (inf: never)
    step_s: float
    tokens_per_s: float
    bound: str  # memory | compute
    usable_gb: float

    def describe(self, gpu: Gpu, defaults: Defaults) -> str:
        m = self.memory
        return (f"{self.model}: batch {self.batch} ({m.kv_gb_per_sequence * 1e3:.0f} MB KV a sequence in "
                f"{self.usable_gb - m.weights_gb - m.overhead_gb:.1f} GB left after {m.weights_gb:.1f} GB of weights), "
                f"step {self.step_s * 1e3:.1f} ms, {self.bound}-bound (knee at batch "
                f"{'never' if math.isinf(self.knee_batch) else f'{self.knee_batch:.0f}'}); "
                f"{gpu.memory_bandwidth_gbps:.0f} GB/s x {defaults.decode_bandwidth_efficiency:.0%}, "
                f"{gpu.bf16_dense_tflops:g} TFLOP/s x {DECODE_MATMUL_EFFICIENCY:.0%}")


def kv_bytes_per_token(shape: ModelShape, bytes_per_value: float) -> float:
    """Keys and values of every layer for one token: 2 x layers x KV heads x head width x bytes."""
    return 2.0 * shape.n_layers * shape.kv_heads * shape.head_dim * bytes_per_value


def serve_speed(shape: ModelShape, gpu: Gpu, defaults: Defaults, *, context: int | None = None,
                max_sequences: int = SERVE_MAX_SEQUENCES, memory_fraction: float = SERVE_MEMORY_FRACTION,
                matmul_efficiency: float = DECODE_MATMUL_EFFICIENCY, bandwidth_gbps: float | None = None,
                peak_tflops: float | None = None) -> ServeSpeed:
    """Tokens/s of one copy of ``shape`` on ``gpu`` at the batch its VRAM holds (see the module doc).
    ``bandwidth_gbps``/``peak_tflops`` replace the GPU's datasheet figures (a measured CPU, say)."""
    ctx = context or defaults.decode_context_tokens
    b = defaults.decode_bytes_per_param
    n = shape.param_count()
    weights = n.total * b
    kv_token = kv_bytes_per_token(shape, b)
    kv_seq = kv_token * ctx
    usable = gpu.vram_gb * GB * memory_fraction
    overhead = defaults.cuda_overhead_gb * GB
    room = usable - weights - overhead
    batch = max(0, min(max_sequences, int(room // kv_seq))) if kv_seq > 0 else max_sequences
    fits = batch >= 1
    batch_used = max(1, batch)
    bw = (bandwidth_gbps or gpu.memory_bandwidth_gbps) * GB * defaults.decode_bandwidth_efficiency
    peak = (peak_tflops or gpu.bf16_dense_tflops) * 1e12 * matmul_efficiency
    flops_token = 2.0 * n.flop_params
    read_per_seq = kv_token * ctx / 2  # on average a sequence is half-way through its context
    mem_s = (weights + batch_used * read_per_seq) / bw
    comp_s = batch_used * flops_token / peak
    step = max(mem_s, comp_s)
    slope = flops_token / peak - read_per_seq / bw
    knee = weights / bw / slope if slope > 0 else math.inf
    memory = ServeMemory(weights_gb=weights / GB, kv_cache_gb=batch_used * kv_seq / GB, overhead_gb=overhead / GB,
                         kv_gb_per_sequence=kv_seq / GB, batch=batch_used)
    return ServeSpeed(model=shape.name or "model", memory=memory, fits=fits, batch=batch_used, knee_batch=knee,
                      step_s=step, tokens_per_s=batch_used / step, bound="compute" if comp_s >= mem_s else "memory",
                      usable_gb=usable / GB)


@dataclass(frozen=True)
class GenerateRun:
    """Several models' generation on one setup: hours, and how the GPUs were shared."""

    speeds: tuple[ServeSpeed, ...]  # one per model
    hours: float
    tokens_per_s: float  # all tokens / generation hours (loading left out)
    fits: bool
    order: str
    layout: str  # "4 models side by side, 1 GPU each", ...


def generate_run(models: Sequence[ModelShape], gpu: Gpu, n_gpus: int, tokens: float, defaults: Defaults, *,
                 order: str = "parallel", context: int | None = None,
                 measured_tps: Sequence[float | None] = ()) -> GenerateRun:
    """``tokens`` in all, shared equally between ``models``, on ``n_gpus`` x ``gpu``. ``measured_tps``:
    a measured tokens/s of one copy, per model (None: the roofline's). On several GPUs each copy runs
    at ``decode_parallel_efficiency`` of its own speed (the Pareto cost analysis's "~95 %": the host's CPU, PCIe and
    disk are shared)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    speeds = tuple(serve_speed(m, gpu, defaults, context=context) for m in models)
    eff = defaults.decode_parallel_efficiency if n_gpus > 1 else 1.0
    speeds = tuple(
        ServeSpeed(s.model, s.memory, s.fits, s.batch, s.knee_batch, s.step_s,
                   (measured if measured else s.tokens_per_s) * eff, "measured" if measured else s.bound, s.usable_gb)
        for s, measured in zip(speeds, list(measured_tps) + [None] * (len(speeds) - len(measured_tps)), strict=True))
    per_model = tokens / len(models)
    io = 1 + defaults.decode_io_overhead_fraction
    load_h = defaults.decode_load_minutes / 60.0
    fits = all(s.fits for s in speeds)
    if order == "sequence":
        gen_h = sum(per_model / (s.tokens_per_s * n_gpus) for s in speeds) / 3600.0
        hours = gen_h * io + load_h * len(models)
        layout = f"{len(models)} model{'s' if len(models) > 1 else ''} one after another, each on all {n_gpus} GPUs"
    else:
        # Models side by side: GPUs dealt out round-robin; a GPU with several models runs them in turn.
        gpu_models: list[list[int]] = [[] for _ in range(n_gpus)]
        copies = [0] * len(models)
        if n_gpus >= len(models):
            for g in range(n_gpus):
                gpu_models[g].append(g % len(models))
                copies[g % len(models)] += 1
        else:
            for i in range(len(models)):
                gpu_models[i % n_gpus].append(i)
                copies[i] += 1
        busy = [sum(per_model / copies[i] / speeds[i].tokens_per_s / 3600.0 * io + load_h for i in held)
                for held in gpu_models]
        hours = max(busy)
        gen_h = max(sum(per_model / copies[i] / speeds[i].tokens_per_s / 3600.0 for i in held) for held in gpu_models)
        if n_gpus >= len(models):
            layout = (f"{len(models)} model{'s' if len(models) > 1 else ''} side by side, "
                      f"{n_gpus // len(models)}{'+' if n_gpus % len(models) else ''} GPU(s) each")
        else:
            layout = f"{len(models)} models on {n_gpus} GPU(s), up to {math.ceil(len(models) / n_gpus)} in turn on each"
    tps = tokens / (gen_h * 3600.0) if gen_h > 0 else 0.0
    return GenerateRun(speeds=speeds, hours=hours, tokens_per_s=tps, fits=fits, order=order, layout=layout)


def generate_assumptions(d: Defaults, models: Sequence[ModelShape], tokens: float, order: str,
                         context: int | None) -> list[str]:
    """What a generation plan assumes, each with its source or marked an assumption."""
    ctx = context or d.decode_context_tokens
    names = ", ".join(m.name for m in models)
    return [
        f"generation: {names}; {tokens:,.0f} tokens shared equally between {len(models)} model(s), {order}",
        f"context {ctx} tokens a sequence ({CONTEXT_SOURCE}); KV cache reserved for the whole context, "
        "read on average half-way through it",
        f"batch: the VRAM x {SERVE_MEMORY_FRACTION} ({SERVE_MEMORY_FRACTION_SOURCE}) left after "
        f"weights ({d.decode_bytes_per_param:g} bytes a parameter, bf16) and {d.cuda_overhead_gb:g} GB overhead, "
        f"at most {SERVE_MAX_SEQUENCES} sequences ({SERVE_MAX_SEQUENCES_SOURCE})",
        f"memory bandwidth x {d.decode_bandwidth_efficiency:.0%} (vLLM decoding Llama-3.1-8B one request at a "
        f"time on an A100 40GB: ~77 % of the bandwidth ceiling, johnmusgrave.com 2025); matmuls at {DECODE_MATMUL_EFFICIENCY:.0%} of the dense peak "
        f"({DECODE_MATMUL_EFFICIENCY_SOURCE})",
        f"several GPUs: each copy at {d.decode_parallel_efficiency:.0%} (the job's own ~95 % estimate: copies share the host); "
        f"+{d.decode_io_overhead_fraction:.0%} I/O and {d.decode_load_minutes:g} min loading a model per GPU "
        "(the job's own overheads)",
        "not modelled: prefill of the prompts and the scheduler's own time (published vLLM figures, "
        "~12.5k tokens/s for Llama-3.1-8B on one H100 and ~3.4k for a 7B on one A100, morphllm.com/vllm-benchmarks "
        "2026, sit below this roofline; the comparison and the bundled engine on a CPU: BENCHMARKS.md)",
    ]
