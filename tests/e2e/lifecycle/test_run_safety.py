"""Nothing wrong in silence on the run side: names, records, pids and quoting that used to go wrong
without a word (issue 15)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from gpucli.runs.records import RunRecord
from gpucli.ssh import SshTarget
from tests.support.cli import cli


def record(name: str = "r1", **changes) -> RunRecord:
    base = RunRecord(name=name, provider="local", created_at="2026-01-02T03:04:05+00:00", profile="cpu",
                     phase="fast", model="tiny", n_gpus=1, gpu=None, workdir="gpucli-runs/" + name)
    return base.with_(**changes)


# --- the ssh command quotes the run folder ---------------------------------------------------------------
def test_ssh_shell_quotes_the_run_folder_for_the_remote_shell(tmp_path):
    from gpucli.providers.registry import get_target

    folder = tmp_path / "$(touch pwned)"
    folder.mkdir()
    rec = record("q", provider="ssh", workdir=str(folder), ssh=SshTarget(host="h", port=22, user="u"))
    argv, cwd = get_target("ssh").interactive_shell(rec)
    assert cwd is None
    # What the remote shell gets: run it in a shell here (with a $SHELL that only prints where it is).
    shell = tmp_path / "where"
    shell.write_text("#!/bin/sh\npwd\n")
    shell.chmod(0o755)
    res = subprocess.run(["sh", "-c", argv[-1]], cwd=tmp_path, env={**os.environ, "SHELL": str(shell)},
                         capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(folder)
    assert not (tmp_path / "pwned").exists()


# --- malformed records: skipped with a line naming the file; names outside the rule refused ---------------
BAD_RECORDS = {
    "list.json": b"[1, 2, 3]",
    "latin.json": "{\"name\": \"caf\u00e9\"}".encode("latin-1"),
    "strpid.json": None,  # a good record with a string pid, written below
    "half.json": b'{"name": "half", "provider": "loc',
}


def write_bad_records() -> None:
    d = runs.runs_dir()
    for fname, data in BAD_RECORDS.items():
        if data is None:
            good = json.loads((d / "good.json").read_text())
            data = json.dumps({**good, "name": "strpid", "pid": "123"}).encode()
        (d / fname).write_bytes(data)
    (d / "x.json").mkdir()


def test_malformed_records_are_skipped_by_ls_and_status_with_a_warning(capsys):
    runs.save(record("good", status="finished", step=40, loss=2.5))
    write_bad_records()
    code, out, err = cli(capsys, "ls")
    assert code == 0, err
    assert "good" in out and "Traceback" not in err and "internal error" not in err
    for fname in [*BAD_RECORDS, "x.json"]:
        assert fname in err, (fname, err)
    code, out, err = cli(capsys, "ls", "--json")
    assert code == 0 and [r["run"] for r in json.loads(out)] == ["good"]
    code, out, err = cli(capsys, "status")  # the newest readable run
    assert code == 0, err
    assert "run good" in out and "x.json" in err
    code, out, err = cli(capsys, "status", "strpid")
    assert code != 0 and "strpid.json" in err and "'pid' is not a positive whole number" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("args,needle", [
    (["status", "../../x"], "run name '../../x' is not valid"),
    (["down", ""], "run name '' is not valid"),
    (["tail", "a/b", "--no-follow"], "run name 'a/b' is not valid"),
])
def test_names_outside_the_rule_are_refused(capsys, tmp_path, args, needle):
    runs.save(record("only"))
    (runs.runs_dir().parent / "x.json").write_text(json.dumps({"name": "x"}))
    code, _, err = cli(capsys, *args)
    assert code != 0 and needle in err and "Traceback" not in err
    assert runs.load("only").status == "provisioning"  # `down ""` did not act on the newest run


# --- two launches at once never get the same name -------------------------------------------------------
@pytest.mark.parametrize("named", [False, True])
def test_concurrent_launches_never_share_a_name(named):
    from gpucli.errors import UsageError
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.inputs.launch import LaunchRequest
    from gpucli.run.life import lifecycle

    catalog = load_catalog()
    req = LaunchRequest(profile="cpu", name="race" if named else None)
    n = 6
    barrier = threading.Barrier(n)
    names: list[str] = []
    refused: list[str] = []

    def go() -> None:
        barrier.wait()
        try:
            names.append(lifecycle.prepare(catalog, req).resolved.name)
        except UsageError as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=go) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(names) == len(set(names)), names
    if named:
        assert names == ["race"] and len(refused) == n - 1 and "exists" in refused[0]
    else:
        assert len(names) == n and not refused


# --- fetch-best and the mirror tune the heap once before downloading -----------------------------------
def fake_checkpoint(workdir: Path, step: int = 10, val_loss: float = 2.0) -> None:
    import hashlib

    ck = workdir / "checkpoints" / f"step_{step:06d}"
    ck.mkdir(parents=True)
    weights = os.urandom(4096)
    (ck / "model.pt").write_bytes(weights)
    (ck / "meta.json").write_text(json.dumps({"step": step, "val_loss": val_loss, "kind": "regular",
                                              "files": {"model.pt": hashlib.sha256(weights).hexdigest()}}))


@pytest.mark.parametrize("what", ["fetch-best", "mirror"])
def test_downloads_tune_the_heap_first(tmp_path, monkeypatch, what):
    from gpucli.providers.registry import LocalHost
    from gpucli.run.starting.jobs import fetch_best, mirror_once
    from gpucli.ssh import heap

    monkeypatch.setattr(heap, "_tuned", False)
    fake_checkpoint(tmp_path / "run")
    rec = record("h", workdir=str(tmp_path / "run"))
    if what == "fetch-best":
        got = fetch_best(LocalHost(), rec, tmp_path / "dest")
        assert (got.dest / "model.pt").exists()
    else:
        assert mirror_once(LocalHost(), rec).checkpoint == "step_000010"
    assert heap._tuned


def test_down_without_a_pod_id_never_says_pod_none(capsys):
    from gpucli.cli import render_runs
    from gpucli.run.oversee.control import DownResult

    render_runs.downed(DownResult(record("np", provider="runpod", label="gpucli-np"), False, True))
    out = capsys.readouterr().out
    assert "None" not in out and "pods labelled gpucli-np terminated" in out


# --- the dry run gives the launch's verdict ------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["--provider", "runpod", "--profile", "cpu"], "profile cpu has no GPU; runpod pods need a GPU profile"),
    (["--profile", "cpu", "--set", "model.n_heads=3"], "not divisible by n_heads 3"),
    (["--profile", "cpu", "--set", "training.seq_len=99999"], "training.seq_len=99999 exceeds the model's max_seq_len"),
    (["--profile", "cpu", "--set", "model.max_seq_len=32", "--set", "training.seq_len=64"], "exceeds"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_dry_run_refuses_what_the_launch_refuses(capsys, runpod_emulator, args, needle, dry):
    code, out, err = cli(capsys, "launch", *args, *(["--dry-run"] if dry else []))
    assert code != 0 and needle in err and "internal error" not in err and "Traceback" not in err
    assert "started run" not in out
    assert not list(runs.runs_dir().glob("*.json")) and runpod_emulator.ledger.created() == []


@pytest.mark.parametrize("samples,accum,fits,want", [
    (14, 2, 8, (7, 4)),  # 8xA100 extreme: 14 x 2 = 28 per GPU, kept as 7 x 4 (not 8 x 4 = 32)
    (8, 1, 8, (8, 1)),
    (32, 1, 12, (8, 4)),
    (31, 1, 8, (8, 4)),  # prime: the largest micro-batch that fits, and a note
])
def test_the_profiles_global_batch_is_kept_or_the_change_said(samples, accum, fits, want):
    from gpucli.plan.runmodel import keep_global_batch

    micro, acc, note = keep_global_batch(samples, accum, fits)
    assert (micro, acc) == want and micro <= fits
    assert (note is None) == (micro * acc == samples * accum)
    if note:
        assert "31" in note and "32 per GPU" in note


# --- down and the watchdog never signal a pid that is someone else's now ---------------------------------
def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "120"], start_new_session=True)


def stale_record(name: str, provider: str, trainer: subprocess.Popen, watchdog: subprocess.Popen, **more) -> RunRecord:
    import sys

    from gpucli.pod.procid import identity

    real = identity(trainer.pid)
    # The same pid, a different start: what a record looks like after a reboot, or once its pid is reused.
    stale = real.rsplit(":", 1)[0] + ":1"
    return record(name, provider=provider, status="running", pid=trainer.pid, pid_ident=stale,
                  watchdog_pid=watchdog.pid, watchdog_ident=stale, python=sys.executable, **more)


@pytest.mark.parametrize("provider", ["local", "ssh"])
def test_down_never_signals_a_stale_pid(capsys, tmp_path, request, provider):
    more = {}
    if provider == "ssh":
        sshd, key = request.getfixturevalue("sshd"), request.getfixturevalue("client_key")
        more["ssh"] = SshTarget(host="127.0.0.1", port=sshd.port, user=sshd.user, identity_file=str(key[0]))
    procs = [sleeper(), sleeper()]
    try:
        runs.save(stale_record("stale", provider, *procs, workdir=str(tmp_path), **more))
        code, out, err = cli(capsys, "down", "stale")
        assert code == 0, err
        assert "trainer was not running" in out and "no longer the run's watchdog" in err
        assert [p.poll() for p in procs] == [None, None]  # both unrelated processes live on
        # The same record with the identities taken at start: now they are the run's, and down ends them.
        from gpucli.pod.procid import identity

        again = runs.load("stale").with_(status="running", pid_ident=identity(procs[0].pid),
                                         watchdog_ident=identity(procs[1].pid))
        (runs.runs_dir() / "stale.json").unlink()  # a new record: a stopped run never becomes running
        runs.save(again)
        code, out, err = cli(capsys, "down", "stale")
        assert code == 0 and "trainer stopped" in out, err
        assert procs[0].wait(10) == -15 and procs[1].wait(10) == -15
    finally:
        for p in procs:
            p.kill()


def test_watchdog_never_signals_a_stale_pid(tmp_path):
    import sys

    from gpucli.pod.procid import identity

    p = sleeper()
    try:
        stale = identity(p.pid).rsplit(":", 1)[0] + ":1"
        (tmp_path / "metrics.jsonl").write_text("{}\n")
        watchdog = Path(__file__).resolve().parents[3] / "gpucli" / "pod" / "watchdog.py"
        res = subprocess.run([sys.executable, str(watchdog), "--run-dir", str(tmp_path), "--pgid", str(p.pid),
                              "--provider", "local", "--poll-s", "0.1", "--stall-minutes", "0.001",
                              "--pgid-ident", stale], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert p.poll() is None  # not the trainer: left alone
        assert json.loads((tmp_path / "watchdog.json").read_text())["verdict"] == "crashed"
    finally:
        p.kill()


def test_ls_shows_step_and_loss_of_a_finished_run(capsys, tmp_path):
    from gpucli.run.oversee.control import live_status

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 7, "loss": 3.25}) + "\n"
        + json.dumps({"kind": "event", "event": "finished", "reason": "max_steps", "step": 7}) + "\n")
    runs.save(record("done", status="running", workdir=str(tmp_path)))
    assert live_status(runs.load("done")).state == "finished"
    rec = runs.load("done")
    assert (rec.status, rec.step, rec.loss) == ("finished", 7, 3.25)
    code, out, err = cli(capsys, "ls", "--json")
    assert code == 0 and (json.loads(out)[0]["step"], json.loads(out)[0]["loss"]) == (7, 3.25)
    code, out, err = cli(capsys, "ls")
    assert "3.250" in out, out


def test_reading_a_run_only_reads_and_reconcile_does_what_it_found_due(capsys, tmp_path):
    """observe() changes nothing (a run seen finished stays 'running' in its record, no file written);
    what it found due is done by reconcile.apply, the one step `status` and `ls` take after reading."""
    from gpucli.run.oversee import reconcile
    from gpucli.run.oversee.observe import observe
    from gpucli.settings import home

    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 4, "loss": 2.5}) + "\n"
        + json.dumps({"kind": "event", "event": "finished", "reason": "max_steps", "step": 4}) + "\n")
    runs.save(record("seen", status="running", workdir=str(tmp_path)))

    def snapshot() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(home().rglob("*")) if p.is_file()}

    before = snapshot()
    seen = observe(runs.load("seen"))
    assert seen.status.state == "finished" and seen.status.step == 4
    assert snapshot() == before, "a read wrote to GPUCLI_HOME"
    assert seen.due is not None and seen.due.save is not None and seen.due.save.status == "finished"
    assert runs.load("seen").status == "running"
    reconcile.apply(seen.due)
    assert (runs.load("seen").status, runs.load("seen").step) == ("finished", 4)
    # `status` is read + reconcile: the same answer, and doing it twice changes nothing more.
    code, out, err = cli(capsys, "status", "seen", "--json")
    assert code == 0 and json.loads(out)["state"] == "finished", err
    after = snapshot()
    code, out, err = cli(capsys, "status", "seen", "--json")
    assert code == 0 and snapshot() == after
