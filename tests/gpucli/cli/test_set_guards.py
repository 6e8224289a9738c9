"""`--set` reaches the trainer's run.yaml, but never its caps: `--set limits.budget_usd=1000 --budget 1`
would have run under a $1000 cap. And `--set training.learning_rate=3e-4` is the number it reads as."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("key", ["limits.budget_usd=1000", "limits.max_hours=99", "limits.price_per_hour_usd=0.01"])
def test_a_cap_cannot_be_set_around_budget_and_hours(run, key):
    code, out, err = run("launch", "--provider", "local", "--profile", "cpu", "--phase", "fast", "--dry-run",
                         "--budget", "1", "--price", "0.5", "--set", key)
    assert code != 0 and out == ""
    assert "caps and price are gpucli's to set" in err and "--budget" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_learning_rate_with_an_exponent_reaches_run_yaml_as_a_number(run):
    code, out, err = run("launch", "--provider", "local", "--profile", "cpu", "--phase", "fast", "--dry-run",
                         "--json", "--set", "training.learning_rate=3e-4")
    assert code == 0, err
    assert json.loads(out)["run_yaml"]["training"]["learning_rate"] == pytest.approx(3e-4)
