"""`gpucli launch` across providers: ``--provider any`` or a list, and the launch that picks its provider
itself (a GPU profile, no ``--provider``, this machine without those GPUs, a cloud key set). Everything
is imported when a launch gets here, never at start-up."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


def launch_across(catalog: Any, req: Any, task: Any, *, given: bool, retry: str | None, yes: bool) -> Any:
    """The launched run's record, or None when this launch is for one provider (the usual path)."""
    from gpucli.cli import render_runs as render
    from gpucli.errors import UsageError
    from gpucli.run import failover, lifecycle
    from gpucli.run.jobs import job_for
    from gpucli.runs import records as runs
    from gpucli.runs.notice import Notice

    names = failover.asked(req.provider) if given else None
    chose_itself = False
    if names is None:
        if retry is not None:
            raise UsageError("--retry-until-up goes with --provider any or a list (runpod,vast)")
        if given or not _lacks_gpus(catalog, req):
            return None
        names, chose_itself = failover.clouds(), True
    keyed = failover.keyed(names)
    if not keyed:
        prof = catalog.profile(req.profile)
        why = (f"profile {prof.name} needs {prof.count}x {prof.gpu} and this machine lacks them"
               if chose_itself else f"--provider {req.provider}")
        raise UsageError(f"{why}: no cloud API key is set to rent them",
                         hint=failover.NO_KEY_HINT + ("; --provider local --force runs here anyway"
                                                      if chose_itself else ""))
    until_s = failover.parse_duration(retry) if retry is not None else None
    job = job_for(task)
    lifecycle.plan(catalog, dataclasses.replace(req, provider=keyed[0]), task)  # bad input: said before any search
    name = runs.reserve_name(req.name, exact=True) if req.name else \
        runs.reserve_name(lifecycle._default_name(catalog, req, job))
    try:
        ranking = failover.rank(catalog, req, job, keyed, run_name=name)
        if not ranking.candidates:
            raise failover.AllOffersFailed("no offer for the run on " + ", ".join(keyed) + ": "
                                           + ("; ".join(ranking.notes) or "none listed"),
                                           hint="`gpucli offers` shows what is listed; --retry-until-up waits")
        render.notice(Notice("info", f"{'chose the cheapest offer' if chose_itself else 'first offer'}: "
                                     f"{ranking.quote()}"))
        if chose_itself and not yes:
            if not sys.stdin.isatty():
                raise UsageError("this launch rents a cloud machine (no --provider given, this machine lacks the "
                                 "profile's GPUs): pass --yes to launch without asking",
                                 hint="or --provider runpod|vast|any")
            if not render.confirm("launch it?"):
                raise UsageError("not launched")
        with render.status_line() as step:
            return failover.launch_across(catalog, req, job, keyed, name=name, ranking=ranking,
                                          retry_until_s=until_s, on_step=step, on_notice=render.notice)
    finally:
        runs.release_name(name)


def _lacks_gpus(catalog: Any, req: Any) -> bool:
    """A one-machine launch of a GPU profile on a machine without that many GPUs."""
    from gpucli.providers.local.target import local_gpus

    if req.host or req.hosts or req.nodes > 1 or req.force:
        return False
    prof = catalog.profile(req.profile)
    return prof.gpu is not None and local_gpus() < prof.count
