"""Run records and launch inputs written by older versions still load, into today's one names:
the endpoint is gpucli.ssh.SshTarget, the machine's price and the stall limit live in Limits."""

from __future__ import annotations

import json

import pytest

from gpucli.run.inputs.launch import LaunchRequest
from gpucli.runs import records as runs
from gpucli.runs.limits import Limits
from gpucli.ssh import SshTarget

OLD_RECORD = {
    "name": "old-run", "provider": "ssh", "created_at": "2026-11-20T10:00:00+00:00", "profile": "cpu",
    "phase": "fast", "model": "tiny", "n_gpus": 1, "gpu": None, "workdir": "gpucli-runs/old-run",
    "status": "stopped", "price_per_hour_usd": 1.5,
    "ssh": {"host": "10.0.0.5", "port": 2222, "user": "me", "host_key": "ssh-ed25519 AAAA", "identity_file": None},
    "limits": {"max_steps": 300, "max_hours": 2.0, "budget_usd": 3.0},
    "launch": {"request": {"profile": "cpu", "phase": "fast", "provider": "ssh", "model": "tiny", "data": None,
                           "hours": 2.0, "budget_usd": 3.0, "steps": 300, "name": "old-run", "host": "me@10.0.0.5:2222",
                           "identity": None, "price_per_hour_usd": 1.5, "spot": False, "bid_per_gpu_usd": None,
                           "val_interval": None, "checkpoint_interval": None, "extra": ["--training.seq_len=64"],
                           "workdir": None, "stall_minutes": 12.0, "on_end": "stop"},
               "python": "python3.11", "image": None, "disk": 80, "ready_timeout": 300,
               "ssh": {"host": "10.0.0.5", "port": 2222, "user": "me", "identity_file": None}},
}


def test_an_old_record_loads_into_the_new_names():
    (runs.runs_dir() / "old-run.json").write_text(json.dumps(OLD_RECORD))
    record = runs.load("old-run")
    assert record.ssh == SshTarget(host="10.0.0.5", port=2222, user="me", host_key="ssh-ed25519 AAAA")
    assert record.limits == Limits(max_steps=300, max_hours=2.0, budget_usd=3.0, price_per_hour_usd=1.5)
    assert record.price_per_hour_usd == 1.5
    runs.save(record)  # and writes back in the new shape, which loads the same
    saved = json.loads((runs.runs_dir() / "old-run.json").read_text())
    assert "price_per_hour_usd" not in saved and saved["limits"]["price_per_hour_usd"] == 1.5
    assert runs.load("old-run") == record


def test_old_launch_inputs_resolve_to_the_same_request():
    req = LaunchRequest.from_json(OLD_RECORD["launch"])
    assert req.limits == Limits(max_steps=300, max_hours=2.0, budget_usd=3.0, price_per_hour_usd=1.5,
                                stall_minutes=12.0)
    assert (req.python, req.disk_gb, req.ready_timeout_s, req.extra) == ("python3.11", 80, 300, ("--training.seq_len=64",))
    assert LaunchRequest.from_json(req.to_json()) == req


def test_remaining_limits_after_time_spent():
    lim = Limits(max_steps=100, max_hours=2.0, budget_usd=10.0, price_per_hour_usd=4.0, stall_minutes=30)
    left = lim.remaining(0.5)
    assert (left.max_hours, left.budget_usd, left.max_steps, left.stall_minutes) == (1.5, 8.0, 100, 30)
    spent = lim.remaining(5.0)  # used up: still positive, so the trainer stops at once instead of refusing
    assert 0 < spent.max_hours < 1e-3 and 0 < spent.budget_usd < 1e-3
    assert lim.run_yaml() == {"max_hours": 2.0, "budget_usd": 10.0, "price_per_hour_usd": 4.0}
    assert lim.watchdog_args() == ["--stall-minutes", "30", "--max-hours", "2", "--budget-usd", "10",
                                   "--price-per-hour-usd", "4"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, -2.0])
def test_limits_refuse_what_is_not_a_positive_number(bad):
    from gpucli.errors import UsageError

    with pytest.raises(UsageError, match="--hours must be a positive number"):
        Limits(max_hours=bad).checked()
