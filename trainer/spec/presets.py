"""The named models: the one list both the planner (``gpucli models``, ``gpucli plan --model``) and the
trainer (``model.preset``) read. Standard library only, so it ships to the pod with the trainer and
gpucli reads it without torch.

Each entry is a :class:`~trainer.spec.modelspec.ModelSpec`: every architectural choice is stated, and the
parameter count follows from it, and ``trainer/model/gpt.py`` builds each as stated.

nanochat's family (``d24``, ``d64``, any ``dN``) is built with nanochat's choices (karpathy/nanochat,
``nanochat/gpt.py``): rotary positions, parameter-free RMSNorm (also right after the embedding), QK-norm,
squared-ReLU MLP, untied head and logits soft-capped at 15. ``124m`` and ``1.31b`` stay GPT-2 as nanoGPT
builds them: they are the reference the modern variant (:func:`modern`) is measured against.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from trainer.spec.modelspec import ModelSpec

NANOCHAT: dict[str, Any] = {"mlp": "relu2", "pos_embedding": "rope", "norm": "rmsnorm", "qk_norm": True, "tied_embeddings": False,
            "logit_softcap": 15.0}
"""nanochat's architecture choices (nanochat/gpt.py: rotary, QK-norm, relu^2, untied, norm without
parameters, ``softcap = 15``)."""


def _presets(*specs: ModelSpec) -> dict[str, ModelSpec]:
    return {s.name: s for s in specs}


MODELS: dict[str, ModelSpec] = _presets(
    ModelSpec(
        name="tiny", d_model=64, n_layers=2, n_heads=2, d_ff=256, vocab_size=256, max_seq_len=256,
        source="gpucli's CPU demo and the trainer's smoke tests: byte-level, trains in seconds on two cores"),
    ModelSpec(
        name="25m", d_model=384, n_layers=6, n_heads=6, d_ff=1536, vocab_size=32000, max_seq_len=512,
        source="a small GPT (the Neurlang model's 6 layers x 384; vocabulary and context assumed)"),
    ModelSpec(
        name="124m", d_model=768, n_layers=12, n_heads=12, d_ff=3072, vocab_size=50304, max_seq_len=1024,
        source="GPT-2 small as nanoGPT trains it (vocabulary padded to 50304)"),
    ModelSpec(
        name="300m", d_model=1024, n_layers=16, n_heads=8, d_ff=4096, vocab_size=32000, max_seq_len=4096,
        pos_embedding="rope", tied_embeddings=False,
        source="a 300M GPT with rotary positions (the Atlas build plan's 300M size, without its "
               "memory module)"),
    ModelSpec(
        name="1b", d_model=1536, n_layers=24, n_heads=12, d_ff=6144, vocab_size=32000, max_seq_len=4096,
        pos_embedding="rope", tied_embeddings=False,
        source="a 1B-class GPT with rotary positions (the Atlas build plan's 1B size, without its "
               "~150M memory module)"),
    ModelSpec(
        name="300m-atlas", d_model=1024, n_layers=16, n_heads=8, d_ff=4096, vocab_size=32000, max_seq_len=4096,
        pos_embedding="rope", tied_embeddings=False, memory=True, d_key=1024, d_value=1024, poly_degree=2,
        context_window=16,
        source="the 300M GPT with the Atlas build plan's associative memory in every layer"),
    ModelSpec(
        name="1b-atlas", d_model=1536, n_layers=24, n_heads=12, d_ff=6144, vocab_size=32000, max_seq_len=4096,
        pos_embedding="rope", tied_embeddings=False, memory=True, d_key=1536, d_value=1536, poly_degree=2,
        context_window=16,
        source="the 1B GPT with the Atlas build plan's associative memory in every layer"),
    ModelSpec(
        name="1.31b", d_model=2048, n_layers=24, n_heads=16, d_ff=8192, vocab_size=50304, max_seq_len=2048,
        source="the 1.31B nanoGPT benchmark shape (GPT-2 architecture; BENCHMARKS.md)"),
    ModelSpec(
        name="d24", d_model=1536, n_layers=24, n_heads=12, d_ff=6144, vocab_size=32, max_seq_len=2048,
        **NANOCHAT,
        source="nanochat's architecture at depth 24 (the $1000 setup guide's 680M model; "
               "a character vocabulary of 32)"),
    ModelSpec(
        name="d64", d_model=4096, n_layers=64, n_heads=32, d_ff=16384, vocab_size=32, max_seq_len=2048,
        **NANOCHAT,
        source="nanochat's architecture at depth 64 (the $1000 setup guide calls it ~4.3B; "
               "this shape has 12.9B)"),
    ModelSpec(
        name="7b", d_model=4096, n_layers=32, n_heads=32, d_ff=11008, vocab_size=100278, max_seq_len=4096,
        mlp="swiglu", pos_embedding="rope", tied_embeddings=False,
        source="a 7B model for generation (OLMo-3 7B's shape)"),
)


def nanochat_spec(depth: int) -> ModelSpec:
    """nanochat's family: width = 64 x depth, head_dim 128, vocabulary of the $1000 8x H100 setup guide's d24/d64 (32). An
    odd depth's width is rounded up to a whole number of 128-wide heads, as nanochat's base_train
    rounds its model_dim to the head dim (d7: 512 wide, 4 heads; even depths are unchanged)."""
    d_model = -(-depth * 64 // 128) * 128
    return ModelSpec(
        name=f"d{depth}", d_model=d_model, n_layers=depth, n_heads=max(1, d_model // 128), d_ff=4 * d_model,
        vocab_size=32, max_seq_len=2048, **NANOCHAT,
        source=f"nanochat-style depth {depth} x 64 width")


def modern(spec: ModelSpec) -> ModelSpec:
    """``spec``'s shape with nanochat's architecture: the same widths, depth and vocabulary, so the same
    matmul FLOPs per token (an untied head adds a lookup table, no FLOPs). scripts/bench_trainer.py
    measures it against the GPT-2 original."""
    return dataclasses.replace(spec, name=f"{spec.name}-modern", source=f"{spec.name} with nanochat's architecture",
                               **NANOCHAT)


_DEPTH = re.compile(r"d(\d{1,3})")
MAX_NANOCHAT_DEPTH = 200


def lookup(name: str) -> ModelSpec | None:
    """A preset by name (case-insensitive), or ``dN`` for any nanochat depth 1..200; None if neither."""
    key = name.strip().lower()
    if key in MODELS:
        return MODELS[key]
    m = _DEPTH.fullmatch(key)
    if m and 1 <= int(m.group(1)) <= MAX_NANOCHAT_DEPTH:
        return nanochat_spec(int(m.group(1)))
    return None


# The shape fields as plain numbers, for scripts that read them by key (scripts/bench_trainer.py);
# derived from MODELS, never edited on its own.
PRESETS: dict[str, dict[str, int]] = {
    name: {"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads, "d_ff": s.d_ff,
           "vocab_size": s.vocab_size, "max_seq_len": s.max_seq_len}
    for name, s in MODELS.items()
}
