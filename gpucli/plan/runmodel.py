"""The model a run trains, resolved before anything is rented (pure): the preset with every
``--set model.*`` over it, by the trainer's own resolution (``trainer.spec.resolve``) and checks, and the
memory fit of the micro-batch the run will use. ``gpucli launch`` (gpucli/run/inputs/launch.py), its dry run
and ``gpucli plan --set`` plan on it, so a shape the trainer would refuse is refused first."""

from __future__ import annotations

import math
from typing import Any

from gpucli.errors import NothingFitsError, UsageError
from gpucli.plan.disk import checkpoints_written
from gpucli.plan.estimate import Fit, choose_micro_batch, parse_duration_hours, peak_train_memory
from gpucli.plan.schema import Catalog, ModelShape, Stages
from trainer.spec.config import ConfigError
from trainer.spec.load import apply_override, parse_override, validated_config
from trainer.spec.modelspec import spec_problem, unsupported_message
from trainer.spec.resolve import model_spec

BYTE_TOKENIZER_VOCAB = 257  # trainer/data/tokenizer.py ByteTokenizer: 256 bytes + end of text


def run_spec(checked: Any, error: type[Exception], *, data_known: bool = True) -> Any:
    """The model the trainer will build, from the trainer's own resolution (trainer.spec.resolve):
    the preset with every ``model.*`` override, and the data's vocabulary where the tokenizer fixes it
    before the data is prepared (bytes: 257; a BPE: at most ``data.bpe_vocab_size``), as the trainer
    resolves it on the pod. Otherwise (characters, a tokenizer file) the vocabulary is known only on
    the pod; a run with no preset and no vocabulary checks its shape here with a stand-in of 64 (the
    vocabulary changes no other field's validity)."""
    m = checked.model
    data_vocab = None if not data_known else BYTE_TOKENIZER_VOCAB if checked.data.tokenizer == "byte" else (
        checked.data.bpe_vocab_size if checked.data.tokenizer == "bpe" else None)
    stand_in = data_vocab or (64 if m.preset is None and m.vocab_size is None else None)
    try:
        return model_spec(m, data_vocab_size=stand_in)
    except ValueError as exc:  # SpecError and the resolution's own refusals name the field
        raise error(str(exc)) from None


def check_model(checked: Any, error: type[Exception], *, data_known: bool = True) -> None:
    """What the trainer checks only once it builds the model, checked here without torch: the shape
    the preset and the ``model.*`` overrides make (heads dividing the width, what the trainer can
    build), and sequence lengths within the model's context."""
    spec = run_spec(checked, error, data_known=data_known)
    problem = spec_problem(spec)
    if problem:
        raise error(f"model.{problem[0]}: {problem[1]}")
    refusal = unsupported_message(spec)
    if refusal:
        raise error(refusal)
    t = checked.training
    for name, value in (("training.seq_len", t.seq_len), ("training.stage2_seq_len", t.stage2_seq_len)):
        if value is not None and value > spec.max_seq_len:
            raise error(f"{name}={value} exceeds the model's max_seq_len {spec.max_seq_len}")
    if not spec.memory and (t.stage1_chunk_size or t.stage2_chunk_size):  # as trainer/train.py refuses it
        raise error("training.stage1_chunk_size/stage2_chunk_size set the memory's chunk size: "
                    "they need a model with memory (model.memory: true, or model.d_key ...)")


def resolved_model(preset: ModelShape, overrides: tuple[str, ...], *, data_known: bool = True) -> ModelShape:
    """The model a launch trains: ``preset`` with every ``--set model.*`` over it, resolved by the
    trainer's own function (trainer.spec.resolve) and checked as the trainer checks it, before the
    batch is chosen, so the fit, the speed and the disk are planned on it. ``data_known``: the run's
    tokenizer (``data.tokenizer``, bytes by default) sizes the vocabulary as on the pod; ``gpucli plan``
    has no data and keeps the preset's unless ``data.tokenizer`` is set."""
    raw: dict[str, Any] = {"model": {"preset": preset.name, "max_seq_len": preset.max_seq_len},
                           "training": {"max_steps": 1}}  # the model alone here; the run's config is checked later
    try:
        for item in overrides:
            item = item if item.startswith("--") else f"--{item}"
            if item.startswith(("--model.", "--data.tokenizer=", "--data.bpe_vocab_size=")) and "=" in item:
                apply_override(raw, *parse_override(item))
        checked = validated_config(raw)
        data_known = data_known or "tokenizer" in raw.get("data", {})
        spec = run_spec(checked, ConfigError, data_known=data_known)
        check_model(checked, ConfigError, data_known=data_known)
    except ConfigError as exc:
        raise UsageError(f"trainer config: {exc}",
                         hint="--set takes section.key=value, with the keys of the trainer's run.yaml") from None
    return spec


def check_fit(catalog: Catalog, model: ModelShape, gpu: Any, n_gpus: int, fit: str, micro: int, seq_len: int,
              chunks: tuple[int, ...] = ()) -> None:
    """A NothingFitsError when the micro-batch the run will use (an override's included) does not fit
    the planner's memory model, said with the micro-batch that does."""
    sharded = n_gpus if fit == Fit.SHARDED.value else 1
    usable = gpu.vram_gb * catalog.defaults.usable_vram_fraction
    need = peak_train_memory(model, catalog.defaults, micro, seq_len, sharded, chunks)
    if need.total_gb <= usable:
        return
    fits = choose_micro_batch(model, catalog.defaults, gpu.vram_gb, n_gpus, seq_len, max_micro_batch=micro,
                              chunks=chunks)
    hint = (f"--set training.batch_size={fits.memory.micro_batch} fits (raise training.grad_accum_steps to keep "
            "the batch)" if fits.fit is not Fit.NO else "a larger profile or a smaller --model")
    raise NothingFitsError(
        f"micro-batch {micro} x {seq_len} tokens of {model.name or 'the model'} needs {need.total_gb:.1f} GB per GPU "
        f"on {n_gpus}x {gpu.name} ({usable:.0f} GB usable of {gpu.vram_gb:g})", hint=hint)


def training_overrides(overrides: tuple[str, ...]) -> dict[str, Any]:
    """The ``--set training.KEY=VALUE`` values, parsed as the trainer parses them (bad ones are left to
    the full config check)."""
    out: dict[str, Any] = {}
    for item in overrides:
        item = item if item.startswith("--") else f"--{item}"
        if item.startswith("--training.") and "=" in item:
            try:
                key, value = parse_override(item)
            except ConfigError:
                continue
            out[key.split(".", 1)[1]] = value
    return out


def run_stages(phase_stages: Any, overrides: tuple[str, ...]) -> Any:
    """The run's two stages (``gpucli.plan.schema.Stages``): the phase's, with any ``--set
    training.stage1_steps`` ... over them; None for a one-stage run."""
    t = training_overrides(overrides)
    keys = ("stage1_steps", "stage2_steps", "stage1_chunk_size", "stage2_chunk_size")
    base = {k: getattr(phase_stages, k) for k in keys} if phase_stages is not None else {}
    base.update({k: t[k] for k in keys if isinstance(t.get(k), int) and not isinstance(t.get(k), bool)})
    if not isinstance(base.get("stage1_steps"), int):
        return None
    return Stages(stage1_steps=base["stage1_steps"], stage2_steps=base.get("stage2_steps") or 0,
                  stage1_chunk_size=base.get("stage1_chunk_size"), stage2_chunk_size=base.get("stage2_chunk_size"))


def stage_chunks(model: ModelShape, stages: Any) -> tuple[int, ...]:
    """The memory's chunk size in each stage (none without a memory)."""
    if not model.memory:
        return ()
    if stages is None:
        return (2048,)
    return tuple(c for _, c in stages.shares() if c) or (2048,)


def checkpoints_planned(checked: Any, steps: int, planned_hours: float | None, limits: Any) -> tuple[int, str]:
    """How many checkpoints the run writes, over the hours it runs: the planned hours of its steps, cut
    by --hours and by what --budget buys at the price."""
    t = checked.training
    caps = [(planned_hours, f"the {steps:,} steps' planned {planned_hours:.1f} h" if planned_hours else "")]
    if limits.max_hours:
        caps.append((limits.max_hours, f"--hours {limits.max_hours:g}"))
    if limits.budget_usd and limits.price_per_hour_usd:
        h = limits.budget_usd / limits.price_per_hour_usd
        caps.append((h, f"the {h:.1f} h ${limits.budget_usd:g} buys at ${limits.price_per_hour_usd:g}/h"))
    known = [(h, why) for h, why in caps if h]
    hours, why = min(known) if known else (None, "")
    n = checkpoints_written(steps, t.checkpoint_interval, hours, t.checkpoint_every_s)
    every = f"every {t.checkpoint_interval:,} steps" if t.checkpoint_interval < steps else "the final one"
    if t.checkpoint_every_s:
        every += f" and every {t.checkpoint_every_s / 3600:g} h" if t.checkpoint_every_s >= 3600 else \
            f" and every {t.checkpoint_every_s / 60:g} min"
    return n, f"{every}, over {why}" if why else every


def parse_checkpoint_every(text: str) -> dict[str, Any]:
    """``--checkpoint-every``: ``1h``/``30m``/``90s`` -> checkpoint_every_s; a plain number -> steps."""
    s = text.strip().lower()
    if s.isdigit():
        if int(s) < 1:
            raise UsageError(f"--checkpoint-every must be at least 1 step, got {text}")
        return {"checkpoint_interval": int(s)}

    if not s or s[-1] not in "smhd":
        raise UsageError(f"--checkpoint-every: '{text}' is neither a duration (1h, 30m) nor a number of steps")
    try:
        return {"checkpoint_every_s": parse_duration_hours(s) * 3600.0}
    except ValueError as exc:
        raise UsageError(f"--checkpoint-every: {exc}") from None


def keep_global_batch(samples: int, accum: int, fits: int) -> tuple[int, int, str | None]:
    """(micro-batch, grad accum, note) keeping the profile's sequences per GPU per step (samples x
    accum) at a micro-batch that fits in memory (``fits``).

    The micro-batch is the largest divisor of that product that fits, so the global batch the profile
    was tuned with is kept exactly (14 x 2 with room for 8 becomes 7 x 4, not 8 x 4). Where the only
    such divisor is under half of what fits (a prime product, say), it is too slow a micro-batch: the
    largest that fits is used and the note says how the batch changes."""
    per_gpu = samples * accum
    if samples <= fits:
        return samples, accum, None
    exact = max(d for d in range(1, fits + 1) if per_gpu % d == 0)
    if exact * 2 >= fits:
        return exact, per_gpu // exact, None
    new_accum = math.ceil(per_gpu / fits)
    return fits, new_accum, (f"the profile's {samples} x {accum} sequences per GPU per step do not fit in memory "
                             f"and {per_gpu} has no divisor near {fits}: {fits} x {new_accum} = "
                             f"{fits * new_accum} per GPU instead")
