"""One resolution of a run's model: for random valid and invalid ``--set model.*`` overrides, the launch's
check (before anything is rented) and the trainer's own resolution, validation and build agree, and
where both accept, the model the launch planned is the model the trainer builds."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucli.errors import GpucliError
from gpucli.plan.catalog import load_catalog
from gpucli.run.inputs.launch import LaunchRequest, resolve

torch = pytest.importorskip("torch")

DATA_VOCAB = 257  # the demo corpus's byte tokenizer: the vocabulary the trainer resolves tiny with

VALUES = {
    "d_model": st.sampled_from([32, 48, 64, 96, 0, -8]),
    "n_layers": st.sampled_from([1, 2, 3, 0]),
    "n_heads": st.sampled_from([1, 2, 3, 4, 8, 0]),
    "n_kv_heads": st.sampled_from([1, 2, 3, 4, 0]),
    "d_ff": st.sampled_from([64, 128, 200, 0]),
    "vocab_size": st.sampled_from([256, 257, 320, 512, 100, 0]),
    "max_seq_len": st.sampled_from([32, 64, 256, 0]),
    "mlp": st.sampled_from(["gelu", "swiglu", "relu2", "tanh"]),
    "pos_embedding": st.sampled_from(["learned", "rope", "alibi"]),
    "norm": st.sampled_from(["layernorm", "rmsnorm", "batchnorm"]),
    "qk_norm": st.sampled_from(["true", "false", "maybe"]),
    "logit_softcap": st.sampled_from([0, 15.0, -1]),
    "dropout": st.sampled_from([0.0, 0.1, 1.5]),
    "memory": st.sampled_from(["true", "false"]),
    "d_key": st.sampled_from([16, 32, 0]),
    "poly_degree": st.sampled_from([1, 2, 0]),
    "context_window": st.sampled_from([4, 16, 0]),
    "gate_init": st.sampled_from([0.5, 0.0, 1.2]),
    "refine_steps": st.sampled_from([0, 2, -1]),
    "refine_layers": st.sampled_from([1, 2, 0]),
}
TRAINING = {
    "training.seq_len": st.sampled_from([16, 64, 128, 4096]),
    "training.stage1_chunk_size": st.sampled_from([8, 16]),
}


@st.composite
def overrides(draw: st.DrawFn) -> tuple[str, ...]:
    keys = draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=5, unique=True))
    out = [f"model.{k}={draw(VALUES[k])}" for k in keys]
    for key in draw(st.lists(st.sampled_from(sorted(TRAINING)), max_size=1, unique=True)):
        out.append(f"{key}={draw(TRAINING[key])}")
    return tuple(out)


def _trainer_builds(sets: tuple[str, ...]) -> tuple[bool, object]:
    """What trainer/train.py does with the run.yaml: load and validate the config, resolve the shape
    against the data's vocabulary, check the sequence lengths and chunk sizes, build the model."""
    from trainer.model.gpt import GPT
    from trainer.spec.config import ConfigError
    from trainer.spec.load import load_config
    from trainer.spec.resolve import model_spec

    try:
        cfg = load_config(None, ["--model.preset=tiny", "--model.max_seq_len=256", "--training.max_steps=5",
                                 *(f"--{s}" for s in sets)])
        shape = model_spec(cfg.model, data_vocab_size=DATA_VOCAB)
        t = cfg.training
        for v in (t.seq_len or shape.max_seq_len, t.stage2_seq_len or t.seq_len or shape.max_seq_len):
            if v > shape.max_seq_len:
                raise ConfigError("seq_len exceeds max_seq_len")
        if not shape.memory and (t.stage1_chunk_size or t.stage2_chunk_size):
            raise ConfigError("chunk sizes need memory")
        GPT(shape)
    except (ValueError, TypeError) as exc:  # ConfigError and SpecError are ValueErrors
        return False, str(exc)
    return True, shape


def test_the_byte_vocabulary_is_the_tokenizers():
    from gpucli.plan.runmodel import BYTE_TOKENIZER_VOCAB
    from trainer.data.tokenizer import ByteTokenizer

    assert ByteTokenizer.vocab_size == BYTE_TOKENIZER_VOCAB


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sets=overrides())
def test_the_launch_refuses_exactly_what_the_trainer_refuses(sets):
    catalog = load_catalog()
    req = LaunchRequest(profile="cpu", provider="local", model="tiny", extra=sets).checked()
    try:
        resolved = resolve(catalog, req, run_name="prop")
        launch_ok, launch_what = True, resolved.model
    except GpucliError as exc:
        launch_ok, launch_what = False, str(exc)
    trainer_ok, trainer_what = _trainer_builds(sets)
    if "model.vocab_size=100" in sets and trainer_ok is False:
        assert "smaller than the data's vocabulary" in str(launch_what) or not launch_ok
    assert launch_ok == trainer_ok, (sets, launch_what, trainer_what)
    if launch_ok:
        assert launch_what == trainer_what  # the same network, field by field


def test_the_shape_override_is_planned_not_the_preset():
    """--set model.* changes the speed, the memory and the disk the launch plans."""
    catalog = load_catalog()

    def run(*sets: str):
        return resolve(catalog, LaunchRequest(profile="h100", provider="runpod", model="124m",
                                              extra=tuple(f"--{s}" for s in sets)).checked(), run_name="p")

    base = run()
    more = run("model.refine_steps=4", "model.vocab_size=65536")
    assert more.model.refine_steps == 4 and more.model.vocab_size == 65536
    assert more.planned.tokens_per_s < base.planned.tokens_per_s  # more FLOPs a token
    assert more.disk is not None and base.disk is not None
    assert more.disk.checkpoints.weights_gb > base.disk.checkpoints.weights_gb


def test_an_override_batch_the_memory_model_refuses_is_refused_before_renting():
    from gpucli.errors import NothingFitsError

    catalog = load_catalog()
    req = LaunchRequest(profile="8xH100", provider="runpod", model="d64", extra=("--training.batch_size=4",)).checked()
    with pytest.raises(NothingFitsError, match=r"micro-batch 4 x 2048 tokens of d64 needs .* GB per GPU") as exc:
        resolve(catalog, req, run_name="p")
    assert "training.batch_size=" in (exc.value.hint or "")


def test_the_extreme_phase_writes_seed_002s_refinement_weights():
    catalog = load_catalog()
    req = LaunchRequest(profile="8xA100", provider="runpod", phase="extreme", model="124m",
                        extra=("--model.refine_steps=3",)).checked()
    r = resolve(catalog, req, run_name="p")
    assert r.trainer_config["training"]["refinement"] == {"supervision_weight_base": 10.0,
                                                          "improvement_reward_scale": 2.0}
    fast = resolve(catalog, LaunchRequest(profile="8xA100", provider="runpod", model="124m",
                                          extra=("--model.refine_steps=3",)).checked(), run_name="p")
    assert fast.trainer_config["training"]["refinement"]["supervision_weight_base"] == 5.0
