"""A run with a checkpoint store, end to end: the real trainer (torch on CPU) on this machine uploads
its checkpoints to a real S3 server on loopback (moto) as it trains; ``down`` sends the last one before
the run ends; with the run folder gone (the pod lost), ``fetch-best`` reads the store, and ``resume
--provider runpod`` continues the same run on the RunPod emulator's pod from the store's newest whole
checkpoint: this machine mirrored nothing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from gpucli.run.files.harvest import mirror_root
from gpucli.runs import records as runs
from gpucli.store import objstore
from tests.support.cli import FAST_TRAINER, cli, fetched_whole, rows_of, wait_for
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, s3_server  # noqa: F401

TINY = [a for a in FAST_TRAINER if a not in ("--steps", "400")] + ["--set", "data.max_bytes=400000"]


def stored(run: str, url: str = "s3://runs/e2e") -> dict[str, objstore.StoredCheckpoint]:
    u = objstore.parse_url(url)
    return {c.name: c for c in objstore.whole_checkpoints(objstore.open_store(u), u, run)}


def cmdlines() -> str:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(out)


def test_a_store_outlives_the_pod_and_the_run_continues_on_another_provider(capsys, tmp_path, monkeypatch,
                                                                            s3_server, runpod_emulator):  # noqa: F811
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_STORE_POLL_S", "1")
    name = "stored"
    code, out, err = cli(capsys, "launch", "--provider", "local", "--profile", "cpu", "--phase", "fast", "--name", name,
                         "--workdir", str(tmp_path / "here" / name), "--store", "s3://runs/e2e", "--steps", "400", *TINY)
    assert code == 0, err
    assert "checkpoint uploader started" in err + out
    record = runs.load(name)
    workdir = Path(record.workdir)

    # Uploads while it trains: whole checkpoints (manifest last) appear in the bucket as the trainer writes them.
    wait_for(lambda: len([c for c in stored(name).values() if c.kind == "regular"]) >= 2, 240, "two uploaded checkpoints")
    uploader = json.loads((workdir / "storesync.json").read_text())["pid"]
    assert SECRET_KEY not in cmdlines() and ACCESS_KEY not in cmdlines()
    assert "s3://runs/e2e" in Path(f"/proc/{uploader}/cmdline").read_bytes().decode(errors="replace")

    # down: the trainer's emergency checkpoint reaches the store before the run is over.
    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    final = [r for r in rows_of(capsys, name) if r.get("event") == "finished"][-1]
    cks = stored(name)
    newest = max((c for c in cks.values() if c.kind == "regular"), key=lambda c: c.step or 0)
    assert newest.step == final["step"]
    local = json.loads((workdir / "checkpoints" / newest.name / "meta.json").read_text())
    assert {n: sha for n, (sha, _) in newest.files.items() if n in local["files"]} == local["files"]
    assert len([c for c in cks.values() if c.kind == "regular"]) <= 3 + 1  # keep_last + the best, as on the pod

    # Secrets: only in the 0600 env file; never in the record, a log, or a command line.
    assert SECRET_KEY in (workdir / "env").read_text() and (workdir / "env").stat().st_mode & 0o777 == 0o600
    texts = [(runs.runs_dir() / f"{name}.json").read_text(), out, err]
    texts += [p.read_text(errors="replace") for p in workdir.iterdir() if p.is_file() and p.name != "env"]
    assert not [t for t in texts if SECRET_KEY in t or ACCESS_KEY in t]

    # The pod is gone: fetch-best reads the store.
    shutil.rmtree(workdir)
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(tmp_path / "best"), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert "taking the best checkpoint from the store" in err
    meta = fetched_whole(Path(got["dest"]))
    assert meta["step"] == got["step"]

    # export --push with the pod gone: the store's best, exported here, pushed to the Hub (its emulator).
    from tests.support.emulators.hfhub import HubEmulator

    assert not (mirror_root(name) / "checkpoints").exists()  # nothing mirrored: all of it comes from the store
    with HubEmulator("hf_storetesttoken") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_storetesttoken")
        monkeypatch.chdir(tmp_path)
        code, out, err = cli(capsys, "export", name, "--push", "me/stored-model")
        assert code == 0, err
        assert not (tmp_path / "exports").exists()  # pushed: nothing left in --dest
        assert "exporting the store's best checkpoint here" in err
        assert {"model.safetensors", "config.json"} <= set(hub.repos["me/stored-model"].files)
        assert "hf_storetesttoken" not in out + err + cmdlines()


def test_a_run_lost_on_vast_continues_on_runpod_from_the_store(capsys, tmp_path, monkeypatch, request,
                                                              s3_server, runpod_emulator):  # noqa: F811
    from tests.e2e.cloud.test_cloud_launch import emulator_for, launch

    vast = emulator_for(request, "vast")
    monkeypatch.setenv("GPUCLI_STORE_POLL_S", "1")
    name = "moves"
    code, out, err = launch(capsys, tmp_path, "vast", name, "--store", "s3://runs/e2e", "--stall-minutes", "30")
    assert code == 0, err
    first = runs.load(name)
    wait_for(lambda: [c for c in stored(name).values() if c.kind == "regular" and (c.step or 0) >= 10], 240,
             "a checkpoint at step >= 10 in the store")
    # The instance is taken away with its disk; nothing was mirrored to this machine.
    vast.preempt(first.instance_id)
    shutil.rmtree(os.path.expanduser(first.workdir), ignore_errors=True)
    newest = max((c for c in stored(name).values() if c.kind == "regular"), key=lambda c: c.step or 0)

    # A resume never ends a pod it could not read (issue 41 rule 5): the emptied instance is ended on purpose.
    assert cli(capsys, "down", name)[0] == 0
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(tmp_path / "runpod"))
    code, out, err = cli(capsys, "resume", name, "--provider", "runpod")
    assert code == 0, err
    assert f"taking {newest.name} (step {newest.step}) from the checkpoint store" in err
    moved = runs.load(name)
    assert moved.provider == "runpod" and moved.instance_id and first.instance_id in moved.previous_instances
    assert moved.workdir.startswith(str(tmp_path / "runpod"))

    def resumed_and_going():
        rows = rows_of(capsys, name)
        resumed = [r for r in rows if r.get("event") == "resumed"]
        after = [r for r in rows if r.get("kind") == "train" and resumed and r["step"] > resumed[-1]["step"]]
        return resumed if len(after) >= 2 else None

    resumed = wait_for(resumed_and_going, 240, "training to continue on the RunPod pod")
    assert resumed[-1]["step"] == newest.step
    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    assert runpod_emulator.ledger.alive() == set()
    assert vast.ledger.alive() == set()
