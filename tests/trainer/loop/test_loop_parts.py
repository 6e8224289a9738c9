"""The training loop's parts in process: the LR schedule, checkpoints (hashes, keep-policy, pruning, truncation), limits."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch

from trainer.loop import checkpoint as ckpt
from trainer.loop.optim import lr_factor


def _fake_ckpt(root: Path, step: int, val: float | None) -> Path:
    return ckpt.save_checkpoint(root, step, rank=0, world=1, model_state={"w": torch.full((4,), float(step))},
                                optim_state={"o": torch.zeros(2)}, meta={"val_loss": val})



def test_lr_schedule_warmup_cosine():
    assert lr_factor(0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(100, 10, 100, 0.1) == pytest.approx(0.1)
    vals = [lr_factor(s, 10, 100, 0.1) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(vals, vals[1:], strict=False))



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
    # model.safetensors beside model.pt (the train extra installs safetensors), listed and hashed too.
    assert set(meta["files"]) == {"model.pt", "model.safetensors", "optim_rank0.pt"} and meta["step"] == 50
    assert not list(root.glob(".tmp_*")) and not list(root.glob(".del_*"))


def test_periodic_checkpoints_hold_safetensors_others_read_without_torch_load(tmp_path, monkeypatch):
    from safetensors import safe_open

    root = tmp_path / "checkpoints"
    state = {"w": torch.randn(3, 5), "b": torch.arange(4, dtype=torch.float32)}
    path = ckpt.save_checkpoint(root, 7, rank=0, world=1, model_state=state, optim_state={}, meta={})
    meta = ckpt.read_meta(path)
    assert meta is not None
    st = path / "model.safetensors"
    assert meta["files"]["model.safetensors"] == hashlib.sha256(st.read_bytes()).hexdigest()
    with safe_open(str(st), framework="numpy") as f:  # numpy: no torch, no pickle
        assert sorted(f.keys()) == ["b", "w"] and f.get_tensor("w").tolist() == state["w"].tolist()
    assert ckpt.verify(path) == (True, "ok")
    st.write_bytes(st.read_bytes()[:-8])  # a truncated copy is caught like a truncated model.pt
    assert ckpt.verify(path) == (False, "model.safetensors sha256 mismatch (truncated or corrupted)")

    # Without the package (a torch-only image): model.pt alone, as before; and a checkpoint of that
    # older kind (no safetensors listed) still verifies and loads.
    monkeypatch.setattr(ckpt, "writes_safetensors", lambda: False)
    old = ckpt.save_checkpoint(root, 8, rank=0, world=1, model_state=state, optim_state={}, meta={})
    assert not (old / "model.safetensors").exists() and set(ckpt.read_meta(old)["files"]) == {"model.pt", "optim_rank0.pt"}
    assert ckpt.verify(old) == (True, "ok") and ckpt.load_model_state(old)["w"].equal(state["w"])



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


def test_the_disk_guard_estimate_counts_the_safetensors_copy(tmp_path, monkeypatch):
    """Before the first checkpoint the disk guard's need is the state's bytes: the weights twice
    (model.pt and model.safetensors), so the first checkpoint is never larger than what was checked."""
    from trainer.loop.checkpointer import Checkpointer
    from trainer.loop.diskguard import folder_bytes
    from trainer.loop.dist import Dist

    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no moments: the weights are all there is
    c = Checkpointer(tmp_path, Dist(0, 0, 1, torch.device("cpu")), model, opt, False, lambda m: None,  # type: ignore[arg-type]
                     keep_last=1, metrics=None, alerts=None)  # type: ignore[arg-type]
    weights = (256 * 256 + 256) * 4
    assert c.state_bytes() == 2 * weights
    path = ckpt.save_checkpoint(tmp_path, 1, rank=0, world=1, model_state=model.state_dict(),
                                optim_state={}, meta={})
    written = (path / "model.pt").stat().st_size + (path / "model.safetensors").stat().st_size
    assert 2 * weights <= written <= folder_bytes(path) <= 2 * weights * 1.05
    monkeypatch.setattr(ckpt, "writes_safetensors", lambda: False)
    assert c.state_bytes() == weights
