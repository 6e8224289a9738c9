"""One description of a model, read by the planner (gpucli/plan) and the trainer (trainer/model/gpt.py).

Standard library only: gpucli imports this without torch, and the pod's trainer imports it before
torch is up. The named presets are in ``trainer/spec/presets.py``; a YAML mapping (a calibration entry's
measured shape) is parsed by its reader into a :class:`ModelSpec`, never passed around as a dict.

The parameter count is a method of the description, so the number the planner prices and the number
the trainer builds are one computation: ``tests/trainer/model/test_gpt.py`` builds every preset the
trainer supports and checks ``GPT.num_params()`` against it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

MLP_KINDS = ("gelu", "swiglu", "relu2")
"""gelu and relu2 (squared ReLU, nanochat's): two matrices, d_ff wide; swiglu: three."""
POSITIONS = ("learned", "rope")
"""learned: a max_seq_len x d_model table; rope: rotary, no parameters."""
NORMS = ("layernorm", "rmsnorm")
"""layernorm: a weight per channel, no bias (the trainer's today); rmsnorm: parameter-free (nanochat's)."""


class SpecError(ValueError):
    """A description that cannot be built: ``field`` names the offending field, the message is one line."""

    def __init__(self, name: str, field_name: str, problem: str) -> None:
        super().__init__(f"model {name or '(unnamed)'}: {field_name}: {problem}")
        self.field = field_name
        self.problem = problem


@dataclass(frozen=True, kw_only=True)
class ParamCount:
    """Parameters by part, each counted once."""

    embedding: int  # token embedding table
    position: int  # learned position table (0 with RoPE)
    attention: int  # all layers: q, k, v and output projections
    mlp: int  # all layers
    norms: int  # block norms, the final norm and QK-norm weights (0 when parameter-free)
    head: int  # LM head; 0 when tied to the embedding
    memory: int = 0  # all layers: the Atlas memory's projections, gates and feature weights, the mixing gate
    refine: int = 0  # the shared refinement blocks (TRM-style recursion)

    @property
    def total(self) -> int:
        return (self.embedding + self.position + self.attention + self.mlp + self.norms + self.head
                + self.memory + self.refine)

    @property
    def non_embedding(self) -> int:
        return self.attention + self.mlp + self.norms + self.memory + self.refine

    @property
    def flop_params(self) -> int:
        """Parameters that do matmul work per token: the layers plus the LM head.

        The input embedding and the position table are lookups. A tied head is counted once (as the
        head). This is nanoGPT's N (all parameters less the position table) for tied models and
        nanochat's (parameters less the token embedding) for untied ones.
        """
        head = self.head if self.head else self.embedding
        return self.non_embedding + head


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, every choice that changes what is built or counted.

    ``name``, ``source`` and ``dropout`` do not take part in equality: two specs are equal when they
    describe the same network.
    """

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    """Hidden width of the MLP (per matrix; SwiGLU has three of them)."""
    vocab_size: int
    max_seq_len: int
    """The longest sequence; the size of the position table when positions are learned."""
    n_kv_heads: int | None = None
    """Grouped-query attention: key/value heads (None = n_heads, plain multi-head)."""
    mlp: str = "gelu"
    pos_embedding: str = "learned"
    tied_embeddings: bool = True
    """The LM head shares the token-embedding matrix."""
    norm: str = "layernorm"
    qk_norm: bool = False
    """Normalise queries and keys per head before attention (a norm of kind ``norm``)."""
    logit_softcap: float | None = None
    """Logits pass through ``cap * tanh(logits / cap)`` (None = off)."""
    memory: bool = False
    """An Atlas associative memory in every block, mixed with attention by a learned gate
    (trainer/model/memory.py; the Atlas 1B build plan §1.2)."""
    d_key: int | None = None
    """Key/query width of the memory (None = d_model); M is d_value x d_key per sequence."""
    d_value: int | None = None
    """Value width of the memory (None = d_model)."""
    poly_degree: int = 2
    """Degree of the polynomial feature map on memory keys and queries."""
    context_window: int = 16
    """Tokens in the memory's sliding-window (Omega) objective."""
    gate_init: float = 0.5
    """The memory's share of the attention/memory mix at initialisation, in (0, 1)."""
    refine_steps: int = 0
    """TRM-style refinement: steps that re-apply a shared block stack to the hidden state, each
    supervised (trainer/model/refine.py); 0 = off."""
    refine_layers: int = 1
    """Blocks in the shared refinement stack (only built when refine_steps > 0)."""
    name: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    dropout: float = field(default=0.0, compare=False)
    """Training-time only: no parameters, no FLOPs the planner counts."""

    def __post_init__(self) -> None:
        problem = spec_problem(self)
        if problem:
            raise SpecError(self.name, *problem)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def key_width(self) -> int:
        return self.d_key or self.d_model

    @property
    def value_width(self) -> int:
        return self.d_value or self.d_model

    def memory_params_per_layer(self) -> int:
        """trainer.model.memory.AtlasMemory plus the block's mixing gate: q, k (d x d_key), v (d x d_value),
        out (d_value x d), gates (d x 3 + 3), polynomial coefficients, Omega weights; the gate d x d + d."""
        if not self.memory:
            return 0
        d, dk, dv = self.d_model, self.key_width, self.value_width
        return 2 * d * dk + 2 * d * dv + 3 * d + 3 + self.poly_degree + self.context_window + d * d + d

    def block_params(self) -> int:
        """One plain block (attention, MLP, its norms): a refinement block is one of these."""
        d, kv_dim = self.d_model, self.head_dim * self.kv_heads
        norm_width = d if self.norm == "layernorm" else 0
        qk_norm = 2 * self.head_dim if self.qk_norm and self.norm == "layernorm" else 0
        return (2 * d * d + 2 * d * kv_dim + (3 if self.mlp == "swiglu" else 2) * d * self.d_ff
                + 2 * norm_width + qk_norm)

    def param_count(self) -> ParamCount:
        d, L, V = self.d_model, self.n_layers, self.vocab_size
        kv_dim = self.head_dim * self.kv_heads
        norm_width = d if self.norm == "layernorm" else 0
        qk_norm = 2 * self.head_dim if self.qk_norm and self.norm == "layernorm" else 0
        return ParamCount(
            memory=L * self.memory_params_per_layer(),
            refine=self.refine_layers * self.block_params() if self.refine_steps else 0,
            embedding=V * d,
            position=self.max_seq_len * d if self.pos_embedding == "learned" else 0,
            attention=L * (2 * d * d + 2 * d * kv_dim),  # q and out: d x d; k and v: d x kv_dim (no biases)
            mlp=L * (3 if self.mlp == "swiglu" else 2) * d * self.d_ff,
            norms=L * (2 * norm_width + qk_norm) + norm_width,  # two per block, QK-norm, the final one
            head=0 if self.tied_embeddings else V * d)

    def num_params(self) -> int:
        """Every parameter, counted once (the trainer's ``GPT.num_params(exclude_position=False)``)."""
        return self.param_count().total

    def train_flops_per_token(self, seq_len: int | None = None, memory_chunk: int | None = None) -> float:
        """6N + 12·L·d·T: forward+backward matmuls plus attention scores (PaLM appendix B).

        A refinement stack runs ``refine_steps`` times (its N is counted once in 6N), and each step
        adds a head. A memory adds, per layer and token, forward x 3: the error and the two reads
        against d_value x d_key states (3·2·dk·dv), the chunk's score and read matmuls (2·C·(dk + dv))
        and its share of the C x C x C decay product (2·C²), C the chunk size (default
        min(T, 2048), the Atlas 1B build plan's stage-1 chunk)."""
        t = seq_len or self.max_seq_len
        count = self.param_count()
        flops = 6.0 * count.flop_params + 12.0 * self.n_layers * self.d_model * t
        if self.refine_steps:
            k, layers = self.refine_steps, self.refine_layers
            flops += (6.0 * (k - 1) * layers * self.block_params() + 12.0 * k * layers * self.d_model * t
                      + 6.0 * k * self.vocab_size * self.d_model)
        if self.memory:
            c = min(t, memory_chunk or 2048)
            dk, dv = self.key_width, self.value_width
            flops += 3.0 * self.n_layers * (6.0 * dk * dv + 2.0 * c * (dk + dv) + 2.0 * c * c)
        return flops


def spec_problem(s: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong with it) for the first bad field of a spec; None when all are good."""
    for key in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len"):
        v = getattr(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return key, f"must be a whole number >= 1, got {v!r}"
    if s.d_model % s.n_heads:
        return "n_heads", f"d_model {s.d_model} is not divisible by n_heads {s.n_heads}"
    if s.n_kv_heads is not None:
        if isinstance(s.n_kv_heads, bool) or not isinstance(s.n_kv_heads, int) or s.n_kv_heads < 1:
            return "n_kv_heads", f"must be a whole number >= 1, got {s.n_kv_heads!r}"
        if s.n_heads % s.n_kv_heads:
            return "n_kv_heads", f"n_heads {s.n_heads} is not divisible by n_kv_heads {s.n_kv_heads}"
    for key, choices in (("mlp", MLP_KINDS), ("pos_embedding", POSITIONS), ("norm", NORMS)):
        if getattr(s, key) not in choices:
            return key, f"must be one of {', '.join(choices)}, got {getattr(s, key)!r}"
    for key in ("tied_embeddings", "qk_norm"):
        if not isinstance(getattr(s, key), bool):
            return key, f"must be true or false, got {getattr(s, key)!r}"
    cap = s.logit_softcap
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))
                            or not math.isfinite(cap) or cap <= 0):
        return "logit_softcap", f"must be a number > 0, got {cap!r}"
    for key in ("d_key", "d_value"):
        v = getattr(s, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            return key, f"must be a whole number >= 1, got {v!r}"
    for key, low in (("poly_degree", 1), ("context_window", 1), ("refine_steps", 0), ("refine_layers", 1)):
        v = getattr(s, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            return key, f"must be a whole number >= {low}, got {v!r}"
    if not isinstance(s.memory, bool):
        return "memory", f"must be true or false, got {s.memory!r}"
    g = s.gate_init
    if isinstance(g, bool) or not isinstance(g, (int, float)) or not math.isfinite(g) or not 0.0 < g < 1.0:
        return "gate_init", f"must be in (0, 1), got {g!r}"
    if isinstance(s.dropout, bool) or not isinstance(s.dropout, (int, float)) or not 0.0 <= s.dropout < 1.0:
        return "dropout", f"must be in [0, 1), got {s.dropout!r}"
    return None


def unsupported_fields(spec: ModelSpec) -> list[str]:
    """The fields of ``spec`` the bundled trainer cannot build, as ``field=value`` (empty: it can).

    trainer/model/gpt.py builds every choice a valid spec can state, so this is empty for every spec
    that passed :func:`spec_problem`; a launch still calls it before renting anything, so a field
    added here before the trainer builds it is refused by name, never dropped."""
    return []


def unsupported_message(spec: ModelSpec) -> str | None:
    """One line saying what the trainer cannot build, or None."""
    bad = unsupported_fields(spec)
    if not bad:
        return None
    return f"the trainer cannot build model {spec.name or '(unnamed)'} yet: {', '.join(bad)}"


MEMORY_FIELDS = ("d_key", "d_value", "poly_degree", "context_window", "gate_init")


def research_changes(memory: bool | None = None, refine_steps: int | None = None, refine_layers: int | None = None,
                     **memory_fields: Any) -> dict[str, Any]:
    """The memory and refinement fields to set on a preset's spec, from a run's ``model`` section:
    None = the preset's. A memory field (the Atlas 1B build plan §1.4's ``d_key``, ...) turns the memory on unless
    ``memory`` is false, which then refuses it (ValueError)."""
    unknown = sorted(set(memory_fields) - set(MEMORY_FIELDS))
    if unknown:
        raise TypeError(f"unknown memory field {unknown[0]}")
    out = {k: v for k, v in memory_fields.items() if v is not None}
    if memory is False and out:
        raise ValueError(f"model.{next(iter(out))} is a memory setting but model.memory is false")
    if memory is not None or out:
        out["memory"] = True if memory is None else memory
    out.update({k: v for k, v in (("refine_steps", refine_steps), ("refine_layers", refine_layers)) if v is not None})
    return out


_LEGACY_KEYS = {"tie_embeddings": "tied_embeddings"}  # the trainer's name before the one description


def spec_from_mapping(raw: dict[str, Any]) -> ModelSpec:
    """A spec from a plain mapping of its fields, e.g. a checkpoint's ``meta.json`` ``model_shape``
    (older checkpoints say ``tie_embeddings``). Unknown keys are a ValueError naming them."""
    known = {f.name for f in fields(ModelSpec)}
    data = {_LEGACY_KEYS.get(k, k): v for k, v in raw.items()}
    extra = sorted(set(data) - known)
    if extra:
        raise SpecError(str(data.get("name") or ""), extra[0], f"unknown key (known: {', '.join(sorted(known))})")
    return ModelSpec(**data)
