"""Run configuration: a typed dataclass tree read from YAML plus ``--section.key=value`` overrides.

The YAML has the shape of the user's own run files (the Atlas 1B build plan's ``atlas_1b_omega.yaml``): sections
``model``, ``training``, ``limits``, ``hardware``, ``data``, ``notifications`` and ``faults`` (test hooks). Every key is
checked: an unknown key or a value of the wrong type raises :class:`ConfigError` with a one-line
message that names the key, so a typo never silently trains the wrong model.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from trainer.spec.alerts import EVENTS


class ConfigError(ValueError):
    """A bad config file, key or value. The message is one line and says which key."""


@dataclass
class ModelConfig:
    preset: str | None = None
    """A named model (``trainer/spec/presets.py``); explicit fields below override it."""
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None
    """Hidden width of the MLP; default 4 x d_model."""
    vocab_size: int | None = None
    """Default: the prepared data's vocabulary, rounded up to a multiple of 64 (faster matmuls)."""
    max_seq_len: int | None = None
    """Size of the position table; the longest sequence either stage may use."""
    dropout: float = 0.0
    tie_embeddings: bool | None = None
    """The LM head shares the token embedding; default: the preset's, else true."""
    # The architecture (trainer.spec.modelspec.ModelSpec); None = the preset's, else GPT-2's.
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); must divide n_heads."""
    mlp: str | None = None
    """gelu, swiglu or relu2."""
    pos_embedding: str | None = None
    """learned or rope."""
    norm: str | None = None
    """layernorm (with weights) or rmsnorm (parameter-free)."""
    qk_norm: bool | None = None
    logit_softcap: float | None = None
    """Logits pass through cap * tanh(logits / cap); 0 turns a preset's cap off."""
    # The Atlas memory (trainer/model/memory.py) as the Atlas 1B build plan §1.4 names it; a memory field turns it on.
    memory: bool | None = None
    """An associative memory in every block, gated against attention; default: the preset's."""
    d_key: int | None = None
    """Memory key/query width; default d_model."""
    d_value: int | None = None
    """Memory value width; default d_model."""
    poly_degree: int | None = None
    """Degree of the polynomial feature map on memory keys and queries (default 2)."""
    context_window: int | None = None
    """Tokens in the memory's sliding-window objective (default 16)."""
    gate_init: float | None = None
    """The memory's share of the attention/memory mix at initialisation, in (0, 1) (default 0.5)."""
    refine_steps: int | None = None
    """TRM-style refinement steps after the forward pass (trainer/model/refine.py); 0 = off."""
    refine_layers: int | None = None
    """Blocks in the shared refinement stack (default 1)."""


@dataclass
class MemoryTrainingConfig:
    """How the memory is run and watched (the model's memory is ``model.memory``)."""

    carry: bool = False
    """Each micro-batch's memory starts from the previous one's final state (detached), not zero; a
    checkpoint holds the carried state."""
    max_norm: float | None = None
    """A ceiling on each sequence's ||M|| at chunk ends; None = none (the 300M run's 50.0 pinned M_norm)."""
    gate_collapse_share: float = 0.05
    """gate_collapse alert when a layer's mean memory share falls below this."""
    gate_collapse_validations: int = 5
    """... or fell at each of this many validations in a row, by gate_collapse_drop (relative) in all."""
    gate_collapse_drop: float = 0.5
    static_validations: int = 3
    """static_memory alert: M_std moved < static_tolerance (relative) at each of this many
    validations, or M_norm sat within 1 % of max_norm as long."""
    static_tolerance: float = 1e-3


@dataclass
class RefinementConfig:
    """The refinement loss's two knobs (trainer/model/refine.py); the cloud training guide: fast 5.0 / 1.0, extreme 10.0 / 2.0."""
    supervision_weight_base: float = 5.0
    """Deep-supervision weight of the last step relative to the first (weights grow geometrically)."""
    improvement_reward_scale: float = 1.0
    """Scale of the term that penalises a step not improving on the one before; 0 = off."""


@dataclass
class TrainingConfig:
    out_dir: str = "out"
    """Run folder: metrics.jsonl, train.log, high_loss.jsonl, tb/, checkpoints/, status.json."""
    batch_size: int = 8
    """Micro-batch per rank, in sequences."""
    grad_accum_steps: int = 1
    optimizer: str = "adamw"
    """'adamw' for everything, or 'muon': Muon (orthogonalised momentum) for the 2-D matrices inside
    the blocks, AdamW for the embeddings, the head and the norms (nanochat's split)."""
    learning_rate: float = 3e-4
    """Peak LR of the head and norms, and of the block matrices unless matrix_lr is set."""
    matrix_lr: float | None = None
    """Peak LR of the 2-D matrices inside the blocks (Muon's with optimizer=muon; nanochat: 0.02);
    default = learning_rate."""
    embedding_lr: float | None = None
    """Peak LR of the token/position embeddings (the cloud training guide runs them 10x the matrix LR); default = learning_rate."""
    muon_momentum: float = 0.95
    """With optimizer=muon: Muon's momentum once warm (nanochat's and torch.optim.Muon's 0.95)."""
    muon_momentum_start: float = 0.85
    """With optimizer=muon: the momentum of the first update, rising linearly to muon_momentum over
    muon_momentum_warmup_steps (nanochat's base_train: 0.85 -> 0.95 over the first 300 steps)."""
    muon_momentum_warmup_steps: int = 300
    """Length of that warmup; 0 = muon_momentum from the first update."""
    min_lr: float = 3e-5
    """The cosine schedule ends here (matrix LR; the embedding LR is scaled by the same factor)."""
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_steps: int | None = None
    """Total optimizer steps; default stage1_steps + stage2_steps."""
    seq_len: int | None = None
    """Stage-1 sequence length; default model.max_seq_len."""
    stage1_steps: int | None = None
    """Steps before switching to stage 2 (the Atlas 1B build plan's TNT); None = one stage."""
    stage2_steps: int = 0
    stage2_seq_len: int | None = None
    stage1_chunk_size: int | None = None
    """With model.memory: its update granularity in stage 1 (default the Atlas 1B build plan's 2048); TNT's stage 2
    changes the chunk size at the same sequence length."""
    stage2_chunk_size: int | None = None
    """With model.memory: the chunk size from stage1_steps on (the Atlas 1B build plan: 256); default stage 1's."""
    memory: MemoryTrainingConfig = field(default_factory=MemoryTrainingConfig)
    refinement: RefinementConfig = field(default_factory=RefinementConfig)
    val_interval: int = 500
    val_batches: int = 20
    """Micro-batches per rank in each validation."""
    val_patience: int = 0
    """Stop after this many validations without a new best; 0 = never."""
    checkpoint_interval: int = 1000
    checkpoint_every_s: float | None = None
    """Also checkpoint once this many seconds have passed since the last one (the $1000 8x H100 setup guide saves hourly:
    3600); every rank saves on the same step. None = by steps only."""
    keep_last: int = 3
    """Checkpoints kept besides the best one by val loss."""
    log_interval: int = 10
    seed: int = 1337
    resume: str = "none"
    """'auto' (newest checkpoint whose sha256 verifies), 'none', or a checkpoint directory."""
    high_loss_threshold: float | None = 8.0
    """A micro-batch whose loss passes this is written to high_loss.jsonl with its sources."""
    spike_factor: float = 2.0
    """A logged ppl above spike_factor x the rolling mean is a ppl_spike event."""
    eval_prompts: list[str] = field(
        default_factory=lambda: [
            "The quick brown fox",
            "Once upon a time",
            "The capital of France is",
            "def fibonacci(n):",
        ]
    )
    eval_max_new_tokens: int = 64
    tcf: bool = True
    """Compute TCF geometry metrics (D_eff, beta, curvature) at each validation."""


@dataclass
class LimitsConfig:
    """The hour and dollar caps (the step cap is ``training.max_steps``). Each ends the run with a
    final checkpoint written before the cap, not after it."""

    max_hours: float | None = None
    """Wall-clock budget, counted from the trainer process's start."""
    budget_usd: float | None = None
    """Dollar budget: hours x price_per_hour_usd; needs price_per_hour_usd."""
    price_per_hour_usd: float | None = None
    """USD per hour for the whole machine; needed for cost_usd and budget_usd."""


RENAMED_KEYS = {
    "limits.max_cost_usd": "limits.budget_usd",
    "limits.price_per_hour": "limits.price_per_hour_usd",
}
"""Keys of older run files and the names that replaced them (an old name is refused, never guessed)."""


ATTENTION_KERNELS = ("auto", "cudnn", "flash", "efficient")  # hardware.attention (trainer.model.gpt.select_attention)
OPTIMIZERS = ("adamw", "muon")  # training.optimizer (trainer.loop.optim.build_optimizer)
COMPILE_SCOPES = ("off", "blocks", "model")  # hardware.compile (trainer.loop.dist.build_model)


@dataclass
class HardwareConfig:
    device: str = "auto"
    """'auto' (cuda when available), 'cuda' or 'cpu'."""
    mixed_precision: bool = True
    """bf16 autocast on CUDA (CPU runs in fp32)."""
    compile: str = "blocks"
    """torch.compile on CUDA: 'blocks' (each transformer block and the loss kernel), 'model' (the
    whole model as one graph; see trainer.loop.dist.compile_model for how they measured) or 'off'.
    true/false (older run files) mean blocks/off."""
    compile_mode: str | None = None
    """Passed to torch.compile, e.g. 'max-autotune' (CUDA graphs)."""
    fsdp: str = "auto"
    """'auto' (shard when weights+grads+Adam state would not fit half the GPU), 'on' (also with one
    process under torchrun) or 'off'."""
    loss_chunk_rows: int = 8192
    """Rows per chunk of the fused LM-head + cross-entropy (never materializes all logits)."""
    attention: str = "auto"
    """SDPA kernel on CUDA: 'auto' (PyTorch's choice), 'cudnn', 'flash' or 'efficient'."""
    fp8: bool = False
    """FP8 matmuls in the blocks' Linears (torchao float8 training); needs compute capability >= 8.9
    (Ada, Hopper, Blackwell) and torchao, else the run is refused."""


@dataclass
class DataConfig:
    dir: str | None = None
    """Prepared data (meta.json and shards); default <out_dir>/data, prepared on first use."""
    inputs: list[str] = field(default_factory=list)
    """Text, .jsonl/.json, .parquet files (optionally .gz/.zst/.bz2/.xz) or folders to prepare when dir
    has no data; empty = the Python stdlib demo corpus."""
    tokenizer: str = "byte"
    """'byte', 'char', 'bpe' (trained on a sample), 'gpt2' or 'file' (tokenizer_file)."""
    tokenizer_file: str | None = None
    """A tokenizer.json for tokenizer 'file' (or GPT-2's for 'gpt2'; default the Hugging Face cache)."""
    bpe_vocab_size: int = 32000
    val_split: float = 0.1
    max_bytes: int | None = None
    """Cap on the text read when preparing; None = all of it (the stdlib demo keeps DEMO_MAX_BYTES)."""
    text_field: str = "text"
    """The JSON field or Parquet column holding the text."""
    include: list[str] = field(default_factory=list)
    """Globs a file inside an input folder must match (the Atlas 1B build plan's categories are folder names)."""
    exclude: list[str] = field(default_factory=list)
    """Globs a file inside an input folder must not match."""
    shard_tokens: int = 1 << 26
    """Tokens per shard at most (memory while preparing is bounded by it)."""
    min_val_tokens: int = 65536
    """The validation split gets at least this many tokens (or half a small corpus)."""
    workers: int = 0
    """Preparation worker processes; 0 = every core."""
    progress_file: str | None = None
    """Preparation progress as JSON lines (gpucli points it into the run folder)."""


JOB_STARTED_ENV = "GPUCLI_JOB_STARTED_AT"  # epoch s the pod command began (before data is fetched)
DEMO_MAX_BYTES = 64_000_000  # the stdlib demo corpus is capped as before; real inputs are not


@dataclass
class TelegramConfig:
    enabled: bool = False
    bot_token: str | None = None
    """Default: $TELEGRAM_BOT_TOKEN. '${VAR}' is read from the environment. Prefer the variable: a
    literal token here would be copied into every checkpoint's meta.json."""
    chat_id: str | None = None
    """Default: $TELEGRAM_CHAT_ID."""
    timeout_s: float = 10.0
    """Per request. At exit the run waits at most min(5, timeout_s) seconds for unsent alerts."""


@dataclass
class NotificationsConfig:
    telegram: TelegramConfig = field(default_factory=TelegramConfig)
    events: list[str] = field(default_factory=lambda: list(EVENTS))
    """Which events alert (every one of ``trainer.spec.alerts.EVENTS`` unless listed)."""
    cost_update_hours: float | None = 4.0
    """A cost_update (hours, limits.price_per_hour_usd, $ so far) every this many hours; None = never."""
    webhook_url: str | None = None
    """Slack, Discord, ntfy or JSON webhook for the same events (default: $GPUCLI_WEBHOOK_URL, which
    ``gpucli keys set webhook URL`` puts in the pod's env file). '${VAR}' is read from the environment."""


TRACKERS = ("none", "wandb", "trackio")


@dataclass
class TrackingConfig:
    """An experiment tracker besides metrics.jsonl and TensorBoard (off by default; the package is an
    optional extra: ``pip install gpucli[wandb]`` or ``gpucli[trackio]``)."""

    backend: str = "none"
    """none, wandb (Weights & Biases: WANDB_API_KEY by name, ``gpucli launch --env WANDB_API_KEY``) or
    trackio (local, or a Hugging Face Space with HF_TOKEN)."""
    project: str = "gpucli"
    run_name: str | None = None
    """Default: the gpucli run's name."""
    space_id: str | None = None
    """trackio only: a Hugging Face Space (ORG/NAME) to sync to; default: local files only."""


@dataclass
class FaultsConfig:
    """Test hooks, not for real runs: make the trainer fail right after a given step so tests can
    check resume, alerts and the pod watchdog. 0 = off."""

    kill_at_step: int = 0
    """SIGKILL this process (no checkpoint, no finished row): a lost machine."""
    raise_at_step: int = 0
    """Raise a RuntimeError: the error path (error row, failed status, alert)."""
    hang_at_step: int = 0
    """Stop making progress forever: a wedged collective or data loader, as a watchdog sees it."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    data: DataConfig = field(default_factory=DataConfig)
    notifications: NotificationsConfig = field(default_factory=NotificationsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved_max_steps(self) -> int:
        t = self.training
        if t.max_steps is not None:
            return t.max_steps
        if t.stage1_steps is not None:
            return t.stage1_steps + t.stage2_steps
        raise ConfigError("training.max_steps is not set (nor training.stage1_steps)")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a field's type hint; the only conversions are int->float and str->list."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return _build(hint, value, key)
    if origin is list:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no as booleans
            return "on" if value else "off"
        if isinstance(value, (str, int, float)):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {hint}")  # pragma: no cover - a bug in this file


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = _hints(cls)
    obj = cls()
    for k, v in raw.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if key in RENAMED_KEYS:
            raise ConfigError(f"config key '{key}' is now '{RENAMED_KEYS[key]}'")
        if k not in hints:
            valid = ", ".join(sorted(hints))
            raise ConfigError(f"unknown config key '{key}' (valid here: {valid})")
        setattr(obj, k, _coerce(v, hints[k], key))
    return obj


_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def expand_env(value: str | None) -> str | None:
    """'${VAR}' -> os.environ['VAR'] (None when unset); other strings pass through."""
    if value is None:
        return None
    m = _ENV_REF.match(value.strip())
    if m:
        return os.environ.get(m.group(1)) or None
    return value
