"""GPU use on the run's host, sampled from ``nvidia-smi`` while the job runs. Standard library only:
uploaded beside the run folder and started detached next to the job (bundled trainer or your own
code alike), it appends one JSON row per sample to ``gpu.jsonl``, which ``gpucli status`` and ``tail``
read::

    {"t": 1732500000.1, "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util": 98.0,
      "mem_used_mib": 71234.0, "mem_total_mib": 81559.0, "power_w": 652.3, "power_limit_w": 700.0,
      "temp_c": 67.0}]}

A field ``nvidia-smi`` reports as ``[N/A]`` or ``[Not Supported]`` (power on some cards and
containers, utilisation under MIG) is null. A host without ``nvidia-smi`` gets one row
``{"t": ..., "error": "..."}`` and the sampler ends. It ends too when the job's pid is gone, and the
file is kept under ``--max-bytes`` (its older half is dropped).

    python gpustats.py --out gpu.jsonl --pid PID [--interval 10] [--nvidia-smi nvidia-smi]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "power.draw", "power.limit",
          "temperature.gpu")
KEYS = ("index", "name", "util", "mem_used_mib", "mem_total_mib", "power_w", "power_limit_w", "temp_c")
MISSING = ("[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]", "")


def query_args(exe: str = "nvidia-smi") -> list[str]:
    return [exe, f"--query-gpu={','.join(FIELDS)}", "--format=csv"]


def _number(text: str) -> float | None:
    """``98 %``, ``71234 MiB``, ``652.31 W``, ``67`` -> the number; ``[N/A]`` and friends -> None."""
    t = text.strip()
    if t.lower() in MISSING:
        return None
    t = t.split()[0] if t.split() else t
    try:
        value = float(t)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def parse_csv(text: str) -> list[dict]:
    """The GPUs of one ``nvidia-smi --query-gpu=<FIELDS> --format=csv`` output (header line first,
    units in the header and after each value; ``noheader``/``nounits`` output is read as well)."""
    gpus = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.lower().startswith("index"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) > len(FIELDS):  # a GPU name with a comma in it
            extra = len(parts) - len(FIELDS)
            parts = [parts[0], ", ".join(parts[1:2 + extra]), *parts[2 + extra:]]
        if len(parts) != len(FIELDS):
            continue
        index = _number(parts[0])
        if index is None:
            continue
        row = {"index": int(index), "name": parts[1]}
        for i, key in enumerate(KEYS[2:]):
            row[key] = _number(parts[2 + i])
        gpus.append(row)
    return gpus


def sample(exe: str, timeout_s: float = 20.0) -> dict:
    try:
        res = subprocess.run(query_args(exe), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"t": time.time(), "error": f"nvidia-smi: {type(exc).__name__}: {exc}"[:300]}
    if res.returncode != 0:
        return {"t": time.time(), "error": f"nvidia-smi exit {res.returncode}: {(res.stderr or res.stdout).strip()[:300]}"}
    return {"t": time.time(), "gpus": parse_csv(res.stdout)}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def append(path: str, row: dict, max_bytes: int) -> None:
    line = json.dumps(row, separators=(",", ":")) + "\n"
    try:
        if os.path.getsize(path) + len(line) > max_bytes:
            with open(path, "rb") as fh:
                fh.seek(-(max_bytes // 2), os.SEEK_END)
                keep = fh.read()
            keep = keep[keep.find(b"\n") + 1:]
            tmp = path + ".tmp"
            with open(tmp, "wb") as fh:
                fh.write(keep)
            os.replace(tmp, path)
    except OSError:
        pass
    with open(path, "a") as fh:
        fh.write(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pid", type=int, required=True, help="the job's pid: sampling ends with it")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--nvidia-smi", default="nvidia-smi")
    ap.add_argument("--max-bytes", type=int, default=8 << 20)
    ap.add_argument("--max-samples", type=int, default=0, help="stop after this many (0: while the job runs)")
    args = ap.parse_args(argv)
    exe = shutil.which(args.nvidia_smi)
    if exe is None:
        append(args.out, {"t": time.time(), "error": f"{args.nvidia_smi} not found on this host"}, args.max_bytes)
        return 0
    n = 0
    while alive(args.pid):
        append(args.out, sample(exe), args.max_bytes)
        n += 1
        if args.max_samples and n >= args.max_samples:
            break
        time.sleep(max(0.05, args.interval))
    return 0


if __name__ == "__main__":
    sys.exit(main())
