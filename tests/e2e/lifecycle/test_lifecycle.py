"""The run lifecycle end to end: launch, tail, fetch-best, down, on this machine and over a real sshd.

The trainer is the real one (torch on CPU), started detached exactly as on a pod; only its size and
step counts are small so a run shows validation rows and checkpoints within seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.support.cli import FAST_TRAINER, cli, fetched_whole, rows_of, wait_for

FAST = ["--set", "data.max_bytes=400000", *FAST_TRAINER]


def run_lifecycle(capsys, tmp_path: Path, name: str, launch_args: list[str]) -> None:
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--name", name, *launch_args,
                         *FAST)
    assert code == 0, err
    assert f"started run {name}" in out
    record = runs.load(name)
    assert record.status == "running" and record.pid

    # tail --json sees training steps and then a validation row.
    def has_val():
        rows = rows_of(capsys, name)
        return rows if any(r.get("kind") == "val" for r in rows) and sum(r.get("kind") == "train" for r in rows) >= 3 else None

    rows = wait_for(has_val, 150, "a validation row")
    assert rows[0]["kind"] == "event" and rows[0]["event"] == "started"

    # Two checkpoints with validation losses, then fetch-best takes the lower one.
    workdir = Path(os.path.expanduser(record.workdir)) if record.provider == "local" else None

    def two_checkpoints():
        code, out, _ = cli(capsys, "status", name, "--json")
        return code == 0 and (json.loads(out).get("step") or 0) >= 12

    wait_for(two_checkpoints, 150, "step 12")
    from gpucli.providers.registry import open_host
    from gpucli.run.files.checkpoints import list_checkpoints

    with open_host(runs.load(name)) as host:
        before = list_checkpoints(host, record.workdir)
    assert len(before) >= 2
    dest = tmp_path / "fetched"
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(dest), "--json")
    assert code == 0, err
    got = json.loads(out)
    folder = Path(got["dest"])
    meta = fetched_whole(folder)
    assert meta["val_loss"] == got["val_loss"]
    # It is at least as good as every checkpoint that existed when it was asked for (training goes on).
    assert got["val_loss"] <= min(c.val_loss for c in before if c.val_loss is not None)
    # The --dest folder is what the sampler takes as it is (it holds the one checkpoint fetched).
    from trainer.sample import resolve_checkpoint

    assert resolve_checkpoint(dest) == folder

    # down: SIGTERM, the trainer writes its emergency checkpoint, the process group is gone.
    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    assert "trainer stopped" in out
    with open_host(runs.load(name)) as host:
        cks = list_checkpoints(host, record.workdir)
        assert not host.is_running(record.pid)
        final_rows = [r for r in rows_of(capsys, name) if r.get("event") == "finished"]
    assert final_rows and final_rows[-1]["reason"] == "signal"
    # The state at the signal is on disk: an emergency checkpoint, or a regular one of that very step.
    stop_step = final_rows[-1]["step"]
    assert any(c.step == stop_step and c.kind in ("emergency", "regular") for c in cks), [(c.step, c.kind) for c in cks]
    assert runs.load(name).status == "stopped"
    # Doing it twice works (issue 41 point 11): fetch-best over the first copy brings the best again,
    # replacing the old copy only once the new one is complete (nothing half-made is left beside it).
    # The run is over now (its last checkpoint may have become the best): the same best twice in a row.
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(dest), "--json")
    assert code == 0, err
    ended = json.loads(out)
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(dest), "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["dest"] == ended["dest"]
    meta = json.loads((Path(again["dest"]) / "meta.json").read_text())
    assert meta.get("val_loss") == again["val_loss"]  # whole: the fetch verified every file it brought
    assert sorted(p.name for p in dest.iterdir()) == sorted({folder.name, Path(again["dest"]).name})
    for _ in range(2):  # the mirror too
        code, out, err = cli(capsys, "mirror", name)
        assert code == 0, err
    # Following a run that is over ends at once, with how it ended.
    code, out, _ = cli(capsys, "tail", name)
    assert code == 0 and f"run {name} finished at step {stop_step} (signal)" in out
    if workdir is not None:
        assert (workdir / "env").stat().st_mode & 0o777 == 0o600


def test_local_provider_lifecycle(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:SECRET-token-never-shown")
    monkeypatch.setenv("TELEGRAM_CHAT_ID", "42")
    monkeypatch.setenv("TELEGRAM_API_BASE", "http://127.0.0.1:9")  # nothing listens: sending fails quietly
    run_lifecycle(capsys, tmp_path, "local-e2e", ["--provider", "local"])
    record_text = (runs.runs_dir() / "local-e2e.json").read_text()
    assert "SECRET" not in record_text
    env_file = Path(runs.load("local-e2e").workdir) / "env"
    assert "SECRET-token" in env_file.read_text()  # the pod gets it, through the 0600 file only
    assert env_file.stat().st_mode & 0o777 == 0o600


def test_ssh_provider_lifecycle(capsys, tmp_path, sshd, client_key):
    workdir = str(tmp_path / "pod" / "run")
    run_lifecycle(capsys, tmp_path, "ssh-e2e", [
        "--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
        "--python", sys.executable, "--workdir", workdir])
    record = runs.load("ssh-e2e")
    assert record.ssh is not None and record.ssh.host_key and record.ssh.host_key.startswith("ssh-ed25519")
    assert (Path(workdir) / "env").stat().st_mode & 0o777 == 0o600


def test_dry_run_touches_nothing(capsys):
    code, out, _ = cli(capsys, "launch", "--profile", "8xH100", "--phase", "extreme", "--model", "1b",
                       "--provider", "runpod", "--dry-run", "--budget", "500",
                       "--disk", "60")  # 5 checkpoints of 9.3 GB do not fit the default 50 GB
    assert code == 0
    assert "-m torch.distributed.run --standalone --nproc_per_node=8 -m trainer.train" in out
    assert "budget_usd: 500" in out and "learning_rate: 0.0005" in out
    assert not list(runs.runs_dir().glob("*.json"))


def test_overrides_are_written_into_run_yaml_and_the_plan_follows_them(capsys):
    """--set goes into run.yaml (a restart on the pod from run.yaml alone runs the same thing), the
    torchrun line carries none, and the plan, limits and step count are the overridden ones."""
    code, out, _ = cli(capsys, "launch", "--profile", "h100", "--phase", "fast", "--steps", "300", "--dry-run",
                       "--set", "training.grad_accum_steps=1", "--set", "training.max_steps=200")
    assert code == 0
    assert "grad_accum_steps: 1\n" in out and "max_steps: 200\n" in out
    assert "-m trainer.train --config ../run.yaml --resume auto\n" in out
    assert "200 steps of 1 x 64 x 1 sequences" in out and "limits: steps 200" in out


@pytest.mark.parametrize("args,needle", [
    (["launch", "--profile", "cpu", "--set", "training.nope=1", "--dry-run"], "unknown config key 'training.nope'"),
    (["launch", "--profile", "cpu", "--set", "training.batch_size=abc", "--dry-run"],
     "training.batch_size: expected an integer"),
    (["launch", "--profile", "cpu", "--set", "model.dropout=1.5", "--dry-run"], "model.dropout must be in [0, 1)"),
    (["launch", "--profile", "cpu9"], "unknown profile 'cpu9'"),
    (["launch", "--profile", "cpu", "--phase", "fastest"], "unknown phase 'fastest'"),
    (["launch", "--profile", "cpu", "--provider", "aws"], "unknown provider 'aws'"),
    (["launch", "--profile", "cpu", "--provider", "ssh"], "needs --host"),
    (["launch", "--profile", "cpu", "--data", "{missing}"], "not a folder"),
    (["launch", "--profile", "cpu", "--hours", "nan", "--dry-run"], "--hours': 'nan' is not a finite number"),
    (["launch", "--profile", "cpu", "--budget", "-1", "--price", "2", "--dry-run"], "--budget must be a positive"),
    (["launch", "--profile", "cpu", "--stall-minutes", "inf", "--dry-run"], "--stall-minutes': 'inf' is not a finite number"),
    (["launch", "--profile", "cpu", "--on-end", "explode", "--dry-run"], "--on-end must be stop or terminate"),
    (["launch", "--provider", "local", "--profile", "h100", "--model", "d64"], "does not fit"),
    (["status", "nope"], "no run named 'nope'"),
    (["tail"], "no runs yet"),
])
def test_lifecycle_bad_input(capsys, tmp_path, args, needle):
    # "a folder that does not exist" is one inside this test's own tmp folder, never a fixed path
    args = [a.replace("{missing}", str(tmp_path / "missing" / "dir")) for a in args]
    code, _, err = cli(capsys, *args)
    assert code != 0
    assert needle in err and "Traceback" not in err


def test_launch_on_unreachable_ssh_host_fails_cleanly(capsys, client_key):
    from tests.support.sshd import free_port

    code, _, err = cli(capsys, "launch", "--profile", "cpu", "--name", "nohost", "--provider", "ssh", "--host",
                       f"root@127.0.0.1:{free_port()}", "--identity", str(client_key[0]))
    assert code != 0 and "Traceback" not in err
    assert runs.load("nohost").status == "failed"


def test_real_process_launch_help():
    out = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "launch", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "--dry-run" in out.stdout
