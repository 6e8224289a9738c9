"""The pod's end action waits for the store: at a cap the trainer writes its final checkpoint, and the
watchdog (a real process, with storeflush.py beside it as the launch puts it) stops the pod only once the
uploader has that checkpoint whole in the store (a real S3 server, moto, on loopback). The "provider" is a
small HTTP server on loopback answering RunPod's REST v2 stop, which looks into the bucket the moment the
stop arrives."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpucli.store import objstore
from tests.gpucli.store.test_storesync import store_names, wait_for, write_checkpoint
from tests.support.s3server import s3_server  # noqa: F401

POD = Path(objstore.__file__).resolve().parents[1] / "pod"
STORE = Path(objstore.__file__).resolve().parent


class StopRecorder:
    def __init__(self, url: str, run: str) -> None:
        self.seen: list[set[str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append(set(store_names(url, run)))  # what the store holds as the pod is stopped
                body = json.dumps({"id": "pod1", "status": "EXITED"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_the_final_checkpoint_is_in_the_store_before_the_pod_is_stopped(tmp_path, s3_server):  # noqa: F811
    wd = tmp_path / "run"
    (wd / "code").mkdir(parents=True)
    for src, name in ((POD, "watchdog.py"), (POD, "procid.py"), (POD, "endwords.py"), (POD, "gpuidle.py"),
                      (POD, "slowrun.py"), (POD, "podend.py"), (POD, "storeflush.py"), (STORE, "objstore.py"),
                      (STORE, "storelocal.py"), (STORE, "storesync.py")):
        shutil.copy(src / name, wd / name)
    ck = wd / "checkpoints"
    ck.mkdir()
    write_checkpoint(ck, 10, val_loss=2.0)
    url = "s3://runs/flush"
    stop = StopRecorder(url, "r1")
    environ = tmp_path / "environ"
    environ.write_bytes(b"RUNPOD_POD_ID=pod1\0RUNPOD_API_KEY=pod-scoped-key\0")
    env = dict(os.environ, GPUCLI_POD_ENVIRON=str(environ), GPUCLI_RUNPOD_API_BASE_URL=stop.url)
    up = subprocess.Popen([sys.executable, "../storesync.py", "--run-dir", "..", "--run", "r1", "--store", url,
                           "--poll-s", "30"],  # slow polls: only the flush can bring the final one in time
                          cwd=wd / "code", env=env, start_new_session=True)
    # A stand-in trainer: at SIGTERM (the cap) it writes its final checkpoint, slowly, then exits.
    trainer = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent.parent.parent.parent)!r})\n"
        "from tests.gpucli.store.test_storesync import write_checkpoint\n"
        "from pathlib import Path\n"
        "def final(*_):\n"
        f"    time.sleep(1); write_checkpoint(Path({str(ck)!r}), 17, val_loss=None); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, final)\n"
        "while True: time.sleep(0.1)\n")], start_new_session=True)
    try:
        wait_for(lambda: "step_000010" in store_names(url, "r1"), what="the first upload")
        wd_proc = subprocess.run([sys.executable, "../watchdog.py", "--run-dir", "..", "--pgid", str(trainer.pid),
                                  "--provider", "runpod", "--poll-s", "0.2", "--grace-s", "20",
                                  "--max-hours", f"{3 / 3600}"], cwd=wd / "code", env=env, capture_output=True,
                                 text=True, timeout=120)
        assert wd_proc.returncode == 0, wd_proc.stderr
        assert up.wait(timeout=60) == 0
    finally:
        for p in (up, trainer):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        stop.server.shutdown()
    assert stop.seen and "step_000017" in stop.seen[0], stop.seen  # whole in the store before the stop call
    log = (wd / "watchdog.log").read_text()
    assert log.index("the store has every checkpoint") < log.index("runpod stop")
    assert "pod-scoped-key" not in log + (wd / "storesync.log").read_text()
