"""In-process tests of the trainer's parts: config, model, data, checkpoints, metrics, notifier."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import logging
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainer.data.loader import BatchLoader, ByteTokenizer, TokenSplit, stdlib_sources, val_batches
from trainer.loop import checkpoint as ckpt
from trainer.loop.optim import lr_factor
from trainer.model.gpt import GPT, chunked_cross_entropy
from trainer.spec.config import ConfigError
from trainer.spec.load import load_config
from trainer.spec.modelspec import ModelSpec, SpecError, unsupported_fields
from trainer.spec.presets import MODELS
from trainer.spec.resolve import ModelShape, resolve_shape
from trainer.watch.metrics import SpikeDetector, mfu, peak_flops
from trainer.watch.notify import Notifier

# ---------------------------------------------------------------------------------------------- config

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


# ---------------------------------------------------------------------------------------------- model

def test_fused_chunked_loss_matches_reference_loss_and_grads():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    tgt = torch.randint(0, 50, (37,))
    tgt[:5] = -1  # ignored positions
    loss = chunked_cross_entropy(h, w, tgt, chunk_rows=8)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = F.cross_entropy(h @ w.t(), tgt, ignore_index=-1)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)
    with torch.no_grad():  # the eval path computes no gradients but the same loss
        assert torch.allclose(chunked_cross_entropy(h, w, tgt, 8), ref, atol=1e-5)


def test_model_hidden_states_and_param_counts():
    shape = resolve_shape("tiny", data_vocab_size=257)
    assert shape.vocab_size == 320  # padded to a multiple of 64
    m = GPT(shape)
    loss, hidden = m(torch.randint(0, 257, (2, 16)), torch.randint(0, 257, (2, 16)), return_hidden=True)
    assert loss.ndim == 0 and len(hidden) == shape.n_layers + 1 and hidden[-1].shape == (2, 16, 64)
    # The nanoGPT benchmark shape: 124M params with the tied head counted once, positions excluded.
    big = resolve_shape("124m", vocab_size=50304)
    n = 12 * (4 * 768 * 768 + 2 * 768 * 3072 + 2 * 768) + 50304 * 768 + 768
    with torch.device("meta"):
        g = GPT(big)
    assert g.num_params() == n
    assert g.flops_per_token(1024) == 6 * n + 12 * 12 * 768 * 1024
    with pytest.raises(ValueError, match="smaller than the data"):
        resolve_shape("tiny", data_vocab_size=257, vocab_size=100)


@pytest.mark.parametrize("name", list(MODELS))
def test_every_preset_builds_the_parameter_count_the_planner_prices(name):
    """One description: the planner's count for a preset is the built model's, exactly, and the trainer
    builds every preset as described (no substitution)."""
    from gpucli.plan.catalog import load_catalog
    from gpucli.plan.estimate import count_params

    spec = MODELS[name]
    planned = count_params(load_catalog().model(name))
    assert planned == spec.param_count()
    assert unsupported_fields(spec) == []
    with torch.device("meta"):
        g = GPT(spec)
    assert g.num_params(exclude_position=False) == planned.total == spec.num_params()
    assert g.num_params() == planned.total - planned.position  # the trainer's count leaves out a table
    assert g.flops_per_token(spec.max_seq_len) == spec.train_flops_per_token()
    assert (g.wpe is None) == (spec.pos_embedding == "rope") and (g.lm_head is None) == spec.tied_embeddings
    assert g.blocks[0].mlp.kind == spec.mlp and (g.blocks[0].attn.q_norm is not None) == spec.qk_norm


def test_model_description_checks_and_the_trainer_builds_each_choice():
    with pytest.raises(SpecError, match="n_kv_heads: n_heads 12 is not divisible by n_kv_heads 5"):
        dataclasses.replace(MODELS["124m"], n_kv_heads=5)
    with pytest.raises(SpecError, match="mlp: must be one of gelu, swiglu, relu2"):
        dataclasses.replace(MODELS["124m"], mlp="tanh")
    with pytest.raises(SpecError, match="logit_softcap"):
        dataclasses.replace(MODELS["124m"], logit_softcap=float("nan"))
    gqa = dataclasses.replace(MODELS["124m"], mlp="relu2", norm="rmsnorm", qk_norm=True, n_kv_heads=4,
                              logit_softcap=15.0)
    assert unsupported_fields(gqa) == []
    # Counted by hand: GQA shrinks k and v to 4 heads of 64; parameter-free norms count nothing.
    p = gqa.param_count()
    assert p.attention == 12 * (2 * 768 * 768 + 2 * 768 * 256) and p.norms == 0
    assert MODELS["7b"].param_count().mlp == 32 * 3 * 4096 * 11008
    assert MODELS["124m"] == dataclasses.replace(MODELS["124m"], name="x")  # 124m stays GPT-2
    assert (MODELS["124m"].mlp, MODELS["124m"].norm, MODELS["124m"].pos_embedding) == ("gelu", "layernorm", "learned")
    d24 = MODELS["d24"]
    assert (d24.mlp, d24.norm, d24.qk_norm, d24.logit_softcap, d24.tied_embeddings) == ("relu2", "rmsnorm", True,
                                                                                        15.0, False)


def _tiny(**kw):
    return dataclasses.replace(MODELS["tiny"], **kw)


def test_softcapped_fused_loss_matches_the_reference():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    tgt = torch.randint(0, 50, (37,))
    tgt[:3] = -1
    loss = chunked_cross_entropy(h, w, tgt, chunk_rows=8, softcap=5.0)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = F.cross_entropy(5.0 * torch.tanh((h @ w.t()) / 5.0), tgt, ignore_index=-1)
    ref.backward()
    assert torch.allclose(loss, ref, atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(chunked_cross_entropy(h, w, tgt, 8, softcap=5.0), ref, atol=1e-5)


def test_gqa_equals_multi_head_attention_with_repeated_kv_heads():
    """A grouped-query model is the plain multi-head model whose key/value heads are repeated."""
    torch.manual_seed(0)
    gqa = GPT(_tiny(n_heads=4, n_kv_heads=2, pos_embedding="rope"))
    mha = GPT(_tiny(n_heads=4, pos_embedding="rope"))
    sd = gqa.state_dict()
    for i in range(2):
        w = sd[f"blocks.{i}.attn.qkv.weight"]
        q, k, v = w.split([64, 32, 32])
        rep = [t.view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64) for t in (k, v)]
        sd[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q, *rep])
    mha.load_state_dict(sd)
    x = torch.randint(0, 256, (2, 24))
    assert torch.allclose(gqa(x, x), mha(x, x), atol=1e-5)


def test_rope_attends_by_relative_position_and_init_suits_each_architecture():
    from trainer.model.gpt import apply_rotary, rotary_tables

    cos, sin = rotary_tables(64, 16)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i, j):
        return float((apply_rotary(q, cos[i : i + 1], sin[i : i + 1]) * apply_rotary(k, cos[j : j + 1], sin[j : j + 1])).sum())

    assert score(5, 3) == pytest.approx(score(40, 38), abs=1e-4) and score(5, 3) != pytest.approx(score(5, 4), abs=1e-3)
    torch.manual_seed(0)
    modern = GPT(dataclasses.replace(MODELS["d24"], d_model=64, n_layers=2, n_heads=2, d_ff=256, vocab_size=256,
                                     max_seq_len=64))
    assert modern.wpe is None and "rope_cos" not in modern.state_dict()
    x = torch.randint(0, 256, (2, 32))
    # nanochat's init: zero head, so the first prediction is uniform.
    assert float(modern(x, x).detach()) == pytest.approx(math.log(256), abs=1e-5)
    assert float(modern.blocks[0].attn.proj.weight.detach().abs().sum()) == 0.0
    for spec in (_tiny(mlp="swiglu", n_kv_heads=1), _tiny(norm="rmsnorm", qk_norm=True, logit_softcap=30.0),
                 _tiny(pos_embedding="rope", qk_norm=True, tied_embeddings=False)):
        m = GPT(spec)
        loss = m(x, x)
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in m.parameters())
        assert m(x).shape == (2, 256)
    with torch.device("meta"):  # FSDP builds on meta, then to_empty + reset_parameters fill the tables
        late = GPT(_tiny(pos_embedding="rope"))
    late.to_empty(device="cpu")
    late.reset_parameters()
    assert torch.allclose(late.rope_cos, rotary_tables(256, 32)[0])


def test_fp8_is_refused_where_it_cannot_run():
    from trainer.loop.dist import Dist, build_model
    from trainer.model.fp8 import fp8_problem
    from trainer.spec.config import Config

    assert "this run is on cpu" in fp8_problem(torch.device("cpu"))
    cfg = load_config(None, ["--training.max_steps=5", "--hardware.fp8=true", "--hardware.device=cpu"])
    with pytest.raises(ConfigError, match="hardware.fp8 needs a CUDA GPU of compute capability >= 8.9") as e:
        build_model(cfg, Dist(0, 0, 1, torch.device("cpu")), MODELS["tiny"], amp=False)
    assert "\n" not in str(e.value)
    assert Config().hardware.fp8 is False  # off unless asked for


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


def test_lr_schedule_warmup_cosine():
    assert lr_factor(0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(100, 10, 100, 0.1) == pytest.approx(0.1)
    vals = [lr_factor(s, 10, 100, 0.1) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(vals, vals[1:], strict=False))


# ---------------------------------------------------------------------------------------------- data

def test_provenance_points_at_the_real_line(data_dir):
    split = TokenSplit(data_dir, "train")
    root, _ = stdlib_sources()
    tok = ByteTokenizer()
    for pos in (0, 12345, len(split) // 2, len(split) - 3):
        f, line = split.source(pos)
        text_line = (root / f).read_text().splitlines(keepends=True)[line - 1]
        # walk back to the line's first token and compare bytes
        li = int(np.searchsorted(split.line_starts, pos, side="right")) - 1
        start = int(split.line_starts[li])
        got = tok.decode(np.asarray(split.tokens[start : start + len(text_line.encode())]).tolist())
        assert got == text_line


def test_loader_is_deterministic_resumable_and_rank_disjoint(data_dir):
    split = TokenSplit(data_dir, "train")
    a = BatchLoader(split, 4, 32, seed=3)
    first = [a.next().starts.copy() for _ in range(5)]
    state = a.state_dict()
    rest = [a.next().starts.copy() for _ in range(3)]
    b = BatchLoader(split, 4, 32, seed=3)
    b.load_state_dict(state)
    assert all((x == y).all() for x, y in zip(rest, [b.next().starts for _ in range(3)], strict=True))
    r0, r1 = BatchLoader(split, 4, 32, 0, 2, seed=3), BatchLoader(split, 4, 32, 1, 2, seed=3)
    assert not set(r0.next().starts) & set(r1.next().starts)
    assert len(first) == 5
    v0 = val_batches(TokenSplit(data_dir, "val"), 3, 4, 32, 0, 2)
    v1 = val_batches(TokenSplit(data_dir, "val"), 3, 4, 32, 1, 2)
    assert len(v0) == len(v1) == 3


def test_bpe_tokenizer_roundtrip(tmp_path):
    pytest.importorskip("tokenizers")
    from trainer.data.loader import load_tokenizer, prepare

    src = tmp_path / "a.txt"
    src.write_text("hello world\n" * 600 + "def f(x):\n    return x + 1\n" * 300)
    meta = prepare([str(src)], tmp_path / "d", "bpe", bpe_vocab_size=300, val_split=0.2, log=lambda m: None)
    tok = load_tokenizer(tmp_path / "d")
    assert meta["vocab_size"] <= 300 and tok.decode(tok.encode("hello world\n")) == "hello world\n"
    f, line = TokenSplit(tmp_path / "d", "val").source(0)
    assert f == str(src) and (line - 1) % 200 == 0  # validation holds whole 200-line documents


# ---------------------------------------------------------------------------------------------- checkpoints

def _fake_ckpt(root: Path, step: int, val: float | None) -> Path:
    return ckpt.save_checkpoint(root, step, rank=0, world=1, model_state={"w": torch.full((4,), float(step))},
                                optim_state={"o": torch.zeros(2)}, meta={"val_loss": val})


def test_save_hashes_files_and_keep_last_plus_best(tmp_path):
    root = tmp_path / "checkpoints"
    vals = {10: 3.0, 20: 1.5, 30: 2.0, 40: 2.5, 50: 2.2}
    for s, v in vals.items():
        _fake_ckpt(root, s, v)
        ckpt.prune(root, keep_last=2)
    names = sorted(p.name for _, p in ckpt.list_checkpoints(root))
    assert names == ["step_000020", "step_000040", "step_000050"]  # last 2 + best (val 1.5)
    meta = json.loads((root / "step_000050" / "meta.json").read_text())
    assert meta["sha256"] == hashlib.sha256((root / "step_000050" / "model.pt").read_bytes()).hexdigest()
    assert set(meta["files"]) == {"model.pt", "optim_rank0.pt"} and meta["step"] == 50
    assert not list(root.glob(".tmp_*")) and not list(root.glob(".del_*"))


def test_prune_takes_a_checkpoint_out_of_sight_before_deleting_it(tmp_path, monkeypatch):
    """A reader listing the folder (fetch-best on a live run) must never see a checkpoint half
    deleted: it is renamed to a hidden name in one step, then deleted; leftovers of a crash mid-delete
    go at the next prune."""
    root = tmp_path / "checkpoints"
    for s, v in {10: 3.0, 20: 2.0, 30: 2.5}.items():
        _fake_ckpt(root, s, v)
    (root / ".del_step_000001").mkdir()
    deleted = []
    real = ckpt.shutil.rmtree
    monkeypatch.setattr(ckpt.shutil, "rmtree", lambda p, **kw: (deleted.append(Path(p).name), real(p, **kw)))
    assert [p.name for p in ckpt.prune(root, keep_last=1)] == ["step_000010"]
    assert "step_000010" not in deleted and ".del_step_000010" in deleted and ".del_step_000001" in deleted
    assert sorted(p.name for p in root.iterdir()) == ["step_000020", "step_000030"]


def test_parallel_files_hash_what_is_on_disk_and_staging_keeps_structure(tmp_path):
    """Large writes are hashed on helper threads while the same bytes are written, two files at once;
    each sha256 must still be the file's. Staging leaves CPU tensors (and everything else) as is."""
    from collections import OrderedDict

    big = {"w": torch.randn(3 * 2**20), "tied": None}  # 12 MiB: the overlapped path
    big["tied"] = big["w"]
    state = {"model.pt": OrderedDict(a=big["w"], b=torch.arange(5)),
             "optim_rank0.pt": {"optimizer": {"state": {0: {"exp_avg": big["w"] * 2}}}, "rng": (1, [2, None])}}
    staged = ckpt.HostStaging().to_host(state)
    assert type(staged["model.pt"]) is OrderedDict and staged["model.pt"]["a"] is big["w"]
    assert staged["optim_rank0.pt"]["rng"] == (1, [2, None])
    hashes = ckpt.save_files(staged, tmp_path)
    for name, sha in hashes.items():
        assert sha == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    assert torch.equal(loaded["a"], big["w"]) and torch.equal(loaded["b"], torch.arange(5))


def test_truncated_checkpoint_is_skipped(tmp_path):
    root = tmp_path / "checkpoints"
    _fake_ckpt(root, 10, None)
    newest = _fake_ckpt(root, 20, None)
    data = (newest / "model.pt").read_bytes()
    (newest / "model.pt").write_bytes(data[: len(data) // 2])
    ok, reason = ckpt.verify(newest)
    assert not ok and "sha256" in reason
    msgs: list[str] = []
    assert ckpt.find_resumable(root, log=msgs.append) == root / "step_000010"
    assert any("step_000020" in m for m in msgs)


# ---------------------------------------------------------------------------------------------- metrics

def test_mfu_table_and_unknown_device():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("Some Future GPU") is None and mfu(1e6, 1e9, None) is None
    assert mfu(485_937, 6 * 124e6, 989e12) == pytest.approx(485_937 * 6 * 124e6 / 989e12)


def test_spike_detector():
    d = SpikeDetector(window=10, factor=2.0, min_history=3)
    assert all(d.update(v) is None for v in (10, 11, 9, 10))
    assert d.update(25.0) == pytest.approx(10.0)
    assert d.update(12.0) is None


# ---------------------------------------------------------------------------------------------- telegram

def test_notifier_sends_in_background_and_never_logs_token(monkeypatch, caplog):
    got: list[tuple[str, dict]] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got.append((self.path, body))
            self.send_response(500 if body["text"] == "fail" else 200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("TELEGRAM_API_BASE", f"http://127.0.0.1:{srv.server_port}")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "SECRET-TOKEN-123")
    monkeypatch.setenv("TELEGRAM_CHAT_ID", "42")
    caplog.set_level(logging.WARNING)
    n = Notifier(events=["checkpoint_saved"])
    n.send("hello", "checkpoint_saved")
    n.send("filtered", "ppl_spike")
    n.send("fail", "checkpoint_saved")
    n.close()
    srv.shutdown()
    assert [b["text"] for _, b in got] == ["hello", "fail"]
    assert got[0][0] == "/botSECRET-TOKEN-123/sendMessage" and got[0][1]["chat_id"] == "42"
    assert n.sent == 1 and n.failed == 1
    assert "SECRET" not in caplog.text and "SECRET" not in repr(n)
    # Unreachable server: still never raises.
    monkeypatch.setenv("TELEGRAM_API_BASE", "http://127.0.0.1:9")
    n2 = Notifier(timeout_s=0.5)
    n2.send("x")
    n2.close()
    assert n2.failed == 1


def test_bundled_example_configs_load():
    root = Path(__file__).resolve().parents[2] / "trainer" / "configs"
    demo = load_config(root / "demo_124m.yaml")
    assert demo.model.preset == "124m" and demo.resolved_max_steps() == 300
    atlas = load_config(root / "atlas_1b.yaml")
    # Seed 000's plan: two stages as the memory's chunk sizes at 4096 tokens, memory on.
    t = atlas.training
    assert atlas.resolved_max_steps() == 88000 and (t.stage1_steps, t.stage2_steps) == (80000, 8000)
    assert (t.stage1_chunk_size, t.stage2_chunk_size, t.seq_len, t.stage2_seq_len) == (2048, 256, 4096, None)
    assert atlas.limits.budget_usd == 100 and atlas.limits.price_per_hour_usd == 2.39
    from trainer.spec.presets import MODELS
    from trainer.spec.resolve import model_spec

    shape = model_spec(atlas.model, data_vocab_size=32000)
    assert shape.memory and (shape.d_key, shape.d_value, shape.poly_degree, shape.context_window) == (1536, 1536, 2, 16)
    assert shape.d_ff == 6144 and shape.vocab_size == 32000 and shape.max_seq_len == 4096
    assert shape == MODELS["1b-atlas"]  # the preset gpucli plans is the config's model


# ---------------------------------------------------------------------------------------------- limits


def test_stop_reserve_counts_measured_validation_and_sampling_time():
    from trainer.loop.limits import SHUTDOWN_S, RunClock
    from trainer.spec.config import LimitsConfig

    now = time.time()
    # A 60 s cap, 40 s gone; a step takes 1 s and a checkpoint 2 s: without validation and sampling
    # the reserve is 1 + 2 x 2 + 5 = 10 s, and 40 + 10 < 60 lets the run go on.
    clock = RunClock(LimitsConfig(max_hours=60 / 3600, budget_usd=1.0, price_per_hour_usd=60.0), started_at=now - 40)
    clock.timings.step(1.0)
    clock.timings.checkpoint(2.0)
    assert clock.timings.reserve_s() == pytest.approx(1 + 4 + SHUTDOWN_S)
    assert clock.caps_ahead() == (False, False)
    # Validation took 6 s once and 3 s later, sampling 4 s: the slowest of each counts, 20 s in all.
    clock.timings.validation(6.0)
    clock.timings.validation(3.0)
    clock.timings.sampling(4.0)
    assert clock.timings.reserve_s() == pytest.approx(1 + 6 + 4 + 4 + SHUTDOWN_S)
    assert clock.caps_ahead() == (True, True)  # 40 + 20 >= 60 s, and 60 s at $60/h is the $1 budget
    assert clock.cost() == pytest.approx(40 / 60, abs=0.05)


def test_integrations_are_null_objects_when_off(tmp_path):
    from trainer.watch.components import (
        FaultHook,
        NoAlerts,
        NoCostUpdates,
        NoFaults,
        NoHighLossLog,
        make_alerts,
        make_cost_updates,
        make_fault_hook,
        make_high_loss_log,
    )

    on = load_config(None, ["--training.max_steps=5", "--notifications.telegram.enabled=true",
                            "--notifications.telegram.bot_token=t", "--notifications.telegram.chat_id=c"])
    assert isinstance(make_alerts(on, master=False), NoAlerts)  # only rank 0 alerts
    off = load_config(None, ["--training.max_steps=5", "--training.high_loss_threshold=null"])
    alerts = make_alerts(off, master=True)
    assert isinstance(alerts, NoAlerts) and isinstance(make_cost_updates(off, alerts), NoCostUpdates)
    assert isinstance(make_high_loss_log(off, None, 0, tmp_path), NoHighLossLog)  # type: ignore[arg-type]
    assert isinstance(make_fault_hook(off.faults), NoFaults)
    hook = make_fault_hook(load_config(None, ["--training.max_steps=5", "--faults.raise_at_step=3"]).faults)
    assert isinstance(hook, FaultHook)
    hook.after_step(2)
    with pytest.raises(RuntimeError, match="faults.raise_at_step at step 3"):
        hook.after_step(3)


def test_work_started_at_counts_the_pod_commands_preparation(monkeypatch):
    """The caps' clock starts when the pod command did (before data was fetched and prepared), when
    the launch exported that time; a value from another job (future, days old, garbage) is ignored."""
    import time

    from trainer.loop import entry
    from trainer.spec.config import JOB_STARTED_ENV

    proc = entry.process_started_at()
    assert proc is not None and proc <= time.time()
    monkeypatch.setenv(JOB_STARTED_ENV, str(int(proc) - 600))
    assert entry.work_started_at() == int(proc) - 600
    for bad in (str(time.time() + 3600), str(time.time() - 30 * 86400), "soon", ""):
        monkeypatch.setenv(JOB_STARTED_ENV, bad)
        assert abs(entry.work_started_at() - proc) < 0.5  # /proc's clock ticks, read again
