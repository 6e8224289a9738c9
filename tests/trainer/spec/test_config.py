"""The run config and the presets: seed-shaped files, overrides, one-line errors, the bundled examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.spec.config import ConfigError
from trainer.spec.load import load_config, parse_override
from trainer.spec.modelspec import ModelSpec
from trainer.spec.presets import MODELS
from trainer.spec.resolve import ModelShape, model_spec, resolve_shape

SEED_SHAPED = """
model:
  d_model: 64
  n_layers: 2
  n_heads: 2
  d_ff: 256
  vocab_size: 512
  max_seq_len: 128
  dropout: 0.1
training:
  batch_size: 4
  grad_accum_steps: 32
  learning_rate: 0.0001
  min_lr: 0.00001
  warmup_steps: 2000
  stage1_steps: 80000
  stage2_steps: 8000
  seq_len: 128
  stage2_seq_len: 32
  val_interval: 500
  checkpoint_interval: 5000
  val_patience: 25
hardware:
  mixed_precision: true
  compile: true
data:
  val_split: 0.1
notifications:
  telegram:
    enabled: true
    bot_token: "${TELEGRAM_BOT_TOKEN}"
    chat_id: "${TELEGRAM_CHAT_ID}"
  events: [checkpoint_saved, ppl_spike]
"""



def test_config_seed_shape_and_overrides(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text(SEED_SHAPED)
    cfg = load_config(p, ["--training.max_steps=20", "--limits.max_hours=1.5", "--training.out_dir=/x/y",
                          "--training.eval_prompts=[a, b]"])
    assert cfg.training.max_steps == 20 and cfg.resolved_max_steps() == 20
    assert cfg.limits.max_hours == 1.5 and cfg.training.out_dir == "/x/y"
    assert cfg.training.eval_prompts == ["a", "b"]
    assert cfg.model.d_ff == 256 and cfg.notifications.events == ["checkpoint_saved", "ppl_spike"]
    cfg2 = load_config(p)
    assert cfg2.resolved_max_steps() == 88000  # stage1 + stage2



@pytest.mark.parametrize("override, needle", [
    ("--training.max_stepz=3", "unknown config key 'training.max_stepz'"),
    ("--model.n_layers=two", "model.n_layers: expected an integer"),
    ("--training.learning_rate=-1", "training.learning_rate must be > 0"),
    ("--hardware.device=tpu", "hardware.device must be"),
    ("--model.preset=9b", "model.preset '9b' is unknown"),
    ("--limits.budget_usd=10", "limits.budget_usd needs limits.price_per_hour_usd"),
    ("--limits.max_cost_usd=10", "config key 'limits.max_cost_usd' is now 'limits.budget_usd'"),
    ("--limits.price_per_hour=2", "config key 'limits.price_per_hour' is now 'limits.price_per_hour_usd'"),
    ("--limits.max_hours=.nan", "limits.max_hours must be > 0 and finite"),
    ("--limits.budget_usd=.inf", "limits.budget_usd must be > 0 and finite"),
    ("--faults.kill_at_step=-1", "faults.kill_at_step must be >= 0"),
    ("--model.mlp=tanh", "model.mlp must be gelu, swiglu, relu2"),
    ("--model.logit_softcap=.nan", "model.logit_softcap must be >= 0 and finite"),
    ("--training.matrix_lr=0", "training.matrix_lr must be > 0"),
    ("--model.preset=d999", "model.preset 'd999' is unknown"),
])
def test_config_errors_are_one_line(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["--training.max_steps=5", override])
    assert needle in str(e.value) and "\n" not in str(e.value)



def test_presets_resolve_as_described_and_old_shapes_still_read():
    # The trainer keeps a preset's head and positions unless the config says otherwise (1b is untied).
    assert resolve_shape("1b", data_vocab_size=32000).tied_embeddings is False
    assert resolve_shape("124m", data_vocab_size=256, tie_embeddings=False).tied_embeddings is False
    assert resolve_shape("d32", data_vocab_size=32).d_model == 2048  # any nanochat depth
    assert load_config(None, ["--training.max_steps=5", "--model.preset=d12"]).model.preset == "d12"
    s = resolve_shape("124m", data_vocab_size=256, mlp="swiglu", norm="rmsnorm", pos_embedding="rope", qk_norm=True,
                      n_kv_heads=4, logit_softcap=15.0)
    assert (s.mlp, s.norm, s.pos_embedding, s.qk_norm, s.kv_heads, s.logit_softcap) == ("swiglu", "rmsnorm", "rope",
                                                                                         True, 4, 15.0)
    assert resolve_shape("d24", data_vocab_size=32, logit_softcap=0).logit_softcap is None  # 0 turns it off
    s = resolve_shape("124m", d_model=512, n_heads=8, data_vocab_size=256)
    assert (s.d_model, s.d_ff, s.n_layers, s.vocab_size) == (512, 2048, 12, 256)
    assert resolve_shape("tiny").vocab_size == MODELS["tiny"].vocab_size  # no data yet: the preset's
    with pytest.raises(ValueError, match="preset 'huge' is unknown"):
        resolve_shape("huge", data_vocab_size=256)
    # A checkpoint's meta.json written before the one description (tie_embeddings, no name).
    old = {"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256, "vocab_size": 320, "max_seq_len": 256,
           "dropout": 0.1, "tie_embeddings": False}
    spec = ModelShape(**old)
    assert isinstance(spec, ModelSpec) and spec.tied_embeddings is False and spec.dropout == 0.1
    assert ModelShape(**spec.__dict__) == spec  # what train.py writes now reads back



def test_bundled_example_configs_load():
    root = Path(__file__).resolve().parents[3] / "trainer" / "configs"
    demo = load_config(root / "demo_124m.yaml")
    assert demo.model.preset == "124m" and demo.resolved_max_steps() == 300
    atlas = load_config(root / "atlas_1b.yaml")
    # The Atlas 1B build plan's plan: two stages as the memory's chunk sizes at 4096 tokens, memory on.
    t = atlas.training
    assert atlas.resolved_max_steps() == 88000 and (t.stage1_steps, t.stage2_steps) == (80000, 8000)
    assert (t.stage1_chunk_size, t.stage2_chunk_size, t.seq_len, t.stage2_seq_len) == (2048, 256, 4096, None)
    assert atlas.limits.budget_usd == 100 and atlas.limits.price_per_hour_usd == 2.39
    shape = model_spec(atlas.model, data_vocab_size=32000)
    assert shape.memory and (shape.d_key, shape.d_value, shape.poly_degree, shape.context_window) == (1536, 1536, 2, 16)
    assert shape.d_ff == 6144 and shape.vocab_size == 32000 and shape.max_seq_len == 4096
    assert shape == MODELS["1b-atlas"]  # the preset gpucli plans is the config's model


def test_every_nanochat_depth_is_a_shape_the_trainer_builds():
    """Any dN from 1 to 200 is a valid description (an odd depth once gave 448 wide with 3 heads and
    `gpucli plan --model d7` ended in an internal error)."""
    from trainer.spec.modelspec import spec_problem
    from trainer.spec.presets import MAX_NANOCHAT_DEPTH, lookup

    for depth in range(1, MAX_NANOCHAT_DEPTH + 1):
        spec = lookup(f"d{depth}")
        assert spec is not None and spec_problem(spec) is None, depth
        assert spec.d_model % spec.n_heads == 0 and spec.d_model // spec.n_heads == 128, depth


@pytest.mark.parametrize("text,value", [("3e-4", 3e-4), ("1e5", 1e5), ("-2.5E-3", -2.5e-3), ("0.0003", 3e-4),
                                        ("12", 12), ("1_000", 1000), ("abc", "abc"), ("e5", "e5")])
def test_an_exponent_without_a_dot_is_a_number(text, value):
    """`--set training.learning_rate=3e-4` (and `learning_rate: 3e-4` in a file) is the number a person
    means, not the text YAML 1.1 reads (PyYAML's safe loader wants 3.0e-4)."""
    from trainer.spec.load import load_yaml

    assert parse_override(f"--training.x={text}") == ("training.x", value)
    assert load_yaml(f"x: {text}") == {"x": value}
    cfg = (load_config(None, [f"--training.learning_rate={text}", "--training.max_steps=10"])
           if isinstance(value, float) and 0 < value < 1 else None)
    assert cfg is None or cfg.training.learning_rate == pytest.approx(value)
