"""gpucli's idle watch of a dev box (``gpucli up``): ends the machine's billing once it has been idle for the
idle window, or at the box's hour or dollar cap, with no laptop involved. Standard library only:

    python3 idlewatch.py --run-dir DIR --machine-dir DIR --provider runpod|vast|local|ssh
                         --idle-minutes M [--on-end stop|terminate] [--ssh-port P ...]
                         [--max-hours H] [--budget-usd USD --price-per-hour-usd USD] [--poll-s S]

Idle means, all at once:
- no job: no run folder in ``--machine-dir`` holds a live trainer (its ``.trainer`` handover names a process
  group still alive and still the one started), a command ``gpucli exec`` started (``exec/ID.out.pid`` alive,
  no ``ID.rc`` yet), nor a launch under way (its ``.launching`` marker touched in the last few minutes: a
  launch touches it at each step);
- no SSH session: no established TCP connection to the box's sshd (``--ssh-port``, from /proc/net/tcp{,6});
- no GPU at work: every GPU's utilization under ``--gpu-busy-pct`` (nvidia-smi; none counts as idle).
Ending the machine goes through the run watchdog's own code (watchdog.py beside this file: the pod-scoped
credentials, the same retries); on ``local`` and ``ssh`` hosts there is nothing to end, and the watch says
the box is over and exits. Its log is ``watchdog.log`` and its verdict ``watchdog.json``, as the watchdog's.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

LAUNCH_FRESH_S = 300.0  # a .launching marker touched this recently is a launch under way


def _load(name: str):  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location(f"gpucli_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def live_jobs(machine_dir: Path, procid) -> list[str]:  # noqa: ANN001 - procid.py, loaded by path
    """The run folders on the machine with a job alive or a launch under way."""
    busy = []
    now = time.time()
    for folder in sorted(p for p in machine_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        handover = folder / ".trainer"
        try:
            parts = handover.read_text().split()
            pgid = int(parts[0])
            ident = parts[1] if len(parts) > 1 else None
        except (OSError, ValueError, IndexError):
            pgid, ident = None, None
        if pgid and procid.group_alive(pgid) and (ident is None or procid.owned(pgid, ident)):
            busy.append(folder.name)
            continue
        if any(_exec_alive(pid_file, procid) for pid_file in (folder / "exec").glob("*.out.pid")):
            busy.append(folder.name)  # a command `gpucli exec` started there, still running
            continue
        marker = folder / ".launching"
        try:
            if not handover.exists() and now - marker.stat().st_mtime < LAUNCH_FRESH_S:
                busy.append(folder.name)
        except OSError:
            pass
    return busy


def _exec_alive(pid_file: Path, procid) -> bool:  # noqa: ANN001 - procid.py, loaded by path
    if pid_file.with_name(pid_file.name.removesuffix(".out.pid") + ".rc").exists():
        return False
    try:
        return bool(procid.group_alive(int(pid_file.read_text().split()[0])))
    except (OSError, ValueError, IndexError):
        return False


def ssh_sessions(ports: list[int]) -> int:
    """Established TCP connections whose local port is one of ``ports`` (the box's sshd)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "01":  # 01: ESTABLISHED
                continue
            try:
                port = int(fields[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if port in ports:
                count += 1
    return count


def gpus_busy(threshold_pct: float) -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    values = []
    for line in res.stdout.splitlines():
        try:
            values.append(float(line.strip()))
        except ValueError:
            continue
    return any(v >= threshold_pct for v in values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path, help="the box's own folder")
    ap.add_argument("--machine-dir", required=True, type=Path, help="where the runs on this machine have folders")
    ap.add_argument("--provider", required=True, choices=("runpod", "vast", "local", "ssh"))
    ap.add_argument("--idle-minutes", required=True, type=float)
    ap.add_argument("--on-end", choices=("stop", "terminate"), default="stop")
    ap.add_argument("--ssh-port", type=int, action="append", default=[])
    ap.add_argument("--gpu-busy-pct", type=float, default=5.0)
    ap.add_argument("--max-hours", type=float)
    ap.add_argument("--budget-usd", type=float)
    ap.add_argument("--price-per-hour-usd", type=float)
    ap.add_argument("--started-at", type=float, help="epoch seconds the box's billing started")
    ap.add_argument("--poll-s", type=float, default=30.0)
    ap.add_argument("--grace-s", type=float, default=120.0, help="SIGTERM to SIGKILL for a job at the cap")
    args = ap.parse_args(argv)
    watchdog = _load("watchdog")
    procid = watchdog.procid
    run_dir, machine_dir = args.run_dir.resolve(), args.machine_dir.resolve()
    started = args.started_at or time.time()
    max_hours = args.max_hours
    if args.budget_usd is not None and args.price_per_hour_usd:
        budget_hours = args.budget_usd / args.price_per_hour_usd
        max_hours = budget_hours if max_hours is None else min(max_hours, budget_hours)
    watchdog.log(run_dir, f"idle watch: {args.idle_minutes:g} min idle ends the box ({args.on_end}); cap "
                          f"{'none' if max_hours is None else f'{max_hours:.3f} h'}; ssh ports {args.ssh_port}")
    last_active = time.time()
    verdict = None
    while verdict is None:
        now = time.time()
        jobs = live_jobs(machine_dir, procid)
        sessions = ssh_sessions(args.ssh_port)
        if jobs or sessions or gpus_busy(args.gpu_busy_pct):
            last_active = now
        watchdog.write_state(run_dir, state="watching", box=True, jobs=jobs, ssh_sessions=sessions,
                             idle_s=round(now - last_active, 1))
        if max_hours is not None and now - started >= max_hours * 3600:
            verdict = f"limit reached ({(now - started) / 3600:.3f} h)"
            for name in jobs:  # each job gets its TERM (its last checkpoint), then KILL
                try:
                    pgid, *rest = (machine_dir / name / ".trainer").read_text().split()
                    watchdog.stop_group(machine_dir / name, int(pgid), args.grace_s, rest[0] if rest else None)
                except (OSError, ValueError):
                    continue
            break
        if now - last_active >= args.idle_minutes * 60:
            verdict = f"idle for {(now - last_active) / 60:.1f} min"
            break
        time.sleep(max(0.05, min(args.poll_s, last_active + args.idle_minutes * 60 - time.time() + 0.05)))
    watchdog.log(run_dir, f"box over: {verdict}")
    cloud = args.provider in ("runpod", "vast")
    ended = watchdog.end_pod(args.provider, args.on_end, run_dir) if cloud else False
    watchdog.write_state(run_dir, state="done", box=True, verdict=verdict, pod_ended=ended, provider=args.provider)
    if cloud and not ended:
        watchdog.log(run_dir, "COULD NOT END THE POD: it is still billing; run `gpucli down` from your machine")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
