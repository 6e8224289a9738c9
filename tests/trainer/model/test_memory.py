"""The Atlas memory block: the chunked computation against a token-by-token reference, gradients,
the parameter count the planner prices, the watch and its alerts, and a trainer run with memory
(stages as chunk sizes, metrics per validation, a forced gate collapse reaching Telegram, exact
resume of the carried memory states after kill -9 on two gloo ranks)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.support.telegram import telegram_emulator  # noqa: F401 - a fixture
from tests.trainer.conftest import read_rows, run_trainer, tiny_args, train_losses, trainer_env
from trainer.model.gpt import GPT
from trainer.model.memory import (
    AtlasMemory,
    MemoryState,
    MemoryWatch,
    Projected,
    memory_chunked,
    memory_reference,
)
from trainer.spec.presets import MODELS


def _projected(b: int = 2, t: int = 13, d: int = 16, dk: int = 8, dv: int = 12, window: int = 3) -> Projected:
    torch.manual_seed(0)
    mem = AtlasMemory(d, dk, dv, 2, window).double()
    with torch.no_grad():
        mem.gates.weight.normal_(std=0.5)  # gates that differ per token
        mem.omega.normal_()
    p = mem.project(torch.randn(b, t, d))
    return Projected(**{f.name: getattr(p, f.name).detach().double() for f in dataclasses.fields(Projected)})


@pytest.mark.parametrize("chunk", [1, 3, 4, 13, 32])
@pytest.mark.parametrize("max_norm", [None, 0.3])
def test_chunked_memory_equals_the_token_by_token_reference(chunk, max_norm):
    p = _projected()
    start = MemoryState(torch.randn(2, 12, 8, dtype=torch.float64) * 0.1, torch.randn(2, 12, 8, dtype=torch.float64) * 0.01)
    for state in (None, start):
        y, s = memory_chunked(p, state, chunk, max_norm)
        y_ref, s_ref = memory_reference(p, state, chunk, max_norm)
        assert y.shape == (2, 13, 12) and y.abs().max() > 0.01
        torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(s.M, s_ref.M, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(s.S, s_ref.S, rtol=1e-10, atol=1e-12)
    if max_norm is not None:
        assert float(s.M.flatten(1).norm(dim=1).max()) <= max_norm + 1e-9


def test_the_chunk_size_changes_the_updates_not_just_the_speed():
    p = _projected()
    y4, _ = memory_chunked(p, None, 4)
    y1, _ = memory_chunked(p, None, 1)
    assert (y4 - y1).abs().max() > 1e-3  # chunk = update granularity (TNT's two stages differ)


def test_carried_memory_stays_bounded_over_many_sequences():
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(MODELS["tiny"], memory=True, d_key=32))
    model.set_memory_options(chunk_size=64)
    x = torch.randint(0, 256, (4, 64))
    states = None
    norms = []
    with torch.no_grad():
        for _ in range(30):
            model(x, x, memory_states=states)
            states = model.memory_out
            norms.append(max(float(s.M.norm()) for s in states))
    assert all(torch.isfinite(torch.tensor(norms))) and norms[-1] < 100, norms
    assert abs(norms[-1] - norms[-2]) < 0.05 * norms[-1]  # settles, does not grow without bound
    # A carried state changes what the next sequence sees (so restoring it on resume matters).
    with torch.no_grad():
        assert float(model(x, x, memory_states=states)) != float(model(x, x))


def test_gradients_reach_every_memory_parameter_and_the_count_is_exact():
    torch.manual_seed(0)
    spec = dataclasses.replace(MODELS["tiny"], memory=True, d_key=32, d_value=48, poly_degree=3, context_window=4)
    model = GPT(spec)
    model.set_memory_options(chunk_size=8)
    x = torch.randint(0, 256, (2, 40))
    model(x, torch.roll(x, -1, 1)).backward()
    mem = {n: p for n, p in model.named_parameters() if ".memory." in n}
    assert len(mem) == 2 * 10  # q k v out gates(w, b) poly omega gate(w, b) per layer
    for name, p in mem.items():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert model.num_params(exclude_position=False) == spec.num_params()
    assert spec.param_count().memory == sum(p.numel() for p in mem.values())
    assert [round(float(g), 6) for g in model.gate_shares] == [0.5, 0.5]  # gate_init


def test_the_1b_atlas_preset_is_the_seeds_size_and_the_planner_counts_its_memory():
    from gpucli.plan.estimate import count_params

    spec = MODELS["1b-atlas"]
    count = count_params(spec)
    assert 0.93e9 <= count.total <= 1.1e9, count.total
    assert count.memory > 0.2e9 and count.total == MODELS["1b"].num_params() + count.memory
    assert spec.train_flops_per_token(4096) > MODELS["1b"].train_flops_per_token(4096) + 6 * count.memory
    with torch.device("meta"):
        assert GPT(spec).num_params(exclude_position=False) == count.total


def test_memory_watch_raises_collapse_and_static_alerts_once():
    w = MemoryWatch(share_floor=0.05, fall_n=3, fall_drop=0.5, static_n=2, static_tol=1e-3, max_norm=50.0)
    shares = [0.5, 0.26, 0.12, 0.04, 0.007]  # the Atlas 1B build plan Appendix A, layer 1 only
    fired = []
    for i, s in enumerate(shares):
        fired.append(w.update([0.5, s], [0.1 + i, 0.0282], [10.0, 50.0]))
    kinds = [[(a.kind, a.layer) for a in f] for f in fired]
    # layer 1: M_norm pinned at the ceiling from the 3rd validation; the share fell 3 times by > half.
    assert kinds[2] == [("static_memory", 1)]
    assert kinds[3] == [("gate_collapse", 1)] and "0.5" not in fired[3][0].detail
    assert kinds[4] == []  # still collapsed: not repeated
    assert all(a.layer == 1 for f in fired for a in f)  # layer 0 moves and holds its share
    again = MemoryWatch()
    again.load_state_dict(json.loads(json.dumps(w.state_dict())))
    assert again.active == w.active and again.shares == w.shares


def test_chunk_sizes_without_memory_are_refused(data_dir, tmp_path):
    r = run_trainer(tiny_args(data_dir, tmp_path / "r", **{"training.stage1_chunk_size": 32}))
    assert r.returncode == 2 and "need a model with memory" in r.stderr and "Traceback" not in r.stderr
    r = run_trainer(tiny_args(data_dir, tmp_path / "r", **{"model.memory": "false", "model.d_key": 32}))
    assert r.returncode == 2 and "model.d_key is a memory setting" in r.stderr


MEMORY = {"model.d_key": 32, "training.stage1_steps": 10, "training.stage2_steps": 10,
          "training.stage1_chunk_size": 32, "training.stage2_chunk_size": 8}


def test_forced_gate_collapse_reaches_telegram_and_the_metrics(data_dir, tmp_path, telegram_emulator):  # noqa: F811
    """The gate bias driven down (a memory share of 0.1 % from the start) is a collapse at the first
    validation: one alert per layer, once, as a Telegram message and a metrics event."""
    out = tmp_path / "run"
    over = {**MEMORY, "model.gate_init": 0.001, "notifications.telegram.enabled": "true"}
    env = trainer_env(TELEGRAM_API_BASE=telegram_emulator.url, TELEGRAM_BOT_TOKEN=telegram_emulator.token,
                      TELEGRAM_CHAT_ID=telegram_emulator.chat_id)
    r = run_trainer(tiny_args(data_dir, out, **over), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_rows(out)
    events = [x for x in rows if x.get("event") == "gate_collapse"]
    assert sorted(e["layer"] for e in events) == [0, 1] and all(e["step"] == 10 for e in events)
    assert all(e["memory_share"] < 0.05 for e in events)
    msgs = telegram_emulator.with_title("Gate Collapse")
    assert len(msgs) == 2 and "Layer: `0`" in msgs[0].text and "below 5.00 %" in msgs[0].text
    # The validation rows carry what tail shows, per layer.
    val = [x for x in rows if x.get("kind") == "val"]
    assert len(val) == 2 and set(val[-1]["memory"]) == {"layer_00", "layer_01"}
    layer = val[-1]["memory"]["layer_01"]
    assert set(layer) >= {"gate", "M_norm", "M_std", "S_norm", "M_D_eff", "M_beta", "S_D_eff", "S_beta",
                          "M_curvature"} and layer["gate"] < 0.05 and layer["M_norm"] > 0
    assert val[-1]["memory_gate_mean"] < 0.05
    # TNT's stage 2 is a smaller chunk at the same sequence length.
    stage = [x for x in rows if x.get("event") == "stage_transition"]
    assert [(s["step"], s["seq_len"], s["chunk_size"]) for s in stage] == [(10, 64, 8)]
    assert {x["chunk_size"] for x in rows if x.get("kind") == "train" and x["step"] <= 10} == {32}
    assert telegram_emulator.with_title("Stage Transition")[0].text.endswith("Memory Chunk: `8`")


def test_kill9_and_resume_with_carried_memory_on_two_ranks_gives_the_same_loss(data_dir, tmp_path):
    over = {**MEMORY, "training.memory.carry": "true"}
    straight = tmp_path / "straight"
    r = run_trainer(tiny_args(data_dir, straight, **over), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt10 = straight / "checkpoints" / "step_000010"
    r0 = torch.load(ckpt10 / "optim_rank0.pt", weights_only=True)["memory"]
    r1 = torch.load(ckpt10 / "optim_rank1.pt", weights_only=True)["memory"]
    assert len(r0) == 2 and r0[0]["M"].shape == (4, 64, 32) and r0[0]["M"].dtype == torch.float32
    assert not torch.equal(r0[0]["M"], r1[0]["M"])  # each rank carries its own sequences' memory

    broken = tmp_path / "broken"
    args = tiny_args(data_dir, broken, **over)
    r = run_trainer([*args, "--faults.kill_at_step=13"], nproc=2)
    assert r.returncode != 0 and max(train_losses(broken)) == 13
    r = run_trainer([*args, "--resume=auto"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step_000010" in r.stderr
    a, b = train_losses(straight), train_losses(broken)
    assert [a[s] for s in (11, 15, 20)] == [b[s] for s in (11, 15, 20)]


def test_bench_times_memory_and_refinement_against_the_plain_model(tmp_path):
    """The GPU timing mode of scripts/bench_trainer.py, smoke-tested on CPU (no figures asserted)."""
    import subprocess
    import sys

    from tests.trainer.conftest import REPO

    cmd = [sys.executable, str(REPO / "scripts" / "bench_trainer.py"), "--shape", "tiny", "--device", "cpu",
           "--no-compile", "--memory", "--refine", "--memory-chunk", "64", "--memory-chunk", "16", "--warmup", "1",
           "--steps", "2", "--json", "--write-calibration", str(tmp_path / "cal.yaml")]
    r = subprocess.run(cmd, cwd=tmp_path, env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["arch"], x["memory_chunk"], x["refine_steps"]) for x in rows] == [
        ("plain", None, None), ("memory", 64, None), ("memory", 16, None), ("refine", None, 3)]
    assert rows[1]["params"] == MODELS["tiny"].num_params() + dataclasses.replace(
        MODELS["tiny"], memory=True).param_count().memory
    assert all(x["ms_per_step"] > 0 for x in rows)
    assert "memory" not in (tmp_path / "cal.yaml").read_text()  # only the plain row is a calibration entry
