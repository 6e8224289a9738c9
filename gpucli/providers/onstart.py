"""A pod whose container starts again resumes its live run by itself, or waits to be read.

vast pauses an outbid interruptible instance and "resume[s] [it] automatically when priority returns"
(vast-ai/docs guides/instances/choosing/instance-types.mdx L78, L93) by starting its container again;
RunPod starts a pod's container again after a host-side restart, and a user starts a stopped pod to
copy its files. What gpucli started over SSH (the trainer, the watchdog) is gone, while the GPU bills.
The container's start command runs at every start (vast ``onstart``; RunPod's create ``args``, see
gpucli/providers/bootguard.py), so gpucli's start command runs ``resume.sh`` from the run folder when it
exists; the launch writes that script once the trainer and watchdog run:

* the run is over (``status.json`` says finished or failed, not by a signal, or the watchdog finished
  and ended the pod): nothing starts; the pod was started to be read, and the boot guard started with
  it stops it (never terminates it) after its window unless a reader keeps touching ``.hold``;
* in-place resume is off (``GPUCLI_RESUME_IN_PLACE=0`` at launch): the pod stops itself through the
  watchdog's own API calls with the pod's key (stop, never terminate: its disk has the checkpoints);
* otherwise the trainer starts again with ``--resume auto`` (the newest checkpoint on the pod's disk,
  which a pause or restart keeps) and the watchdog with it, its caps counted from the pod's creation.

Every start is one line in ``restarts.jsonl`` of the run folder (``gpucli status`` counts them).
No laptop takes part. The script is plain ``sh``; the trainer's command and the watchdog's arguments are
the launch's own.
"""

from __future__ import annotations

import shlex

RESUME_SCRIPT = "resume.sh"
RESTARTS = "restarts.jsonl"
JOB_SCRIPT = "job.sh"


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
