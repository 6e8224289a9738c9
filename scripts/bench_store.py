#!/usr/bin/env python3
"""What uploading checkpoints to a store costs the training loop, and how many bytes it sends.

    python scripts/bench_store.py                 # 3 interleaved rounds of: no uploader, uploader
    python scripts/bench_store.py --rounds 1 --steps 60 --params-m 5

A CPU training loop (an MLP, one math thread, as the test suite runs) saves a checkpoint every
``--every`` steps with the bundled trainer's own writer (trainer/loop/checkpoint.py: model.pt,
optim_rank0.pt, model.safetensors, meta.json with sha256, then prune to keep_last 3). In one case nothing
else runs; in the other the pod's uploader (gpucli/store/storesync.py, at nice 10, as the launch starts
it) sends every kept checkpoint to an S3 server (moto's, in its own process on this machine) through a
byte-counting proxy. Prints the median and mean step time of each case (steps that write a checkpoint
apart), the uploader's CPU seconds, and the bytes the proxy saw against the bytes of the checkpoints.

The S3 server shares this machine's cores with the loop (a pod's store is elsewhere), so the slowdown
measured here is an upper bound of the pod's; the uploader's own CPU time is what a pod pays.
Needs: torch (the `train` extra), boto3 and moto[server] (the `test` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class CountingProxy:
    """TCP on loopback to ``port``, counting the bytes each way."""

    def __init__(self, port: int) -> None:
        self.port_to, self.up, self.down = port, 0, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", self.port_to))
            threading.Thread(target=self._pipe, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c, False), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, up: bool) -> None:
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
                if up:
                    self.up += len(data)
                else:
                    self.down += len(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the S3 server did not listen on {port}")


def train(run_dir: Path, steps: int, every: int, params_m: float) -> tuple[list[float], list[float], int]:
    """Step times (plain steps, checkpoint steps) and the bytes of every checkpoint written."""
    import torch

    from trainer.loop import checkpoint as ckpt

    torch.manual_seed(0)
    width = int((params_m * 1e6 / 4) ** 0.5)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(4)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, width)
    plain, saving, written = [], [], 0
    root = run_dir / "checkpoints"
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % every == 0:
            folder = ckpt.save_checkpoint(root, step, rank=0, world=1, model_state=model.state_dict(),
                                          optim_state={"optimizer": opt.state_dict()},
                                          meta={"train_loss": float(loss.detach()), "val_loss": 1.0 / step})
            written += sum(p.stat().st_size for p in folder.iterdir())
            ckpt.prune(root, 3)
            saving.append(time.perf_counter() - t0)
        else:
            plain.append(time.perf_counter() - t0)
    return plain, saving, written


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(case: str, args: argparse.Namespace, s3_port: int, server_pid: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="bench_store_"))
    proxy = CountingProxy(s3_port)
    up = None
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}")
    prefix = f"s3://bench/{case}-{time.time_ns()}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = cpu_s(server_pid)
    if case == "upload":
        up = subprocess.Popen([sys.executable, str(ROOT / "gpucli/store/storesync.py"), "--run-dir", str(run_dir),
                               "--run", "bench", "--store", prefix, "--keep-last", "3", "--poll-s", "1"],
                              env=env, start_new_session=True)
    t0 = time.perf_counter()
    plain, saving, written = train(run_dir, args.steps, args.every, args.params_m)
    wall = time.perf_counter() - t0
    out = {"case": case, "plain_median_s": statistics.median(plain), "plain_mean_s": statistics.fmean(plain),
           "saving_median_s": statistics.median(saving), "wall_s": wall, "checkpoint_bytes": written}
    if up is not None:
        (run_dir / "storesync.flush").write_text("bench\n")
        t1 = time.perf_counter()
        up.wait(timeout=900)
        state = json.loads((run_dir / "storesync.json").read_text())
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.update(drain_s=time.perf_counter() - t1, uploaded=state.get("uploaded"), bytes_sent=state.get("bytes_sent"),
                   wire_up=proxy.up, wire_down=proxy.down, uploader_cpu_s=usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime,
                   server_cpu_s=cpu_s(server_pid) - server_before)
    proxy.sock.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--every", type=int, default=20, help="a checkpoint every N steps")
    ap.add_argument("--params-m", type=float, default=8.0, help="the model's parameters, millions")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket="bench")
        print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"torch {torch.__version__}; {args.steps} steps, a checkpoint every {args.every}, {args.params_m:g}M params")
        results = []
        for r in range(args.rounds):
            for case in (("none", "upload") if r % 2 == 0 else ("upload", "none")):
                res = one(case, args, port, server.pid)
                results.append(res)
                print(json.dumps(res), flush=True)
        for case in ("none", "upload"):
            rs = [r for r in results if r["case"] == case]
            print(f"{case:7s} plain step median {statistics.median(r['plain_median_s'] for r in rs) * 1e3:.1f} ms, "
                  f"mean {statistics.median(r['plain_mean_s'] for r in rs) * 1e3:.1f} ms; checkpoint step "
                  f"{statistics.median(r['saving_median_s'] for r in rs) * 1e3:.0f} ms; wall "
                  f"{statistics.median(r['wall_s'] for r in rs):.1f} s")
        ups = [r for r in results if r["case"] == "upload"]
        for r in ups:
            print(f"upload: checkpoints written {r['checkpoint_bytes'] / 1e6:.1f} MB, files sent "
                  f"{r['bytes_sent'] / 1e6:.1f} MB, on the wire up {r['wire_up'] / 1e6:.1f} MB / down "
                  f"{r['wire_down'] / 1e6:.2f} MB, uploader CPU {r['uploader_cpu_s']:.1f} s (the S3 server's "
                  f"{r['server_cpu_s']:.1f} s), drain after the "
                  f"last step {r['drain_s']:.1f} s, kept in the store {len(r['uploaded'])}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
