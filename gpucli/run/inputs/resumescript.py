"""What a vast.ai instance runs when its container starts again: ``resume.sh`` and ``job.sh`` in the
run folder, written by the bundled trainer's start once the trainer and watchdog run (the instance's
onstart, :func:`gpucli.providers.onstart.onstart_hook`, runs it). See that module for the rules."""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING

from gpucli.providers.onstart import JOB_SCRIPT, RESTARTS, RESUME_SCRIPT, workdir_expr
from gpucli.run.inputs.launch import ResolvedLaunch
from gpucli.runs.records import RunRecord, parse_iso
from gpucli.settings import watchdog_grace_s, watchdog_poll_s, watchdog_startup_minutes

if TYPE_CHECKING:
    from gpucli.providers.registry import Host


def job_script(resolved: ResolvedLaunch) -> str:
    """The trainer's start line as the launch ran it (from ``<workdir>/code``), resuming from disk."""
    return f"#!/bin/sh\nexec {resolved.command}\n"


def in_place_resume() -> bool:
    return os.environ.get("GPUCLI_RESUME_IN_PLACE", "1").strip() not in ("0", "false", "no")


#: Whether the run is over for this pod: its status.json says finished or failed for a reason other than
#: a signal (a container being stopped sends SIGTERM too, which is no end of the run), or its watchdog
#: finished (``watchdog.json`` state ending or done: it ended the pod, by a cap, a stall or the run's end,
#: writing "ending" before its call, since a stop kills it with the container). A pod
#: whose run is over and that starts again was started by someone (to copy its files): it is left up,
#: and the boot guard started with it stops it after its window (gpucli/providers/bootguard.py).
OVER_CHECK = ("import json, os, sys\n"
              "def read(n):\n"
              "    try:\n        return json.load(open(os.path.join(sys.argv[1], n)))\n"
              "    except Exception:\n        return {}\n"
              "s, w = read('status.json'), read('watchdog.json')\n"
              "print(1 if (s.get('state') in ('finished', 'failed') and s.get('reason') != 'signal')"
              " or w.get('state') in ('ending', 'done') else 0)")


def resume_script(resolved: ResolvedLaunch, record: RunRecord, watchdog_args: list[str]) -> str:
    """``resume.sh`` for the run folder (see the module docstring). ``watchdog_args`` are the watchdog's
    arguments after ``--pgid PGID`` (the same the launch started it with)."""
    wd = workdir_expr(resolved.workdir)
    py = shlex.quote(resolved.python)
    # Stop, never terminate: the pod holds the run's checkpoints (issue 41 rule 1).
    end_call = ("import pathlib, sys; sys.path.insert(0, '..'); import watchdog; "
                f"sys.exit(0 if watchdog.end_pod({resolved.provider!r}, 'stop', pathlib.Path('..')) else 1)")
    args = " ".join(shlex.quote(a) for a in watchdog_args)
    return f"""#!/bin/sh
# Written by gpucli for run {record.name}: the instance's onstart runs it at every container start.
WD={wd}
cd "$WD/code" || exit 0
echo "{{\\"event\\": \\"container_start\\", \\"time\\": $(date +%s)}}" >> "$WD/{RESTARTS}"
OVER=$({py} -c {shlex.quote(OVER_CHECK)} "$WD" 2>/dev/null || echo 0)
if [ "$OVER" = 1 ]; then
  # the run is over: someone started this pod to read it; the boot guard stops it after its window
  echo "$(date '+%Y-%m-%d %H:%M:%S') resume: the run is over; the pod is left up for copying" >> "$WD/watchdog.log"
  exit 0
fi
if [ "{1 if in_place_resume() else 0}" != 1 ]; then
  # in-place resume is off: this instance stops itself (its disk keeps the checkpoints)
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
if [ -f "$WD/storesync.sh" ]; then  # a run with --store: its uploader again (gpucli/store/storesync.py)
  setsid nohup sh -c 'set -a; . "$1"; set +a; exec sh "$2"' sh "$WD/env" "$WD/storesync.sh" \\
    >> "$WD/storesync.out" 2>&1 < /dev/null &
fi
"""


def write_resume_script(host: Host, resolved: ResolvedLaunch, record: RunRecord) -> None:
    """``resume.sh`` and ``job.sh`` in the run folder, once the trainer and watchdog run: an outbid
    instance that vast starts again resumes the run, or ends itself when it is over."""
    args = ["--run-dir", "..", "--provider", resolved.provider, "--poll-s", f"{watchdog_poll_s():g}",
            "--grace-s", f"{watchdog_grace_s():g}", "--on-end", resolved.on_end,
            *resolved.limits.watchdog_args()]
    if resolved.planned.tokens_per_s and not resolved.own_code:  # the slow check's yardstick, as at launch
        args += ["--planned-tokens-per-s", f"{resolved.planned.tokens_per_s:.6g}"]
    created = parse_iso(record.created_at)
    if created is not None:
        args += ["--started-at", f"{created.timestamp():.0f}"]
    startup = watchdog_startup_minutes()
    if startup is not None:
        args += ["--startup-minutes", f"{startup:g}"]
    wd = resolved.workdir
    host.write_file(f"{wd}/{JOB_SCRIPT}", job_script(resolved).encode(), mode=0o755)
    host.write_file(f"{wd}/{RESUME_SCRIPT}", resume_script(resolved, record, args).encode(), mode=0o755)
