"""The pod's uploader (gpucli/store/storesync.py) as it runs on a pod: a process of its own with the
credentials in its environment, against a real S3 server on loopback (moto's server mode)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucli.store import objstore
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, RefusingBucket, s3_server  # noqa: F401
from tests.support.throttle import ThrottleProxy

STORESYNC = Path(objstore.__file__).with_name("storesync.py")


def write_checkpoint(root: Path, step: int, *, val_loss: float | None, size: int = 4096) -> Path:
    """A checkpoint as the bundled trainer leaves it: files, then meta.json with their sha256, the folder
    renamed into place."""
    tmp = root / f".tmp_step_{step:06d}"
    tmp.mkdir(parents=True)
    files = {}
    for name, n in (("model.pt", size), ("optim_rank0.pt", size // 2)):
        data = os.urandom(n)
        (tmp / name).write_bytes(data)
        files[name] = hashlib.sha256(data).hexdigest()
    meta = {"step": step, "train_loss": 3.0 - step / 100, "val_loss": val_loss, "files": files,
            "sha256": files["model.pt"]}
    (tmp / "meta.json").write_text(json.dumps(meta))
    final = root / f"step_{step:06d}"
    tmp.rename(final)
    return final


def start(run_dir: Path, store: str, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(STORESYNC), "--run-dir", str(run_dir), "--run", "r1", "--store", store,
                             "--keep-last", "2", "--poll-s", "0.3", *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(cond, timeout_s: float = 90.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def store_names(url: str, run: str = "r1") -> dict[str, objstore.StoredCheckpoint]:
    u = objstore.parse_url(url)
    return {c.name: c for c in objstore.whole_checkpoints(objstore.open_store(u), u, run)}


def test_uploads_as_it_trains_keeps_what_the_pod_keeps_and_flushes(tmp_path, s3_server):  # noqa: F811
    run_dir, url = tmp_path / "run", "s3://runs/team/a"
    ck = run_dir / "checkpoints"
    ck.mkdir(parents=True)
    write_checkpoint(ck, 10, val_loss=2.5)
    proc = start(run_dir, url, dict(os.environ))
    try:
        wait_for(lambda: "step_000010" in store_names(url), what="the first checkpoint")
        write_checkpoint(ck, 20, val_loss=2.0)
        write_checkpoint(ck, 30, val_loss=2.2)
        write_checkpoint(ck, 40, val_loss=2.3)
        # keep_last 2 (30, 40) + the best by val loss (20); 10 is pruned from the store, never from the pod
        wait_for(lambda: set(store_names(url)) == {"step_000020", "step_000030", "step_000040"}, what="pruning")
        assert (ck / "step_000010" / "model.pt").exists()
        write_checkpoint(ck, 50, val_loss=None)  # the final one, written as the job ends
        (run_dir / "storesync.flush").write_text("now\n")
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    state = json.loads((run_dir / "storesync.json").read_text())
    assert state["state"] == "flushed" and state["left"] == []
    stored = store_names(url)
    assert set(stored) == {"step_000020", "step_000040", "step_000050"}
    got = stored["step_000050"]
    meta = json.loads((ck / "step_000050" / "meta.json").read_text())
    assert got.step == 50 and got.loss == pytest.approx(2.5) and got.val_loss is None
    assert {n: s for n, (s, _) in got.files.items() if n != "meta.json"} == meta["files"]
    keys = s3_server.keys()
    assert all(k.startswith("team/a/r1/checkpoints/") for k in keys)
    # every file's bytes in the store are the pod's, as the manifest says
    body = s3_server.client().get_object(Bucket="runs", Key=f"{got.prefix}/model.pt")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == meta["files"]["model.pt"]
    text = (run_dir / "storesync.log").read_text()
    assert SECRET_KEY not in text and ACCESS_KEY not in text


def test_a_kill_mid_upload_leaves_no_whole_checkpoint_and_a_restart_completes_it(tmp_path, s3_server):  # noqa: F811
    run_dir, url = tmp_path / "run", "s3://runs/p"
    ck = run_dir / "checkpoints"
    ck.mkdir(parents=True)
    write_checkpoint(ck, 100, val_loss=1.5, size=24 << 20)
    with ThrottleProxy(s3_server.port, bytes_per_s=4 << 20) as proxy:
        env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
        proc = start(run_dir, url, env)
        wait_for(lambda: proxy.sent > 6 << 20, what="the upload under way")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # files of it may be in the store, its manifest is not: it is not whole
    assert "step_000100" not in store_names(url)
    proc = start(run_dir, url, dict(os.environ))
    try:
        wait_for(lambda: "step_000100" in store_names(url), what="the upload after a restart")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    got = store_names(url)["step_000100"]
    assert got.files["model.pt"][1] == 24 << 20


def test_a_bucket_that_refuses_writes_is_one_clear_line_and_the_local_copies_stay(tmp_path):
    run_dir = tmp_path / "run"
    ck = run_dir / "checkpoints"
    ck.mkdir(parents=True)
    folder = write_checkpoint(ck, 10, val_loss=2.0)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with RefusingBucket() as bucket:
        env = dict(os.environ, AWS_ENDPOINT_URL=bucket.endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                   AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1")
        proc = start(run_dir, "s3://runs/x", env)
        try:
            wait_for(lambda: (run_dir / "storesync.log").exists()
                     and "refuses" in (run_dir / "storesync.log").read_text(), what="the refusal")
            time.sleep(2)  # more polls: the line is said once, not at every retry
            (run_dir / "storesync.flush").write_text("now\n")
            assert proc.wait(timeout=60) == 1  # the job is over; nothing could be uploaded
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    lines = [ln for ln in (run_dir / "storesync.log").read_text().splitlines() if "refuses" in ln]
    assert len(lines) == 1, lines
    assert "AccessDenied" in lines[0] and "training goes on" in lines[0]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    state = json.loads((run_dir / "storesync.json").read_text())
    assert state["state"] == "flushed" and state["left"] == ["step_000010"]
    for name in ("storesync.log", "storesync.json"):
        text = (run_dir / name).read_text()
        assert SECRET_KEY not in text and ACCESS_KEY not in text
    assert b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]


def test_your_own_codes_checkpoints_go_to_a_hub_repository_and_come_back_whole(tmp_path, monkeypatch):
    from gpucli.run.files.store import download
    from tests.support.emulators.hfhub import HubEmulator

    token = "hf_gpuclitesttokenneverlogged"
    run_dir = tmp_path / "run"
    out = run_dir / "code" / "out"
    for step in (10, 20):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        (out / f"checkpoint-{step}" / "model.safetensors").write_bytes(os.urandom(3000 + step))
        (out / f"checkpoint-{step}" / "config.json").write_text('{"a": 1}')
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in ({"step": 10, "loss": 2.4}, {"step": 10, "kind": "val", "val_loss": 2.0},
                                       {"step": 20, "loss": 1.9}, {"step": 20, "kind": "val", "val_loss": 1.5})))
    with HubEmulator(token) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", token)
        proc = start(run_dir, "hf://me/ckpts/runs", dict(os.environ), "--kind", "own", "--checkpoints", "code/out",
                     "--min-age-s", "0.5")
        try:
            wait_for(lambda: {"checkpoint-10", "checkpoint-20"} <= set(store_names("hf://me/ckpts/runs")),
                     what="both checkpoints on the Hub")
            (run_dir / "storesync.flush").write_text("now\n")
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert hub.repos["me/ckpts"].private  # created private on first use
        got = store_names("hf://me/ckpts/runs")["checkpoint-20"]
        assert got.kind == "own" and got.step == 20 and got.val_loss == 1.5 and got.loss == 1.9
        assert set(got.files) == {"checkpoint-20/model.safetensors", "checkpoint-20/config.json"}
        store = objstore.open_store("hf://me/ckpts/runs")
        pulled = download(store, got, tmp_path / "back")
        for name in got.files:
            assert (pulled.dest / name).read_bytes() == (out / name).read_bytes()
    text = (run_dir / "storesync.log").read_text() + (run_dir / "storesync.json").read_text()
    assert token not in text
