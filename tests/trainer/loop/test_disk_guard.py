"""The trainer's disk guard in a real CPU run of the tiny preset on a small disk: the free space the
guard reads is that of a disk sized from the first checkpoint (its real files counted), so the third
checkpoint fits only once the first one's optimizer file is dropped, and the fourth not at all."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.trainer.conftest import REPO, read_rows, run_trainer, tiny_args, trainer_env
from trainer.loop import checkpoint as ckpt

# The trainer, in its own process, with trainer.loop.diskguard.disk_usage reading a small disk: until the
# first checkpoint exists the disk is large; then its size is 2 checkpoints - one optimizer file +
# room for the next (the guard's 5 % margin) + half of the weights and meta (a little slack, less than
# an optimizer file). The disk's used bytes are the checkpoint folder's real files.
SMALL_DISK = """
import sys
from pathlib import Path

from trainer.loop import diskguard
from trainer.train import main

root = Path(sys.argv[1])
cap = None


def small_disk(path):
    global cap
    first = root / "step_000010"
    if cap is None:
        if not (first / "meta.json").exists():
            return (10**13, 0, 10**13)
        c = sum(f.stat().st_size for f in first.iterdir())
        o = (first / "optim_rank0.pt").stat().st_size
        # + (c - o): the weights-only best checkpoint (checkpoints/best) beside the periodic ones
        cap = int(2 * c - o + (1 + diskguard.MARGIN) * c + (c - o) / 2) + (c - o)
    used = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    return (cap, used, max(0, cap - used))


diskguard.disk_usage = small_disk
sys.exit(main(sys.argv[2:]))
"""


def test_a_small_disk_drops_old_optimizer_files_then_refuses_and_alerts(data_dir, tmp_path, telegram_emulator):
    out = tmp_path / "run"
    root = out / "checkpoints"
    args = tiny_args(data_dir, out, **{"training.max_steps": 60, "training.keep_last": 5,
                                       "notifications.telegram.enabled": "true"})
    env = trainer_env(TELEGRAM_API_BASE=telegram_emulator.url, TELEGRAM_BOT_TOKEN=telegram_emulator.token,
                      TELEGRAM_CHAT_ID=telegram_emulator.chat_id)
    r = subprocess.run([sys.executable, "-c", SMALL_DISK, str(root), *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]

    # On disk: 10 and 20 kept their weights but lost their optimizer files (10 to make room for 30,
    # 20 while trying to make room for 40); 30, the newest, is whole; 40 and 50 were never written,
    # not even half: no temp folder is left to shadow step 30.
    assert sorted(p.name for p in root.iterdir()) == ["best", "step_000010", "step_000020", "step_000030"]
    for step in (10, 20):
        folder = root / ckpt.step_dir_name(step)
        assert sorted(p.name for p in folder.iterdir()) == ["data_meta.json", "meta.json", "model.pt",
                                                            "model.safetensors"]
        meta = ckpt.read_meta(folder)
        assert meta["optimizer_dropped"] == ["optim_rank0.pt"] and "optim_rank0.pt" not in meta["files"]
        assert ckpt.verify(folder) == (True, "ok")  # still a usable checkpoint: its listed files verify
    assert (root / "step_000030" / "optim_rank0.pt").exists() and ckpt.verify(root / "step_000030")[0]
    assert ckpt.find_resumable(root, log=lambda m: None) == root / "step_000030"

    rows = read_rows(out)
    dropped = [(e["step"], e["checkpoints"]) for e in rows if e.get("event") == "optimizer_dropped"]
    assert dropped == [(30, ["step_000010"]), (40, ["step_000020"])]
    refused = [e for e in rows if e.get("event") == "checkpoint_refused"]
    assert [e["step"] for e in refused] == [40, 50] and all(e["free_bytes"] < e["need_bytes"] for e in refused)
    assert [e["step"] for e in rows if e.get("event") == "checkpoint"] == [10, 20, 30]
    # A second refusal in a row ends the run cleanly: another interval of training could not be saved.
    (fin,) = [e for e in rows if e.get("event") == "finished"]
    assert fin["reason"] == "disk_full" and fin["step"] == 50
    assert "dropped the optimizer files of step_000010" in r.stderr
    assert "checkpoint step_000040 NOT written" in r.stderr and "step_000030 stays the newest" in r.stderr

    # The alert went out through the trainer's Telegram path, once per refused checkpoint.
    errors = [m.text for m in telegram_emulator.with_title("ERROR")]
    assert len(errors) == 2 and all("disk full" in t for t in errors)
    assert "step\\_000040" in errors[0] or "step_000040" in errors[0]
    saved = telegram_emulator.with_title("Checkpoint Saved")
    assert len(saved) == 3

    # A weights-only checkpoint still resumes (fresh optimizer moments, said so) and samples.
    again = tmp_path / "again"
    r = run_trainer([*tiny_args(data_dir, again, **{"training.max_steps": 12}),
                     f"--resume={root / 'step_000010'}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "has its weights only" in r.stderr and "resumed from step_000010 at step 10" in r.stderr
    assert (again / "checkpoints" / "step_000012" / "optim_rank0.pt").exists()
    s = subprocess.run([sys.executable, "-m", "trainer.sample", "--checkpoint", str(root / "step_000010"),
                        "--prompt", "import", "--max-new-tokens", "4", "--json", "--device", "cpu"], cwd=REPO,
                       env=trainer_env(), capture_output=True, text=True, timeout=60)
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["step"] == 10
