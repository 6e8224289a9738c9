"""End-to-end runs of ``trainer.train`` as a subprocess: DDP on gloo, exact resume after kill -9,
SIGTERM emergency checkpoint, truncated-checkpoint skip, limits, stages, provenance, CLI errors."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import torch

from tests.trainer.conftest import (
    REPO,
    finished,
    read_rows,
    run_trainer,
    tiny_args,
    train_losses,
    trainer_env,
)
from trainer.loop import checkpoint as ckpt


def test_ddp_two_ranks_on_gloo_loss_falls(data_dir, tmp_path):
    out = tmp_path / "run"
    r = run_trainer(tiny_args(data_dir, out, **{"training.max_steps": 30}), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    losses = train_losses(out)
    assert losses[30] < losses[1] - 1.0, losses
    assert any(r.get("event") == "started" and r["world_size"] == 2 for r in read_rows(out))
    last = out / "checkpoints" / "step_000030"
    assert {p.name for p in last.iterdir()} >= {"model.pt", "optim_rank0.pt", "optim_rank1.pt", "meta.json"}
    meta = json.loads((last / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["tokens_seen"] == 30 * 2 * 4 * 64 * 2
    assert finished(out)["reason"] == "max_steps"
    assert json.loads((out / "status.json").read_text())["reason"] == "max_steps"
    # DDP ranks hold identical Adam moments: only rank 0's file carries them, rank 1's only its RNG.
    rank0 = torch.load(last / "optim_rank0.pt", weights_only=True)
    rank1 = torch.load(last / "optim_rank1.pt", weights_only=True)
    assert rank0["optimizer"]["state"] and rank1["optimizer"] is None and "torch" in rank1["rng"]
    assert (last / "optim_rank1.pt").stat().st_size < (last / "optim_rank0.pt").stat().st_size / 10

    # Resuming both ranks from step 20 (rank 1 takes the moments from rank 0's file) repeats the
    # straight run's steps 21-30 exactly: same data, same dropout masks, same optimizer.
    again = tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step_000030")
    args = tiny_args(data_dir, again, **{"training.max_steps": 30})
    r = run_trainer([*args, "--resume=auto"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step_000020" in r.stderr
    resumed = train_losses(again)
    assert [resumed[s] for s in (21, 25, 30)] == [losses[s] for s in (21, 25, 30)]


def test_kill9_and_resume_gives_the_same_step20_loss(data_dir, straight_run, tmp_path):
    broken = tmp_path / "broken"
    args = tiny_args(data_dir, broken, **{"training.eval_prompts": "[def]"})
    r = run_trainer([*args, "--faults.kill_at_step=13"])
    assert r.returncode == -signal.SIGKILL
    assert max(train_losses(broken)) == 13 and not any(r.get("event") == "finished" for r in read_rows(broken))
    r = run_trainer([*args, "--resume", "auto"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step_000010" in r.stderr
    a, b = train_losses(straight_run), train_losses(broken)
    assert a[20] == b[20] and a[15] == b[15]  # same data order, same dropout masks, same optimizer
    assert (sorted(p.name for _, p in ckpt.list_checkpoints(straight_run / "checkpoints"))
            == sorted(p.name for _, p in ckpt.list_checkpoints(broken / "checkpoints")))


def test_sigterm_leaves_a_loadable_emergency_checkpoint(data_dir, tmp_path):
    out = tmp_path / "run"
    args = tiny_args(data_dir, out, **{"training.max_steps": 100000, "training.checkpoint_interval": 100000})
    p = subprocess.Popen([sys.executable, "-m", "trainer.train", *args], cwd=REPO, env=trainer_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").exists() and any(r.get("kind") == "train" and r["step"] >= 3
                                                    for r in read_rows(out)):
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
    fin = finished(out)
    assert fin["reason"] == "signal"
    path = ckpt.find_resumable(out / "checkpoints")
    assert path is not None and path.name == f"step_{fin['step']:06d}"
    meta = json.loads((path / "meta.json").read_text())
    assert meta["kind"] == "emergency" and meta["step"] == fin["step"] >= 3
    state = ckpt.load_model_state(path)
    assert "wte.weight" in state and torch.isfinite(state["wte.weight"]).all()


def test_truncated_newest_checkpoint_is_skipped_on_resume(data_dir, straight_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(straight_run, out)
    model = out / "checkpoints" / "step_000020" / "model.pt"
    model.write_bytes(model.read_bytes()[:1000])
    r = run_trainer([*tiny_args(data_dir, out, **{"training.max_steps": 22}), "--resume=auto"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipping step_000020: model.pt sha256 mismatch" in r.stderr
    resumed = [r for r in read_rows(out) if r.get("event") == "resumed"]
    assert resumed[-1]["step"] == 10
    assert finished(out)["step"] == 22


def test_stages_cost_limit_and_high_loss_provenance(data_dir, tmp_path):
    out = tmp_path / "run"
    args = tiny_args(data_dir, out, **{
        "training.max_steps": 100000, "training.stage1_steps": 4, "training.stage2_seq_len": 32,
        "training.high_loss_threshold": 0.0, "limits.price_per_hour_usd": 300.0, "limits.budget_usd": 4.0,
        "training.checkpoint_interval": 100000})
    r = run_trainer(args)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_rows(out)
    fin = finished(out)
    train = [r for r in rows if r.get("kind") == "train"]
    # $1/12 a second, a $4 cap (48 s, counted from the process's start: its startup bills too). Before each
    # step the trainer asks whether what it has spent plus a reserve (a step, a validation, the final
    # checkpoint twice, 5 s) reaches the cap, so every step but the last began, and ended, under it; the
    # last one's cost depends on how busy the machine is (a machine at load 40 once took 30 s for it),
    # so it is not pinned. It did run for a while first.
    assert fin["reason"] == "max_cost" and fin["cost_usd"] >= 0.5
    assert len(train) > 5 and all(r["cost_usd"] < 4.0 for r in train[:-1])
    trans = [r for r in rows if r.get("event") == "stage_transition"]
    assert trans and trans[0]["step"] == 4 and trans[0]["seq_len"] == 32
    assert {r["seq_len"] for r in train if r["step"] <= 4} == {64}
    assert {r["seq_len"] for r in train if r["step"] > 4} == {32}
    assert all(r["cost_usd"] is not None and r["mfu"] is None for r in train)  # CPU: no MFU guess
    final = ckpt.find_resumable(out / "checkpoints")
    assert final is not None and json.loads((final / "meta.json").read_text())["kind"] == "final"
    hl = [json.loads(x) for x in (out / "high_loss.jsonl").read_text().splitlines()]
    assert hl and len(hl[0]["sources"]) == 4
    from trainer.data.loader import stdlib_sources

    root, _ = stdlib_sources()
    f, line = hl[0]["sources"][0].rsplit(":", 1)
    assert len((root / f).read_text().splitlines()) >= int(line)


def test_sample_and_snapshot_on_a_checkpoint(straight_run, tmp_path):
    out = straight_run
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [10, 20] and samples[0]["prompt"] == "def"
    env = trainer_env()
    s = subprocess.run([sys.executable, "-m", "trainer.sample", "--checkpoint", str(out), "--prompt", "import",
                        "--max-new-tokens", "8", "--json", "--device", "cpu"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["step"] == 20  # the best by val loss
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# the evaluation set\nimport\n\n" + json.dumps({"prompt": "def f(x):\n"}) + "\n")
    s = subprocess.run([sys.executable, "-m", "trainer.sample", "--checkpoint", str(out), "--prompts-file",
                        str(prompts), "--max-new-tokens", "4", "--json", "--device", "cpu"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    assert [json.loads(x)["prompt"] for x in s.stdout.splitlines()] == ["import", "def f(x):\n"]
    prompts.write_text("{not json\n")
    s = subprocess.run([sys.executable, "-m", "trainer.sample", "--checkpoint", str(out), "--prompts-file",
                        str(prompts)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert s.returncode == 2 and "line 1: not valid JSON" in s.stderr and "Traceback" not in s.stderr
    snap = tmp_path / "snap"
    s = subprocess.run([sys.executable, "-m", "trainer.snapshot", "--checkpoint", str(out / "checkpoints" /
                        "step_000010"), "--out", str(snap)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    m = json.loads((snap / "metrics.json").read_text())
    assert m["step"] == 10 and len(m["layers"]) == 3 and m["layers"]["layer_02"]["attn.qkv.weight/D_eff"] > 1
    assert torch.load(snap / "layer_01" / "hidden.pt").shape[-1] == 64


def test_config_errors_exit_2_with_one_line(tmp_path, data_dir, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  preset: tiny\ntraining:\n  max_steps: 5\n  warmup_stepz: 3\n")
    r = subprocess.run([sys.executable, "-m", "trainer.train", "--config", str(bad)], cwd=REPO,
                       env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == (
        "error: unknown config key 'training.warmup_stepz' (valid here: " + r.stderr.split("(valid here: ")[1])
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    from trainer.train import main

    for args in (["--training.max_steps=abc"], ["--config", str(tmp_path / "nope.yaml")], ["stray"],
                 ["--model.preset=tiny", "--training.max_steps=2", "--training.seq_len=100000",
                  f"--training.out_dir={tmp_path / 'o'}", "--hardware.device=cpu", f"--data.dir={data_dir}"]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err


def test_fsdp2_on_gloo_survives_kill9_and_writes_plain_weights(data_dir, tmp_path):
    out = tmp_path / "run"
    args = [*tiny_args(data_dir, out, **{"training.max_steps": 14}), "--hardware.fsdp=on"]
    r = run_trainer([*args, "--faults.kill_at_step=11"], nproc=2)
    assert r.returncode != 0 and max(train_losses(out)) == 11
    r = run_trainer([*args, "--resume=auto"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FSDP x2" in r.stderr and "resumed from step_000010" in r.stderr
    losses = train_losses(out)
    assert losses[14] < losses[1] - 1.0
    last = out / "checkpoints" / "step_000014"
    assert (last / "optim_rank1.pt").exists()
    from trainer.sample import load_for_inference

    model, _, meta = load_for_inference(last)  # full, unsharded state dict with plain keys
    assert meta["step"] == 14 and model.shape.n_layers == 2


def test_early_stop_after_val_patience(data_dir, tmp_path):
    out = tmp_path / "run"
    # An absurd LR makes validation loss jump around: two validations without a new best stop the run.
    r = run_trainer(tiny_args(data_dir, out, **{
        "training.max_steps": 200, "training.val_interval": 2, "training.val_patience": 2,
        "training.learning_rate": 2.0, "training.min_lr": 1.0, "training.warmup_steps": 0,
        "training.checkpoint_interval": 1000}))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_rows(out)
    vals = [r["val_loss"] for r in rows if r.get("kind") == "val"]
    fin = finished(out)
    assert fin["reason"] == "early_stop" and fin["step"] < 200
    assert min(vals[-2:]) >= min(vals[:-2])  # the last two did not improve on the best before them
    assert len(vals) == fin["step"] // 2  # one validation per interval, none repeated at the end
    assert any(r.get("event") == "early_stop" for r in rows)
    final = ckpt.find_resumable(out / "checkpoints")
    assert final is not None and final.name == f"step_{fin['step']:06d}"


def test_raise_at_step_takes_the_error_path(data_dir, tmp_path):
    out = tmp_path / "run"
    r = run_trainer([*tiny_args(data_dir, out), "--faults.raise_at_step=3"])
    assert r.returncode == 1 and "fault injected by faults.raise_at_step at step 3" in r.stderr
    rows = read_rows(out)
    assert [x["step"] for x in rows if x.get("event") == "error"] == [3]
    assert not any(x.get("event") == "finished" for x in rows)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed" and status["step"] == 3 and status["error"] == "RuntimeError"


def test_nanochat_architecture_with_muon_on_two_ranks_resumes_exactly(data_dir, tmp_path):
    """RoPE, RMSNorm, QK-norm, relu², GQA, untied soft-capped head, Muon split across two gloo ranks:
    the loss falls, rank 0's checkpoint holds the Muon momenta, and a resume repeats the steps exactly."""
    out = tmp_path / "run"
    over = {"training.max_steps": 16, "training.checkpoint_interval": 8, "training.val_interval": 8,
            "training.optimizer": "muon", "training.matrix_lr": 0.02, "training.embedding_lr": 0.1,
            "model.norm": "rmsnorm", "model.pos_embedding": "rope", "model.qk_norm": "true", "model.mlp": "relu2",
            "model.n_kv_heads": 1, "model.tie_embeddings": "false", "model.logit_softcap": 15.0}
    r = run_trainer(tiny_args(data_dir, out, **over), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "muon, DDP x2" in r.stderr
    losses = train_losses(out)
    assert losses[16] < losses[1] - 0.5, losses
    meta = json.loads((out / "checkpoints" / "step_000016" / "meta.json").read_text())
    assert meta["model_shape"]["pos_embedding"] == "rope" and meta["model_shape"]["n_kv_heads"] == 1
    state = torch.load(out / "checkpoints" / "step_000016" / "optim_rank0.pt", weights_only=True)["optimizer"]
    assert state["kinds"] == ["muon", "adamw"] and len(state["states"][0]["state"]) == 2 * 4
    again = tmp_path / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step_000016")
    r = run_trainer([*tiny_args(data_dir, again, **over), "--resume=auto"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from step_000008" in r.stderr
    resumed = train_losses(again)
    assert [resumed[s] for s in (9, 12, 16)] == [losses[s] for s in (9, 12, 16)]
