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
