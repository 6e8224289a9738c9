"""``gpucli launch --pick cheapest|fastest|best``: the planner's choice (gpucli/plan/planner.py ``Picks``, the
same the ``plan`` command shows) handed to the launch: its GPUs as the profile, its hours and dollars as
the defaults of ``--hours`` and ``--budget`` (a value given wins)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from gpucli.errors import NothingFitsError, UsageError
from gpucli.plan.planner import PlanRequest, make_plan
from gpucli.runs.defaults import DEFAULTS

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.run.inputs.launch import LaunchRequest

PICKS = {"cheapest": "cheapest", "fastest": "fastest", "best": "best_value"}


def picked(catalog: Catalog, req: LaunchRequest, pick: str) -> tuple[LaunchRequest, str]:
    """The request with the plan's setup and caps, and one line saying what was picked."""
    key = PICKS.get(pick.strip().lower())
    if key is None:
        raise UsageError(f"--pick takes cheapest, fastest or best, got '{pick}'")
    model = catalog.model(req.model or DEFAULTS.model_for(True))
    plan = make_plan(catalog, PlanRequest(model=model, today=dt.date.today(), spot=req.spot))
    est = getattr(plan.picks, key)
    if est is None:
        raise NothingFitsError(f"the plan for {model.name} has no {pick} setup", hint="see `gpucli plan`")
    gpu, n = est.setup.gpu, est.setup.n_gpus
    named = [p.name for p in catalog.single_profiles.values() if p.gpu == gpu.id and n == 1] + \
        [c.name for c in catalog.cluster_profiles.values() if c.gpu == gpu.id and c.count == n]
    profile = named[0] if named else f"{n}x{gpu.id}"
    limits = req.limits.with_(max_hours=req.limits.max_hours or round(est.hours, 3),
                              budget_usd=req.limits.budget_usd or round(est.cost_usd, 2))
    line = (f"--pick {pick}: {est.setup.label} (profile {profile}) for {model.name}: {est.hours:.1f} h, "
            f"${est.cost_usd:.2f} planned; caps --hours {limits.max_hours:g} --budget {limits.budget_usd:g}")
    return dataclasses.replace(req, profile=profile, model=model.name, limits=limits), line
