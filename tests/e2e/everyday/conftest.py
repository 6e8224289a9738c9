"""A run record pointing at the test sshd, as a launch over ``--provider ssh`` leaves it."""

from __future__ import annotations

import pytest

from gpucli.runs import records as runs
from gpucli.runs.records import RunRecord, now_iso
from gpucli.ssh import SshTarget


@pytest.fixture
def ssh_run(sshd, client_key, tmp_path):
    key_type, key_b64 = sshd.host_key_pub.split()[:2]
    wd = tmp_path / "pod" / "r1"
    wd.mkdir(parents=True)
    record = RunRecord(name="r1", provider="ssh", created_at=now_iso(), profile="cpu", phase="fast", model="tiny",
                       n_gpus=1, gpu=None, workdir=str(wd), status="running",
                       ssh=SshTarget(host="127.0.0.1", port=sshd.port, user=sshd.user,
                                     identity_file=str(client_key[0]), host_key=f"{key_type} {key_b64}"))
    runs.save(record)
    return record


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    """$HOME for ~/.ssh/config (OpenSSH itself reads the passwd home: tests pass -F)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


REPO = __import__("pathlib").Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """~300 kB of the Python standard library, byte-level tokens (as the trainer tests prepare it)."""
    from trainer.data.loader import prepare

    out = tmp_path_factory.mktemp("data")
    prepare([], out, "byte", val_split=0.1, max_bytes=300_000, log=lambda m: None)
    return out


def tiny_args(data_dir, out_dir, **over: object) -> list[str]:
    """A 0.1M-parameter model on the CPU, a step in tens of milliseconds."""
    base: dict[str, object] = {
        "model.preset": "tiny", "training.out_dir": str(out_dir), "training.batch_size": 4,
        "training.grad_accum_steps": 1, "training.seq_len": 64, "training.max_steps": 20,
        "training.warmup_steps": 4, "training.val_interval": 10, "training.val_batches": 2,
        "training.checkpoint_interval": 10, "training.log_interval": 1, "training.eval_max_new_tokens": 4,
        "training.eval_prompts": "[]", "training.tcf": "false", "hardware.device": "cpu", "data.dir": str(data_dir),
    }
    base.update(over)
    return [f"--{k}={v}" for k, v in base.items()]


def trainer_env(**extra: str) -> dict[str, str]:
    """The trainer's environment: one thread; the parent's PYTHONPATH after the repo (a tracker
    installed beside it is found by the trainer too)."""
    import os

    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)})
    env.update(extra)
    return env


def run_trainer(args: list[str], env: dict[str, str], timeout: float = 300):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "trainer.train", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def read_rows(out_dir) -> list[dict]:
    import json

    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
