"""The checks of a trainer config that its types cannot express: ranges, finiteness and the cross-field
rules (gpucli runs them on a launch's run.yaml before anything is rented)."""

from __future__ import annotations

import math

from trainer.spec.alerts import EVENTS
from trainer.spec.config import ATTENTION_KERNELS, COMPILE_SCOPES, OPTIMIZERS, Config, ConfigError
from trainer.spec.modelspec import MLP_KINDS, NORMS, POSITIONS
from trainer.spec.presets import MODELS, lookup


def validate(cfg: Config) -> None:
    """Range checks that the type system cannot express."""
    t, h, d, m = cfg.training, cfg.hardware, cfg.data, cfg.model

    def positive(name: str, v: float | int | None, allow_none: bool = True) -> None:
        if v is None and allow_none:
            return
        if v is None or not math.isfinite(v) or v <= 0:  # NaN passes `v <= 0`; inf is no limit
            raise ConfigError(f"{name} must be > 0 and finite, got {v!r}")

    for name in ("batch_size", "grad_accum_steps", "val_interval", "val_batches", "checkpoint_interval",
                 "log_interval", "keep_last", "eval_max_new_tokens"):
        positive(f"training.{name}", getattr(t, name), allow_none=False)
    positive("training.learning_rate", t.learning_rate, allow_none=False)
    positive("training.embedding_lr", t.embedding_lr)
    positive("training.matrix_lr", t.matrix_lr)
    if t.optimizer not in OPTIMIZERS:
        raise ConfigError(f"training.optimizer must be {' or '.join(OPTIMIZERS)}, got {t.optimizer!r}")
    for name in ("muon_momentum", "muon_momentum_start"):
        v = getattr(t, name)
        if not math.isfinite(v) or not 0.0 <= v < 1.0:
            raise ConfigError(f"training.{name} must be in [0, 1), got {v!r}")
    if t.muon_momentum_warmup_steps < 0:
        raise ConfigError(f"training.muon_momentum_warmup_steps must be >= 0 (0 = off), "
                          f"got {t.muon_momentum_warmup_steps}")
    positive("training.max_steps", t.max_steps)
    positive("training.seq_len", t.seq_len)
    positive("training.stage2_seq_len", t.stage2_seq_len)
    positive("training.stage1_chunk_size", t.stage1_chunk_size)
    positive("training.stage2_chunk_size", t.stage2_chunk_size)
    positive("training.memory.max_norm", t.memory.max_norm)
    positive("training.memory.gate_collapse_validations", t.memory.gate_collapse_validations, allow_none=False)
    positive("training.memory.static_validations", t.memory.static_validations, allow_none=False)
    for name in ("gate_collapse_share", "gate_collapse_drop", "static_tolerance"):
        v = getattr(t.memory, name)
        if not math.isfinite(v) or not 0.0 <= v < 1.0:
            raise ConfigError(f"training.memory.{name} must be in [0, 1), got {v!r}")
    r = t.refinement
    if not math.isfinite(r.supervision_weight_base) or r.supervision_weight_base <= 0:
        raise ConfigError(f"training.refinement.supervision_weight_base must be > 0 and finite, "
                          f"got {r.supervision_weight_base!r}")
    if not math.isfinite(r.improvement_reward_scale) or r.improvement_reward_scale < 0:
        raise ConfigError(f"training.refinement.improvement_reward_scale must be >= 0 and finite, "
                          f"got {r.improvement_reward_scale!r}")
    positive("limits.max_hours", cfg.limits.max_hours)
    positive("limits.budget_usd", cfg.limits.budget_usd)
    positive("limits.price_per_hour_usd", cfg.limits.price_per_hour_usd)
    positive("notifications.cost_update_hours", cfg.notifications.cost_update_hours)
    positive("notifications.telegram.timeout_s", cfg.notifications.telegram.timeout_s, allow_none=False)
    for ev in cfg.notifications.events:
        if ev not in EVENTS:
            raise ConfigError(f"notifications.events: unknown event '{ev}' (valid: {', '.join(EVENTS)})")
    for name in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len", "n_kv_heads", "d_key",
                 "d_value", "poly_degree", "context_window", "refine_layers"):
        positive(f"model.{name}", getattr(m, name))
    if m.refine_steps is not None and m.refine_steps < 0:
        raise ConfigError(f"model.refine_steps must be >= 0 (0 = off), got {m.refine_steps}")
    if m.gate_init is not None and not (math.isfinite(m.gate_init) and 0.0 < m.gate_init < 1.0):
        raise ConfigError(f"model.gate_init must be in (0, 1), got {m.gate_init!r}")
    for name, choices in (("mlp", MLP_KINDS), ("pos_embedding", POSITIONS), ("norm", NORMS)):
        if getattr(m, name) is not None and getattr(m, name) not in choices:
            raise ConfigError(f"model.{name} must be {', '.join(choices)}, got {getattr(m, name)!r}")
    if m.logit_softcap is not None and (not math.isfinite(m.logit_softcap) or m.logit_softcap < 0):
        raise ConfigError(f"model.logit_softcap must be >= 0 and finite (0 = off), got {m.logit_softcap!r}")
    if t.min_lr < 0 or t.min_lr > t.learning_rate:
        raise ConfigError(f"training.min_lr must be between 0 and learning_rate, got {t.min_lr}")
    if t.warmup_steps < 0 or t.val_patience < 0 or t.stage2_steps < 0:
        raise ConfigError("training.warmup_steps, val_patience and stage2_steps must be >= 0")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout must be in [0, 1), got {m.dropout}")
    if t.resume not in ("auto", "none") and not t.resume:
        raise ConfigError("training.resume must be 'auto', 'none' or a checkpoint directory")
    if h.device not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"hardware.device must be auto, cuda or cpu, got {h.device!r}")
    if h.fsdp not in ("auto", "on", "off"):
        raise ConfigError(f"hardware.fsdp must be auto, on or off, got {h.fsdp!r}")
    if h.compile == "on":  # YAML true (older run files: compile was a boolean) is today's default
        h.compile = "blocks"
    if h.compile not in COMPILE_SCOPES:
        raise ConfigError(f"hardware.compile must be {', '.join(COMPILE_SCOPES)}, got {h.compile!r}")
    if h.attention not in ATTENTION_KERNELS:
        raise ConfigError(f"hardware.attention must be {', '.join(ATTENTION_KERNELS)}, got {h.attention!r}")
    if d.tokenizer not in ("byte", "char", "bpe", "gpt2", "file"):
        raise ConfigError(f"data.tokenizer must be byte, char, bpe, gpt2 or file, got {d.tokenizer!r}")
    if d.tokenizer == "file" and not d.tokenizer_file:
        raise ConfigError("data.tokenizer file needs data.tokenizer_file")
    positive("data.bpe_vocab_size", d.bpe_vocab_size, allow_none=False)
    positive("data.max_bytes", d.max_bytes)
    if not 1 << 16 <= d.shard_tokens < 1 << 32:
        raise ConfigError(f"data.shard_tokens must be in [65536, 2**32), got {d.shard_tokens}")
    if d.min_val_tokens < 0 or d.workers < 0:
        raise ConfigError("data.min_val_tokens and data.workers cannot be negative")
    if not 0.0 < d.val_split < 1.0:
        raise ConfigError(f"data.val_split must be in (0, 1), got {d.val_split}")
    if cfg.limits.budget_usd is not None and cfg.limits.price_per_hour_usd is None:
        raise ConfigError("limits.budget_usd needs limits.price_per_hour_usd")
    for name in ("kill_at_step", "raise_at_step", "hang_at_step"):
        if getattr(cfg.faults, name) < 0:
            raise ConfigError(f"faults.{name} must be >= 0 (0 = off), got {getattr(cfg.faults, name)}")
    if m.preset is not None:
        if lookup(m.preset) is None:
            raise ConfigError(f"model.preset '{m.preset}' is unknown (choose from {', '.join(MODELS)} or dN, "
                              "nanochat's depth N)")
    cfg.resolved_max_steps()
