"""A vast.ai instance that starts again resumes its run by itself, or ends itself.

vast pauses an outbid interruptible instance and "resume[s] [it] automatically when priority returns"
(vast-ai/docs guides/instances/choosing/instance-types.mdx L78, L93) by starting its container again:
what gpucli started over SSH (the trainer, the watchdog) is gone, while the GPU bills at the bid. The
container's ``onstart`` runs at every start, so gpucli's onstart (set at create) runs ``resume.sh`` from
the run folder when it exists; the launch writes that script once the trainer and watchdog run:

* the run is over (``status.json`` says finished or failed, not by a signal) or in-place resume is off
  (``GPUCLI_RESUME_IN_PLACE=0`` at launch): the instance ends itself through the watchdog's own API
  calls with the instance key (the run's ``--on-end``);
* otherwise the trainer starts again with ``--resume auto`` (the newest checkpoint on the instance's
  disk, which a pause keeps) and the watchdog with it, its caps counted from the pod's creation.

Every start is one line in ``restarts.jsonl`` of the run folder (``gpucli status`` counts them).
No laptop takes part. The script is plain ``sh``; the trainer's command and the watchdog's arguments are
the launch's own.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpucli.run.launch import ResolvedLaunch
    from gpucli.run.records import RunRecord

RESUME_SCRIPT = "resume.sh"
RESTARTS = "restarts.jsonl"
JOB_SCRIPT = "job.sh"


def job_script(resolved: ResolvedLaunch) -> str:
    """The trainer's start line as the launch ran it (from ``<workdir>/code``), resuming from disk."""
    return f"#!/bin/sh\nexec {resolved.command}\n"


def workdir_expr(workdir: str) -> str:
    """The run folder as a shell word: absolute as it is, relative to ``$HOME`` (the login directory)."""
    if workdir.startswith("/"):
        return shlex.quote(workdir)
    rel = workdir[2:] if workdir.startswith("~/") else workdir
    return '"$HOME"/' + shlex.quote(rel)


def onstart_hook(workdir: str) -> str:
    """The part of the instance's onstart that runs the run's resume script, detached, when it exists."""
    wd = workdir_expr(workdir)
    return f"if [ -x {wd}/{RESUME_SCRIPT} ]; then (setsid sh {wd}/{RESUME_SCRIPT} >/dev/null 2>&1 < /dev/null &); fi"


def in_place_resume() -> bool:
    return os.environ.get("GPUCLI_RESUME_IN_PLACE", "1").strip() not in ("0", "false", "no")


#: Whether the run ended on its own (its status.json says finished or failed for a reason other than a
#: signal: a container being stopped sends SIGTERM too, which is no end of the run).
OVER_CHECK = ("import json, sys; s = json.load(open(sys.argv[1])); "
              "print(1 if s.get('state') in ('finished', 'failed') and s.get('reason') != 'signal' else 0)")


def resume_script(resolved: ResolvedLaunch, record: RunRecord, watchdog_args: list[str]) -> str:
    """``resume.sh`` for the run folder (see the module docstring). ``watchdog_args`` are the watchdog's
    arguments after ``--pgid PGID`` (the same the launch started it with)."""
    wd = workdir_expr(resolved.workdir)
    py = shlex.quote(resolved.python)
    end_call = ("import pathlib, sys; sys.path.insert(0, '..'); import watchdog; "
                f"sys.exit(0 if watchdog.end_pod({resolved.provider!r}, {resolved.on_end!r}, pathlib.Path('..')) else 1)")
    args = " ".join(shlex.quote(a) for a in watchdog_args)
    return f"""#!/bin/sh
# Written by gpucli for run {record.name}: the instance's onstart runs it at every container start.
WD={wd}
cd "$WD/code" || exit 0
echo "{{\\"event\\": \\"container_start\\", \\"time\\": $(date +%s)}}" >> "$WD/{RESTARTS}"
OVER=$({py} -c {shlex.quote(OVER_CHECK)} "$WD/status.json" 2>/dev/null || echo 0)
if [ "$OVER" = 1 ] || [ "{1 if in_place_resume() else 0}" != 1 ]; then
  # the run is over, or in-place resume is off: this instance ends itself
  set -a; . "$WD/watchdog.env"; set +a
  exec {py} -c {shlex.quote(end_call)} >> "$WD/watchdog.log" 2>&1
fi
rm -f "$WD/console.log.pid" "$WD/watchdog.out.pid"
setsid nohup sh -c 'echo $$ > "$1"; set -a; . "$2"; set +a; exec sh "$3"' \\
  sh "$WD/console.log.pid" "$WD/env" "$WD/{JOB_SCRIPT}" >> "$WD/console.log" 2>&1 < /dev/null &
i=0; while [ ! -s "$WD/console.log.pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
PGID=$(cat "$WD/console.log.pid")
setsid nohup sh -c 'echo $$ > "$1"; set -a; . "$2"; set +a; shift 2; exec "$@"' \\
  sh "$WD/watchdog.out.pid" "$WD/watchdog.env" {py} ../watchdog.py --pgid "$PGID" {args} \\
  >> "$WD/watchdog.out" 2>&1 < /dev/null &
"""
