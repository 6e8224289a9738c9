"""gpucli's pod-side watchdog: ends the pod's billing when the run is over, with no laptop involved.

Started by ``gpucli launch`` next to the trainer, in its own session, standard library only
(``python3 watchdog.py --run-dir DIR --pgid PID --provider runpod|vast|local|ssh [--max-hours H]
[--budget-usd USD --price-per-hour-usd USD] [--stall-minutes M] [--on-end stop|terminate|keep]``).
Each poll: the trainer's process group gone (finished, crashed) -> end the pod; no new metrics row for
``--stall-minutes`` -> TERM, KILL, end the pod; past the hour or dollar cap (a backstop: the trainer
stops itself first) -> TERM, wait, KILL, end the pod.

"End the pod" uses the pod's own credentials, never the user's account key (podend.py, beside this file):
RunPod's pod-scoped ``RUNPOD_API_KEY`` through REST v2 ``POST /v2/pods/{id}/action`` (a 409 to a stop is
done), then GraphQL ``podStop``/``podTerminate`` (no source says v2 takes the pod key; GraphQL retires in
early 2027); rank 0 of an Instant Cluster deletes the cluster; vast's ``CONTAINER_API_KEY`` through
``PUT /api/v0/instances/{CONTAINER_ID}/`` (or DELETE). The path that worked is in ``watchdog.log`` and
``ended_by`` in ``watchdog.json``. Versions and endpoints come from the
0600 ``watchdog.env`` beside this script; the pod's variables from ``/proc/1/environ``
(``GPUCLI_POD_ENVIRON`` for emulators). On ``local`` and ``ssh`` it only stops a hung trainer.
docs/money-and-clouds.md describes it whole.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _load(name: str):  # noqa: ANN202 - a module
    """``name``.py from next to this file (on the pod as here): by path, so this file stays one that
    runs as a plain script with nothing but the standard library."""
    spec = importlib.util.spec_from_file_location(f"gpucli_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


procid = _load("procid")
_words = _load("endwords")  # how a run's end is said (endwords.py)
cap_words, elapsed_words, say_stop, finished_reason = (_words.cap_words, _words.elapsed_words, _words.say_stop,
                                                       _words.finished_reason)


def log(run_dir: Path, message: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} watchdog: {message}\n"
    with open(run_dir / "watchdog.log", "a") as fh:
        fh.write(line)


def write_state(run_dir: Path, **fields: object) -> None:
    tmp = run_dir / "watchdog.json.tmp"
    tmp.write_text(json.dumps(dict(fields, time=time.time())))
    tmp.replace(run_dir / "watchdog.json")


def stop_group(run_dir: Path, pgid: int, grace_s: float, ident: str | None = None) -> None:
    """SIGTERM (the trainer writes its emergency checkpoint), then SIGKILL after ``grace_s``; only
    while ``pgid`` is still the process ``ident`` names."""
    if ident is None:
        return
    sent = procid.send(pgid, ident, "TERM")
    if sent == 3:
        log(run_dir, f"process group {pgid} is no longer the trainer: not signalled")
    if sent != 0:
        return
    log(run_dir, f"sent SIGTERM to the trainer (process group {pgid})")
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not procid.group_alive(pgid):
            return
        time.sleep(0.5)
    if procid.send(pgid, ident, "KILL") == 0:
        log(run_dir, f"trainer still alive after {grace_s:.0f} s: sent SIGKILL")


# ---- ending the pod with its own credentials: podend.py -----------------------------------------

_end = _load("podend")
pod_environ, pod_calls, end_pod, user_agent = _end.pod_environ, _end.pod_calls, _end.end_pod, _end.user_agent


# ---- the loop -----------------------------------------------------------------------------------


def last_progress(run_dir: Path, started: float) -> float:
    """When the trainer last wrote a metrics row, or the data step (fetch.py, trainer.prepare) a
    progress line to prepare.jsonl: hours of downloading and preparing are progress, not a hang
    (or the watchdog start, before either)."""
    latest = started
    for name in ("metrics.jsonl", "prepare.jsonl"):
        try:
            latest = max(latest, (run_dir / name).stat().st_mtime)
        except OSError:
            pass
    return latest


#: Past the cap before the trainer started, how long the launch may be quiet before the pod is ended.
CAP_QUIET_S = 60.0


def launch_activity(run_dir: Path, since: float) -> float:
    """When the launch last showed it is alive: its ``.launching`` marker (touched at each step) or a
    new entry in the folders it fills (code, data), or ``since``."""
    latest = since
    for sub in (".launching", ".", "code", "data", "data/src", "checkpoints"):
        try:
            latest = max(latest, (run_dir / sub).stat().st_mtime)
        except OSError:
            pass
    return latest


def read_handover(path: Path) -> tuple[int, str | None] | str | None:
    """``PGID IDENT`` the launch wrote once the trainer started; "abandoned" when the launch failed
    and gave up; None (not yet, or not readable)."""
    try:
        with open(path, "rb") as fh:  # a small file the launch wrote atomically; never more than 4 KiB read
            parts = fh.read(4096).decode(errors="replace").split()
    except OSError:
        return None
    if parts == ["abandoned"]:
        return "abandoned"
    if not parts or not parts[0].isdigit() or not 0 < int(parts[0]) < 1 << 22:
        return None
    return int(parts[0]), (parts[1] if len(parts) > 1 and parts[1] != "gone" else None)


def wait_for_trainer(args: argparse.Namespace, run_dir: Path, started: float, max_hours: float | None
                     ) -> tuple[int, str | None] | str:
    """Before the trainer exists (the pod is being set up): the trainer's ``(pgid, ident)`` once the
    launch hands it over, or the verdict that ends the pod: the hour/dollar cap reached, or no sign of
    the launch for ``--launch-minutes`` (it was killed; nothing will start the trainer)."""
    watching = time.time()
    log(run_dir, f"watching the launch until it starts the trainer; limit "
                 f"{'none' if max_hours is None else f'{max_hours:.3f} h'}; launch silence {args.launch_minutes:g} min")
    write_state(run_dir, state="launching")
    while True:
        got = read_handover(args.pgid_file)
        if got == "abandoned":
            return "the launch failed before the trainer started"
        if isinstance(got, tuple):
            return got
        now = time.time()
        idle = now - launch_activity(run_dir, watching)
        # At the cap with the launch still working, the trainer it is about to start is stopped at once
        # (its checkpoint, then the pod's end as --on-end says); a launch quiet for a minute is gone.
        if max_hours is not None and now - started >= max_hours * 3600 and idle > CAP_QUIET_S:
            return f"limit reached before the trainer started ({(now - started) / 3600:.3f} h)"
        if idle > args.launch_minutes * 60:
            return f"launch gone (no sign of it for {idle / 60:.1f} min, no trainer started)"
        time.sleep(min(args.poll_s, 5.0))


def start_peers(args: argparse.Namespace, run_dir: Path):  # noqa: ANN201 - peers.PeerWatch, loaded by path
    """The watch of the run's other machines (peers.py), for a run over several; else None."""
    if args.nodes <= 1 or not args.peer_addr:
        return None
    spec = importlib.util.spec_from_file_location("gpucli_peers", Path(__file__).with_name("peers.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    log(run_dir, f"node {args.node_rank} of {args.nodes}: watching the other nodes through {args.peer_addr}")
    token = args.peer_token_file.read_text().strip() if args.peer_token_file else ""
    return module.PeerWatch(args.nodes, args.node_rank, args.peer_addr, poll_s=args.poll_s, token=token,
                            timeout_s=args.peer_timeout_s, startup_s=max(args.startup_minutes * 60, args.peer_timeout_s),
                            log=lambda m: log(run_dir, m))


def start_checks(args: argparse.Namespace, run_dir: Path) -> list[Any]:
    """The idle-GPU stop and the slow-run check asked for (gpuidle.py, slowrun.py beside this file)."""
    say = lambda m: log(run_dir, m)  # noqa: E731
    idle = [_load("gpuidle").IdleWatch(run_dir, args.idle_stop_minutes * 60, say, startup_s=args.startup_minutes * 60)
            ] if args.idle_stop_minutes else []
    return idle + ([_load("slowrun").SlowWatch(run_dir, args.planned_tokens_per_s, args.slow_below, args.replace_slow, say)]
                   if args.planned_tokens_per_s and args.slow_below else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--pgid", type=int, help="the trainer's process group (or --pgid-file)")
    ap.add_argument("--pgid-file", type=Path, help="started before the trainer: wait for 'PGID IDENT' in this file")
    ap.add_argument("--launch-minutes", type=float, default=60.0,
                    help="with --pgid-file: end the pod when the launch shows no sign of life for this long")
    ap.add_argument("--provider", required=True, choices=("runpod", "vast", "local", "ssh"))
    ap.add_argument("--max-hours", type=float)
    ap.add_argument("--budget-usd", type=float, help="end the run when the machine has cost this much")
    ap.add_argument("--price-per-hour-usd", type=float, help="$/hour of the whole machine")
    ap.add_argument("--stall-minutes", type=float, default=30.0)
    ap.add_argument("--startup-minutes", type=float, default=30.0,
                    help="no stall verdict before the first metrics row for this long (compile, data prep)")
    ap.add_argument("--poll-s", type=float, default=30.0)
    ap.add_argument("--grace-s", type=float, default=120.0, help="SIGTERM to SIGKILL")
    ap.add_argument("--on-end", choices=("stop", "terminate", "keep"), default="stop",
                    help="keep: a run on a dev box, whose own idle watch ends the machine")
    ap.add_argument("--started-at", type=float, help="epoch seconds the run's billing started")
    ap.add_argument("--pgid-ident", help="the trainer's identity (procid.py) when it started; default: now")
    ap.add_argument("--nodes", type=int, default=1, help="machines in the run (peers.py watches the others)")
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--peer-addr", help="HOST:PORT where rank 0's watchdog listens for the other nodes'")
    ap.add_argument("--peer-timeout-s", type=float, default=300.0, help="a node silent this long is lost")
    ap.add_argument("--peer-token-file", type=Path, help="the run's shared secret for peers.py (0600)")
    ap.add_argument("--idle-stop-minutes", type=float, help="end the run when every GPU idles this long (0: off)")
    ap.add_argument("--planned-tokens-per-s", type=float, help="the plan's speed, for the slow check (slowrun.py)")
    ap.add_argument("--slow-below", type=float, help="slow: measured under this share of the plan")
    ap.add_argument("--replace-slow", action="store_true", help="a slow run: checkpoint, then end this machine")
    ap.add_argument("--replace-wait-s", type=float, default=600.0, help="then wait this long for a watcher to replace it")
    args = ap.parse_args(argv)
    if args.pgid is None and args.pgid_file is None:
        ap.error("--pgid or --pgid-file is required")
    run_dir = args.run_dir.resolve()
    started = args.started_at or time.time()
    # The hour limit and the budget are one deadline: whichever comes first.
    max_hours = args.max_hours
    if args.budget_usd is not None and args.price_per_hour_usd:
        budget_hours = args.budget_usd / args.price_per_hour_usd
        max_hours = budget_hours if max_hours is None else min(max_hours, budget_hours)
    if args.pgid is None:
        got = wait_for_trainer(args, run_dir, started, max_hours)
        if isinstance(got, str):
            # Nothing of the run is on the pod yet (a restored checkpoint is a copy): a stopped pod would
            # still bill its disk, so it is terminated.
            return finish(args, run_dir, got, on_end="terminate")
        args.pgid, args.pgid_ident = got[0], args.pgid_ident or got[1]
    # Signals go only to the process group this identity names: a pid the trainer left behind and
    # another process took is never signalled.
    ident = args.pgid_ident or procid.identity(args.pgid)
    log(run_dir, f"watching process group {args.pgid} ({args.provider}); limit "
                 f"{'none' if max_hours is None else f'{max_hours:.3f} h'}; stall {args.stall_minutes:g} min")
    write_state(run_dir, state="watching", pgid=args.pgid)
    cap = cap_words(args.max_hours, args.budget_usd, args.price_per_hour_usd)
    peers = start_peers(args, run_dir)
    checks = start_checks(args, run_dir)
    peer_since: float | None = None
    verdict = None
    while verdict is None:
        now = time.time()
        seen_rows = (run_dir / "metrics.jsonl").exists()
        if peers is not None and procid.leader_gone(args.pgid):
            # torchrun (or the shell that ran it) is gone on this node: what it left running is no run
            verdict = "this node's torchrun agent is gone"
            procid.kill_orphans(args.pgid, args.grace_s, say=lambda m: log(run_dir, m))
            break
        if not procid.group_alive(args.pgid) or (ident is not None and not procid.owned(args.pgid, ident)):
            reason = finished_reason(run_dir)
            verdict = f"finished ({reason})" if reason else "crashed"
            if peers is not None and args.node_rank > 0 and not reason:
                verdict = "ended (rank 0's run folder holds how)"  # only rank 0 writes status.json
            break
        if peers is not None:  # the node's heartbeat, for `gpucli status`
            write_state(run_dir, state="watching", pgid=args.pgid, node_rank=args.node_rank)
        lost = peers.verdict() if peers is not None else None
        if lost is not None:
            peer_since = peer_since or now
            if now - peer_since >= args.grace_s / 2:  # time to end by itself: the collectives fail at once
                verdict = f"another node: {lost}"
                stop_group(run_dir, args.pgid, args.grace_s, ident)
                break
        progress = last_progress(run_dir, started)
        limit = (args.stall_minutes if seen_rows else max(args.stall_minutes, args.startup_minutes)) * 60
        if now - progress > limit:
            verdict = f"stalled (no metrics for {(now - progress) / 60:.1f} min)"
            say_stop(run_dir, f"by watchdog: no metrics for {(now - progress) / 60:.1f} min")
            stop_group(run_dir, args.pgid, args.grace_s, ident)
            break
        hit = next((v for v in (c.check() for c in checks) if v), None)  # idle GPUs, a slow run replaced
        if hit:
            verdict = hit
            say_stop(run_dir, f"by watchdog: {hit}")
            write_state(run_dir, state="ending", pgid=args.pgid, verdict=hit)  # status reads it from now on
            stop_group(run_dir, args.pgid, args.grace_s, ident)
            break
        if max_hours is not None and now - started >= max_hours * 3600:
            verdict = f"limit reached ({(now - started) / 3600:.3f} h)"
            say_stop(run_dir, f"by cap: {cap} at {elapsed_words(now - started)}")
            stop_group(run_dir, args.pgid, args.grace_s, ident)
            break
        # Wake for the nearest deadline (a cap, the stall limit), never later than --poll-s.
        deadlines = [progress + limit] + ([started + max_hours * 3600] if max_hours is not None else [])
        time.sleep(max(0.05, min(args.poll_s, min(deadlines) - time.time() + 0.05)))
    return finish(args, run_dir, str(verdict), peers=peers)


def wait_for_store(run_dir: Path) -> None:
    """A run with a checkpoint store: its uploader sends the last checkpoints before the pod's end action
    (storeflush.py, written beside this file by the launch only for such a run; loaded by path)."""
    path = Path(__file__).with_name("storeflush.py")
    if not path.exists():
        return
    spec = importlib.util.spec_from_file_location("gpucli_storeflush", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.wait_for_store(run_dir, log=lambda m: log(run_dir, m), alive=procid.group_alive)


def finish(args: argparse.Namespace, run_dir: Path, verdict: str, on_end: str | None = None,
           peers: Any = None) -> int:
    """The run is over: end the pod (cloud providers) and record the verdict."""
    log(run_dir, f"run over: {verdict}")
    if peers is not None:
        peers.finish(verdict, wait_s=args.grace_s + 3 * args.poll_s)
    wait_for_store(run_dir)
    if verdict.startswith("slow: ") and args.provider in ("runpod", "vast"):  # a watcher's time to take over
        _load("slowrun").wait_for_watcher(run_dir, args.replace_wait_s, lambda m: log(run_dir, m))
    keep = args.on_end == "keep"  # a run on a box: the machine is not this run's to end, even when abandoned
    # Written before the pod ends: a stop kills this process with the container, and a later start of the
    # pod must read the run as over (resume.sh), not resume it.
    write_state(run_dir, state="ending", verdict=verdict, provider=args.provider)
    provider = "runpod" if os.environ.get("GPUCLI_RUNPOD_CLUSTER_ID") else args.provider  # a cluster's node

    def trying(what: str) -> None:  # the path being tried: the one that ended the pod if this process dies now
        write_state(run_dir, state="ending", verdict=verdict, provider=provider, trying=what)

    path = end_pod(provider, on_end or args.on_end, run_dir, trying) if provider in ("runpod", "vast") and not keep \
        else None
    write_state(run_dir, state="done", verdict=verdict, pod_ended=path is not None, ended_by=path, provider=provider)
    if provider in ("runpod", "vast") and path is None and not keep:
        log(run_dir, "COULD NOT END THE POD: it is still billing; run `gpucli down` from your machine")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
