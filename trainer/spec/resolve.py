"""A run's model, resolved without torch: the preset (:mod:`trainer.spec.presets`) with every
``model.*`` value of run.yaml over it. The trainer builds exactly this; gpucli's launch, dry run,
planner, disk and memory checks use the same function, so a shape the trainer would refuse is
refused before anything is rented."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.spec.modelspec import ModelSpec, research_changes, spec_from_mapping
from trainer.spec.presets import MODELS, lookup


def ModelShape(*args: Any, **kwargs: Any) -> ModelSpec:  # noqa: N802 - the trainer's earlier class name
    """A :class:`ModelSpec` from the trainer's earlier shape arguments: positional ``(d_model, n_layers,
    n_heads, d_ff, vocab_size, max_seq_len, dropout, tie_embeddings)`` or those keywords, as checkpoints'
    ``meta.json`` and scripts/bench_trainer.py still write them. New code builds ``ModelSpec`` itself."""
    if len(args) > len(_LEGACY_ORDER):
        raise TypeError(f"ModelShape takes at most {len(_LEGACY_ORDER)} positional arguments")
    data = dict(zip(_LEGACY_ORDER, args, strict=False))
    for key, value in kwargs.items():
        if key in data:
            raise TypeError(f"ModelShape got {key!r} twice")
        data[key] = value
    return spec_from_mapping(data)


_LEGACY_ORDER = ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len", "dropout",
                 "tie_embeddings")


def round_up(n: int, multiple: int = 64) -> int:
    return (n + multiple - 1) // multiple * multiple


def resolve_shape(
    preset: str | None,
    *,
    data_vocab_size: int | None = None,
    d_model: int | None = None,
    n_layers: int | None = None,
    n_heads: int | None = None,
    d_ff: int | None = None,
    vocab_size: int | None = None,
    max_seq_len: int | None = None,
    dropout: float = 0.0,
    tie_embeddings: bool | None = None,
    n_kv_heads: int | None = None,
    mlp: str | None = None,
    pos_embedding: str | None = None,
    norm: str | None = None,
    qk_norm: bool | None = None,
    logit_softcap: float | None = None,
    **research: Any,
) -> ModelSpec:
    """The preset's description (trainer/spec/presets.py), with explicit values over it.

    The vocabulary is the explicit one, else the data's padded to a multiple of 64, else the preset's:
    the data decides what the embedding must hold. ``d_ff`` follows an explicit ``d_model`` (4x) unless
    given too. Without a preset, d_model, n_layers and n_heads are required; the rest is GPT-2's.
    The architecture fields (``mlp``, ``norm``, ...) replace the preset's when given; a
    ``logit_softcap`` of 0 turns the cap off. ``research``: the memory and refinement fields
    (:func:`trainer.spec.modelspec.research_changes`)."""
    base = None
    if preset:
        base = lookup(preset)
        if base is None:
            raise ValueError(f"model.preset '{preset}' is unknown (choose from {', '.join(MODELS)} or dN)")
    explicit = {"d_model": d_model, "n_layers": n_layers, "n_heads": n_heads}
    missing = [k for k, v in explicit.items() if v is None] if base is None else []
    if missing:
        raise ValueError(f"model shape needs model.preset or model.{', model.'.join(missing)}")
    if vocab_size is None:
        if data_vocab_size is not None:
            vocab_size = round_up(data_vocab_size)
        elif base is not None:
            vocab_size = base.vocab_size
        else:
            raise ValueError("model.vocab_size is not set and no prepared data gives one")
    elif data_vocab_size is not None and vocab_size < data_vocab_size:
        raise ValueError(f"model.vocab_size {vocab_size} is smaller than the data's vocabulary {data_vocab_size}")
    if base is None:
        base = ModelSpec(d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=d_ff or 4 * d_model,  # type: ignore[arg-type, operator]
                         vocab_size=vocab_size, max_seq_len=max_seq_len or 1024)
    changes: dict[str, Any] = {k: v for k, v in explicit.items() if v is not None}
    if d_ff is not None:
        changes["d_ff"] = d_ff
    elif d_model is not None and d_model != base.d_model:
        changes["d_ff"] = 4 * d_model
    if max_seq_len is not None:
        changes["max_seq_len"] = max_seq_len
    if tie_embeddings is not None:
        changes["tied_embeddings"] = tie_embeddings
    arch = {"n_kv_heads": n_kv_heads, "mlp": mlp, "pos_embedding": pos_embedding, "norm": norm, "qk_norm": qk_norm}
    changes.update({k: v for k, v in arch.items() if v is not None})
    if logit_softcap is not None:
        changes["logit_softcap"] = logit_softcap or None
    changes.update(research_changes(**research))
    if "n_heads" in changes and n_kv_heads is None and base.n_kv_heads is not None \
            and changes["n_heads"] % base.n_kv_heads:
        changes["n_kv_heads"] = None  # the preset's grouping does not fit the new head count
    return dataclasses.replace(base, vocab_size=vocab_size, dropout=dropout, **changes)


def model_spec(model: Any, data_vocab_size: int | None = None) -> ModelSpec:
    """The model a run's ``model`` section (:class:`trainer.spec.config.ModelConfig`) describes: every
    field passed to :func:`resolve_shape`, so the trainer and gpucli's launch checks resolve the same
    shape from the same function. Raises ``ValueError`` (``SpecError``) naming the field at fault."""
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "preset"}
    return resolve_shape(model.preset, data_vocab_size=data_vocab_size, **fields)
