"""Own code over a real sshd (`--provider ssh`) and on a cloud emulator's pod (RunPod's API, a real sshd
as the pod): tail, fetch-best, a budget cap the pod-side watchdog enforces, and a failing setup that
leaves nothing billing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import emulator_for
from tests.e2e.owncode.helpers import fetch_best, finished_rows, launch_own, status_json, train_losses
from tests.support.cli import wait_for


@pytest.fixture(autouse=True)
def quick_guards(monkeypatch):
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.05")
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "15")


def ssh_args(sshd, client_key, tmp_path: Path, name: str) -> list[str]:
    return ["--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
            "--python", sys.executable, "--workdir", str(tmp_path / "pod" / name)]


@pytest.mark.parametrize("kind, want", [("nanochat", "step_10"), ("hf", "checkpoint-20")])
def test_ssh_formats_tail_and_fetch_best(capsys, tmp_path, sshd, client_key, kind, want):
    name = f"ssh-{kind}"
    code, out, err = launch_own(capsys, tmp_path, kind, name, *ssh_args(sshd, client_key, tmp_path, name))
    assert code == 0, err
    rows = finished_rows(capsys, name)
    losses = train_losses(rows)
    assert len(losses) >= 4 and [s for s, _ in losses] == sorted({s for s, _ in losses})
    assert status_json(capsys, name)["state"] == "finished"
    got = fetch_best(capsys, name, tmp_path / "fetched")
    assert got["checkpoint"] == want
    pod_ck = tmp_path / "pod" / name / "code" / "checkpoints"
    for rel in got["files"]:
        assert (Path(got["dest"]) / rel).read_bytes() == (pod_ck / rel).read_bytes()


def test_ssh_failing_setup(capsys, tmp_path, sshd, client_key):
    code, out, err = launch_own(capsys, tmp_path, "nanochat", "ssh-setup", *ssh_args(sshd, client_key, tmp_path,
                                "ssh-setup"), "--setup", "echo resolving; echo 'ERROR: no wheel' >&2; false")
    assert code != 0 and "setup failed (exit 1)" in err and "ERROR: no wheel" in err
    assert runs.load("ssh-setup").status == "failed"


def _pod_of(emu, name: str) -> str:
    return runs.load(name).instance_id


def test_cloud_budget_cap_stops_the_job_with_its_checkpoint(capsys, tmp_path, request):
    emu = emulator_for(request, "runpod")
    name = "cloud-cap"
    # $3600/h is a dollar a second, counted from the pod's creation. The watchdog watches from the set-up
    # on, so a cap passed during the launch stops the job the moment it starts: $45 leaves the job seconds
    # to train after even a slow launch on a loaded host (--force: the emulated balance is $25).
    code, out, err = launch_own(capsys, tmp_path, "graceful", name, "--provider", "runpod", "--profile", "rtx4090",
                                "--workdir", str(tmp_path / "pod" / name), "--python", sys.executable,
                                "--ready-timeout", "20", "--price", "3600", "--budget", "45", "--grace", "4",
                                "--force")
    assert code == 0, err
    pod_id = _pod_of(emu, name)
    ended = wait_for(lambda: emu.ledger.ended(pod_id), 90, "the watchdog to end the pod", interval=0.2)
    # stopped with the pod's own key (--on-end stop: GPU billing ends, the disk keeps the checkpoints)
    assert ended[0].event == "stopped" and ended[0].by == "pod-key"
    wd = tmp_path / "pod" / name
    rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(train_losses(rows)) >= 3
    finished = [r for r in rows if r.get("event") == "finished"]
    # stopped, not failed, and by what
    assert finished and finished[-1]["reason"].startswith("stopped by cap: budget $"), finished[-1]
    # the job's own SIGTERM handler wrote its checkpoint within the grace period
    assert list((wd / "code" / "checkpoints").glob("emergency_step_*.pt"))
    assert "limit reached" in (wd / "watchdog.log").read_text()  # the budget, as hours at the price


def test_cloud_failing_command_and_setup_leave_nothing_billing(capsys, tmp_path, request):
    emu = emulator_for(request, "runpod")
    common = ["--provider", "runpod", "--profile", "rtx4090", "--python", sys.executable, "--ready-timeout", "20"]
    code, out, err = launch_own(capsys, tmp_path, "nanochat", "cloud-setup", *common,
                                "--workdir", str(tmp_path / "pod" / "s"), "--setup", "echo 'disk full' >&2; exit 2")
    assert code != 0 and "setup failed (exit 2)" in err and "disk full" in err
    assert emu.ledger.alive() == set()  # the launch released the pod

    code, out, err = launch_own(capsys, tmp_path, "failing", "cloud-fail", *common,
                                "--workdir", str(tmp_path / "pod" / "f"))
    assert code == 0, err
    pod_id = _pod_of(emu, "cloud-fail")
    ended = wait_for(lambda: emu.ledger.ended(pod_id), 60, "the watchdog to end the pod of the failed job",
                     interval=0.2)
    assert ended[0].event == "stopped" and ended[0].by == "pod-key"
    rows = [json.loads(line) for line in (tmp_path / "pod" / "f" / "metrics.jsonl").read_text().splitlines()]
    finished = [r for r in rows if r.get("event") == "finished"][-1]
    assert finished["reason"].startswith("exit 1") and finished["state"] == "failed"
    assert any("CUDA out of memory (pretend)" in line for line in finished["log_tail"])


# Resumes from the newest step_N.pt in $GPUCLI_CHECKPOINTS, as a user's script that supports resuming does.
RESUMABLE = '''
import glob, os, time
ck = os.environ["GPUCLI_CHECKPOINTS"]
have = sorted(int(p.rsplit("_", 1)[1].split(".")[0]) for p in glob.glob(os.path.join(ck, "step_*.pt")))
start = have[-1] if have else 0
print(f"resuming from step {start}" if start else "starting from scratch", flush=True)
for step in range(start + 1, start + 400):
    print(f"iter {step}: loss {1 + 1 / step:.4f}, time 1.00ms, mfu -100.00%", flush=True)
    if step % 5 == 0:
        open(os.path.join(ck, f"step_{step}.pt"), "w").write(str(step))
    time.sleep(0.1)
'''


def test_cloud_mirror_and_resume_put_the_checkpoints_back_and_rerun_setup(capsys, tmp_path, request):
    from gpucli.run.files.harvest import mirror_root
    from tests.support.cli import cli

    emu = emulator_for(request, "runpod")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(RESUMABLE)
    wd = tmp_path / "pod" / "res"
    rc, out, err = cli(capsys, "launch", "--code", str(code), "--run", f"{sys.executable} train.py", "--name", "res",
                       "--setup", "echo setup-ran >> setup.log", "--provider", "runpod", "--profile", "rtx4090",
                       "--workdir", str(wd), "--python", sys.executable, "--ready-timeout", "20")
    assert rc == 0, err
    first_pod = runs.load("res").instance_id
    # a live run's checkpoints are mirrored once they are 10 s old
    mirrored = mirror_root("res") / "own-checkpoints"
    wait_for(lambda: cli(capsys, "mirror", "res")[0] == 0 and list(mirrored.glob("step_*.pt")), 120,
             "a mirrored checkpoint", interval=1)  # generous: a loaded machine slows every SSH round trip
    newest = max(int(p.stem.split("_")[1]) for p in mirrored.glob("step_*.pt"))
    # the pod is taken away with its disk: nothing of the run is left there
    rc, out, err = cli(capsys, "down", "res")
    assert rc == 0, err
    import shutil

    shutil.rmtree(wd)
    rc, out, err = cli(capsys, "resume", "res")
    assert rc == 0, err
    record = runs.load("res")
    assert record.instance_id != first_pod and first_pod in record.previous_instances
    line = f"resuming from step {newest}"
    wait_for(lambda: (wd / "train.log").exists() and line in (wd / "train.log").read_text(), 120,
             "the job to resume from the mirrored checkpoint")
    assert (wd / "code" / "setup.log").read_text() == "setup-ran\n"  # --setup ran again on the new pod
    rc, out, err = cli(capsys, "down", "res")
    assert rc == 0, err
    assert emu.ledger.alive() == set()
