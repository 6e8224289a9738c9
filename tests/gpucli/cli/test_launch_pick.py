"""`gpucli launch --pick`: the planner's choice as the launch's profile, its hours and dollars as the caps."""

from __future__ import annotations

import json

from gpucli.plan.catalog import load_catalog
from gpucli.run.inputs.launch import LaunchRequest
from gpucli.run.inputs.pick import picked
from gpucli.runs.limits import Limits
from tests.support.cli import cli


def test_pick_sets_profile_and_caps_unless_given():
    catalog = load_catalog()
    req, line = picked(catalog, LaunchRequest(profile="cpu", model="124m"), "cheapest")
    assert req.profile != "cpu" and catalog.profile(req.profile).gpu is not None
    assert req.limits.max_hours and req.limits.budget_usd and "--pick cheapest" in line
    given, _ = picked(catalog, LaunchRequest(profile="cpu", model="124m", limits=Limits(max_hours=3.0)), "fastest")
    assert given.limits.max_hours == 3.0 and given.limits.budget_usd


def test_pick_in_a_dry_run_and_a_bad_pick(capsys):
    code, out, err = cli(capsys, "launch", "--pick", "best", "--model", "124m", "--provider", "runpod", "--dry-run",
                         "--json")
    assert code == 0, err
    shown = json.loads(out[out.index("{"):])
    assert "--pick best" in err + out and shown
    code, out, err = cli(capsys, "launch", "--pick", "dearest", "--provider", "runpod", "--dry-run")
    assert code == 2 and "--pick takes cheapest, fastest or best" in err
