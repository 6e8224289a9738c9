"""Pure estimates for one model on one GPU setup: parameters, memory, FLOPs, tokens/s.

No I/O, no clock, no printing: dataclasses in, dataclasses out. The constants come from the
catalogue's ``defaults`` (gpus.yaml), so every number can say where it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from gpucli.plan.schema import Defaults, Gpu, ModelShape
from trainer.spec.modelspec import ParamCount

GB = 1e9


def count_params(shape: ModelShape) -> ParamCount:
    """Parameters by part: the description's own count, the same one the trainer builds."""
    return shape.param_count()


def train_flops_per_token(shape: ModelShape, seq_len: int | None = None) -> float:
    """6N + 12·L·d·T: forward+backward matmuls plus attention scores (PaLM appendix B)."""
    return shape.train_flops_per_token(seq_len)


# The step-time model behind MFU transfers, from torch.profiler kernel tables of the bundled trainer
# on an H100 SXM (124M and 1.31B, BENCHMARKS.md): matmuls ran at ~70 % of the dense bf16 peak,
# cuDNN attention at ~40 % (head dim 64) and ~63 % (head dim 128), the pointwise work of a block
# (norms, GELU, residuals, inductor-fused) moved ~100 bytes per token per layer per channel, and the
# fused loss ~9 bytes per token per vocabulary entry.
_MATMUL_SHARE_OF_PEAK = 0.70
_POINTWISE_BYTES = 100.0
_LOSS_BYTES_PER_LOGIT = 9.0


def _attention_share_of_peak(head_dim: float) -> float:
    return min(0.70, max(0.30, 0.40 + 0.23 * (math.log2(max(head_dim, 1.0)) - 6)))


def modelled_mfu(shape: ModelShape, seq_len: int, gpu: Gpu) -> float:
    """MFU the step-time model gives a shape on a GPU: useful FLOPs over (matmul + attention time at
    their shares of peak + pointwise and loss bytes over memory bandwidth). Not a prediction by
    itself (it leaves out launch gaps and the optimizer): its *ratio* between two setups moves a
    measured MFU from one to the other."""
    d, L = shape.d_model, shape.n_layers
    peak = gpu.bf16_dense_tflops * 1e12
    bandwidth = gpu.memory_bandwidth_gbps * 1e9
    matmul = 6.0 * count_params(shape).flop_params
    attention = 12.0 * L * d * seq_len
    seconds = (matmul / (_MATMUL_SHARE_OF_PEAK * peak)
               + attention / (_attention_share_of_peak(d / shape.n_heads) * peak)
               + (_POINTWISE_BYTES * L * d + _LOSS_BYTES_PER_LOGIT * shape.vocab_size) / bandwidth)
    return (matmul + attention) / seconds / peak


class Fit(str, Enum):
    FITS = "fits"
    SHARDED = "sharded"  # only with the optimizer state, grads and weights sharded (FSDP / ZeRO-3)
    NO = "no"


@dataclass(frozen=True)
class Memory:
    """Memory per GPU in GB (10^9 bytes)."""

    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    activations_gb: float
    logits_gb: float
    overhead_gb: float
    micro_batch: int
    seq_len: int
    sharded_over: int  # 1 = plain data parallel

    @property
    def total_gb(self) -> float:
        return (self.weights_gb + self.grads_gb + self.optimizer_gb + self.activations_gb + self.logits_gb
                + self.overhead_gb)


# What one Atlas memory block keeps for backward on top of a plain block, per token: a least-squares fit
# (max error 2 %) to 18 measurements of the trainer's own AtlasMemory.mix under bf16 autocast on CPU, every
# tensor autograd saves counted once (scripts/measure_saved.py, torch.autograd.graph.saved_tensors_hooks;
# BENCHMARKS.md "Atlas memory activations"). The memory runs in fp32: ~7 n x n chunk matrices (29 bytes a
# token per unit of chunk), the fp32 projections and features, and M and S per chunk (16 x dk x dv / chunk).
_MEM_PER_CHUNK = 29.12
_MEM_PER_D = 18.48
_MEM_PER_DK_DEGREE = 12.0
_MEM_PER_DK = 34.17
_MEM_PER_DV = 22.63
_MEM_STATE_PER_CHUNK = 16.21
_MEM_PER_WINDOW = 16.67
_MEM_CONST = -68.23
DEFAULT_MEMORY_CHUNK = 2048  # the trainer's stage-1 chunk when none is set (the Atlas 1B build plan's)


def memory_activation_bytes_per_token(d: int, dk: int, dv: int, chunk: int, window: int, poly: int) -> float:
    """One memory block's saved bytes per token (see the fit above); ``chunk`` as run (at most T)."""
    return (_MEM_PER_CHUNK * chunk + _MEM_PER_D * d + _MEM_PER_DK_DEGREE * dk * poly + _MEM_PER_DK * dk
            + _MEM_PER_DV * dv + _MEM_STATE_PER_CHUNK * dk * dv / chunk + _MEM_PER_WINDOW * window + _MEM_CONST)


def plain_block_bytes_per_token(shape: ModelShape) -> float:
    """One plain block (Korthikanti et al. with flash attention)."""
    d, f = shape.d_model, shape.d_ff
    return float((17 * d + 6 * f) if shape.mlp == "swiglu" else (18 * d + 4 * f))


def activation_bytes_per_token(shape: ModelShape, seq_len: int | None = None, chunk: int | None = None) -> float:
    """Bytes kept for backward per token, all layers: the plain blocks, each block's memory (its chunk
    as run: ``chunk``, else the trainer's default, at most the sequence) and every refinement step's
    pass through the shared stack (each step's activations are kept for its backward)."""
    per_layer = plain_block_bytes_per_token(shape)
    total = per_layer * shape.n_layers
    if shape.memory:
        t = seq_len or shape.max_seq_len
        c = min(t, chunk or DEFAULT_MEMORY_CHUNK)
        total += shape.n_layers * memory_activation_bytes_per_token(
            shape.d_model, shape.key_width, shape.value_width, c, shape.context_window, shape.poly_degree)
    if shape.refine_steps:
        total += shape.refine_steps * shape.refine_layers * per_layer
    return total


# The memory runs in fp32 outside autocast (trainer/model/memory.py); the trainer allows TF32 for it
# (trainer/loop/dist.py), whose dense tensor-core peak is half the BF16 one on NVIDIA's datasheets
# (A100: 156 vs 312; H100 SXM: 494.7 vs 989.5; L40S and RTX 4090 likewise). Its FLOPs take twice the time.
TF32_SLOWDOWN = 2.0


def memory_fp32_flops_per_token(shape: ModelShape, seq_len: int | None = None, chunk: int | None = None) -> float:
    """Training FLOPs a token of the memory's fp32 work: its q, k, v, out projections and gates, and the
    chunked update (ModelSpec.train_flops_per_token's memory term)."""
    if not shape.memory:
        return 0.0
    t = seq_len or shape.max_seq_len
    c = min(t, chunk or DEFAULT_MEMORY_CHUNK)
    d, dk, dv = shape.d_model, shape.key_width, shape.value_width
    update = 3.0 * (6.0 * dk * dv + 2.0 * c * (dk + dv) + 2.0 * c * c)
    projections = 6.0 * (2 * d * dk + 2 * d * dv + 3 * d)
    return shape.n_layers * (update + projections)


def speed_flops_per_token(shape: ModelShape, seq_len: int | None = None, chunk: int | None = None) -> float:
    """FLOPs a token as the GPU's BF16 peak sees them: the useful FLOPs, with the fp32 (TF32) memory
    path counted at its slower rate. Tokens/s = peak x MFU / this."""
    t = seq_len or shape.max_seq_len
    extra = (TF32_SLOWDOWN - 1.0) * memory_fp32_flops_per_token(shape, t, chunk)
    return shape.train_flops_per_token(t, memory_chunk=chunk) + extra


# The bundled trainer's fused loss (trainer/model/gpt.py FusedLinearCrossEntropy) never stores the logits
# of the micro-batch: it computes loss and gradients 8192 rows at a time, so only one chunk's bf16 logits and
# their gradient exist at once. Charging every token's logits overstated the measured peaks by 11-140 %.
LOSS_CHUNK_ROWS = 8192


def train_memory(shape: ModelShape, defaults: Defaults, micro_batch: int, seq_len: int,
                 sharded_over: int = 1, chunk: int | None = None) -> Memory:
    """Per-GPU memory of bf16-autocast AdamW training (fp32 master weights)."""
    n = count_params(shape).total
    state = defaults.train_state_bytes_per_param  # 4 weights + 4 grads + 8 AdamW
    weights = n * 4 / sharded_over
    grads = n * 4 / sharded_over
    optimizer = n * (state - 8) / sharded_over
    tokens = micro_batch * seq_len
    return Memory(
        weights_gb=weights / GB, grads_gb=grads / GB, optimizer_gb=optimizer / GB,
        activations_gb=tokens * activation_bytes_per_token(shape, seq_len, chunk) / GB,
        logits_gb=min(tokens, LOSS_CHUNK_ROWS) * shape.vocab_size * defaults.logits_bytes_per_token_vocab / GB,
        overhead_gb=defaults.cuda_overhead_gb, micro_batch=micro_batch, seq_len=seq_len,
        sharded_over=sharded_over)


@dataclass(frozen=True)
class FitResult:
    fit: Fit
    memory: Memory  # at the chosen micro-batch (micro-batch 1 when nothing fits)


def choose_micro_batch(shape: ModelShape, defaults: Defaults, vram_gb: float, n_gpus: int,
                       seq_len: int | None = None, max_micro_batch: int | None = None,
                       chunks: tuple[int, ...] = ()) -> FitResult:
    """The largest power-of-two micro-batch that fits; sharded across ``n_gpus`` only if it must be.
    ``chunks``: the memory's chunk size in each stage (a memory model must fit in every one)."""
    t = seq_len or shape.max_seq_len
    usable = vram_gb * defaults.usable_vram_fraction
    cap = max_micro_batch or defaults.max_micro_batch

    def need(mb: int, sharded_over: int) -> Memory:
        return peak_train_memory(shape, defaults, mb, t, sharded_over, chunks)

    for sharded_over, fit in ((1, Fit.FITS), (n_gpus, Fit.SHARDED)):
        if fit is Fit.SHARDED and n_gpus < 2:
            break
        if need(1, sharded_over).total_gb > usable:
            continue
        mb = 1
        while mb * 2 <= cap and need(mb * 2, sharded_over).total_gb <= usable:
            mb *= 2
        return FitResult(fit, need(mb, sharded_over))
    return FitResult(Fit.NO, need(1, max(1, n_gpus)))


def peak_train_memory(shape: ModelShape, defaults: Defaults, micro_batch: int, seq_len: int, sharded_over: int = 1,
                      chunks: tuple[int, ...] = ()) -> Memory:
    """The largest of :func:`train_memory` over the stages' memory chunk sizes."""
    return max((train_memory(shape, defaults, micro_batch, seq_len, sharded_over, c) for c in (chunks or (None,))),
               key=lambda m: m.total_gb)


def scaling_efficiency(n_gpus: int, interconnect: str, defaults: Defaults) -> float:
    """Data-parallel efficiency: ``per_doubling ** log2(n)`` (1.0 for one GPU)."""
    if n_gpus <= 1:
        return 1.0
    return defaults.scaling_per_doubling[interconnect] ** math.log2(n_gpus)


def train_tokens_per_s(flops_per_token: float, gpu: Gpu, n_gpus: int, mfu: float, defaults: Defaults) -> float:
    peak = gpu.bf16_dense_tflops * 1e12
    return n_gpus * peak * mfu * scaling_efficiency(n_gpus, gpu.interconnect, defaults) / flops_per_token


def parse_quantity(text: str | float | int) -> float:
    """'20B' -> 2e10, '500M' -> 5e8, '3.5k' -> 3500, '1e9' -> 1e9."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().replace("_", "").replace(",", "")
        mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
        factor = 1.0
        if s and s[-1].lower() in mult:
            factor = mult[s[-1].lower()]
            s = s[:-1]
        try:
            value = float(s) * factor
        except ValueError:
            raise ValueError(f"not a number: {text!r} (examples: 20B, 500M, 1e9)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive number: {text!r}")
    return value


def parse_duration_hours(text: str | float | int) -> float:
    """'24h' -> 24, '90m' -> 1.5, '2d' -> 48, '1.5' -> 1.5 (hours)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().lower()
        unit = {"s": 1 / 3600, "m": 1 / 60, "h": 1.0, "d": 24.0, "w": 168.0}
        factor = 1.0
        if s and s[-1] in unit:
            factor = unit[s[-1]]
            s = s[:-1]
        try:
            value = float(s) * factor
        except ValueError:
            raise ValueError(f"not a duration: {text!r} (examples: 24h, 90m, 2d)") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive duration: {text!r}")
    return value


# Data preparation on the pod (trainer.prepare), per core, from scripts/bench_prepare.py (BENCHMARKS.md,
# "Data preparation", 2026-11-23, one worker on a loaded 2-core VM): the bytes tokenizer read 12.6 MB/s
# of .jsonl.gz (37.4 of plain text; one token per byte, so MB/s = Mtokens/s), a trained BPE 0.55 Mtokens/s.
# The slower format is the default: the Atlas 1B build plan's corpus is .jsonl.gz.
PREPARE_TOKENS_PER_S_PER_CORE = {"byte": 12.6e6, "char": 12.6e6, "bpe": 0.55e6, "gpt2": 0.55e6, "file": 0.55e6}
POD_CPU_CORES = 16  # a GPU pod's vCPUs when nothing better is known (RunPod and vast.ai give 8-32 per GPU)


@dataclass(frozen=True)
class PrepareEstimate:
    """Preparing ``tokens`` on the pod before training: tokens / (rate per core x cores)."""

    tokens: float
    tokenizer: str
    tokens_per_s_per_core: float
    cores: int
    source: str

    @property
    def hours(self) -> float:
        return self.tokens / (self.tokens_per_s_per_core * self.cores) / 3600.0


def prepare_estimate(tokens: float, tokenizer: str = "byte", cores: int = POD_CPU_CORES) -> PrepareEstimate:
    if tokenizer not in PREPARE_TOKENS_PER_S_PER_CORE:
        raise ValueError(f"unknown tokenizer {tokenizer!r} (one of {', '.join(PREPARE_TOKENS_PER_S_PER_CORE)})")
    if not (math.isfinite(tokens) and tokens >= 0) or cores < 1:
        raise ValueError("tokens must be a non-negative number and cores at least 1")
    kind = "bytes tokenizer, .jsonl.gz" if tokenizer in ("byte", "char") else "BPE, plain text"
    return PrepareEstimate(tokens, tokenizer, PREPARE_TOKENS_PER_S_PER_CORE[tokenizer], cores,
                           f"scripts/bench_prepare.py, 1 worker ({kind}), BENCHMARKS.md 2026-11-23; "
                           f"assumes workers scale to {cores} cores")

