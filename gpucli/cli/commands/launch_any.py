"""`gpucli launch` across providers: ``--provider any`` or a list, and the launch that picks its provider
itself (a GPU profile, no ``--provider``, this machine without those GPUs, a cloud key set). Everything
is imported when a launch gets here, never at start-up."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


def dry_run_across(catalog: Any, req: Any, task: Any, *, given: bool, json_: bool) -> bool:
    """``launch --dry-run`` of a launch across providers: the plan priced on the first offer and every
    offer in the order the launch would try them; nothing is created. False for one provider."""
    from gpucli.cli.render_launch import launch_plan
    from gpucli.errors import UsageError
    from gpucli.run.life import failover, lifecycle
    from gpucli.run.starting.jobs import job_for

    names, chose_itself = _providers(catalog, req, given=given, retry=None)
    if names is None:
        return False
    keyed = failover.keyed(names)
    job = job_for(task)
    if not keyed:  # the plan still shows; the offers need a key
        if not names:
            raise UsageError("no cloud provider to plan on")
        resolved, job = lifecycle.plan(catalog, dataclasses.replace(req, provider=names[0]), task)
        across: dict[str, Any] = {"providers": names, "hours": None, "offers": [],
                  "notes": ["no cloud API key is set: offers not searched (" + failover.NO_KEY_HINT + ")"]}
    else:
        resolved, job = lifecycle.plan(catalog, dataclasses.replace(req, provider=keyed[0]), task)
        ranking = failover.rank(catalog, req, job, keyed, run_name=resolved.name)
        if ranking.candidates:  # the plan as the first offer would run it
            first = ranking.candidates[0].provider
            if first != keyed[0]:
                resolved, job = lifecycle.plan(catalog, dataclasses.replace(req, provider=first), task)
        across = ranking.to_json(keyed)
        if chose_itself:
            across["notes"].insert(0, "no --provider and this machine lacks the profile's GPUs: the clouds")
    launch_plan(resolved, json_=json_, task=job.describe() if job.kind == "own" else None, across=across)
    return True


def _providers(catalog: Any, req: Any, *, given: bool, retry: str | None) -> tuple[list[str] | None, bool]:
    """The providers a launch goes across (None: one provider) and whether it chose them itself."""
    from gpucli.errors import UsageError
    from gpucli.run.life import failover

    names = failover.asked(req.provider) if given else None
    if names is None:
        if retry is not None:
            raise UsageError("--retry-until-up goes with --provider any or a list (runpod,vast)")
        if given or not _lacks_gpus(catalog, req):
            return None, False
        return failover.clouds(), True
    return names, False


def launch_across(catalog: Any, req: Any, task: Any, *, given: bool, retry: str | None, yes: bool) -> Any:
    """The launched run's record, or None when this launch is for one provider (the usual path)."""
    from gpucli.cli import render_runs as render
    from gpucli.errors import UsageError
    from gpucli.run.life import failover, lifecycle
    from gpucli.run.starting.jobs import job_for
    from gpucli.runs import records as runs
    from gpucli.runs.notice import Notice

    names, chose_itself = _providers(catalog, req, given=given, retry=retry)
    if names is None:
        return None
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
