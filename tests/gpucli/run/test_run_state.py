"""A run's state is a RunState with its transitions in one table (gpucli/runs/records.py), checked when a
record is saved: a run that has ended is never shown running again without a new launch on it, and a
record on disk with a state no gpucli wrote is refused in one line."""

from __future__ import annotations

import json

import pytest

from gpucli.errors import GpucliError
from gpucli.runs import records as runs
from gpucli.runs.records import TRANSITIONS, BadTransition, RunRecord, RunState, check_transition

OLD = {"name": "r", "provider": "local", "created_at": "2026-11-20T10:00:00+00:00", "profile": "cpu",
       "phase": "fast", "model": "tiny", "n_gpus": 1, "gpu": None, "workdir": "/tmp/x", "status": "running"}


def record(status: str = "provisioning") -> RunRecord:
    return RunRecord(name="r", provider="local", created_at="2026-11-20T10:00:00+00:00", profile="cpu",
                     phase="fast", model="tiny", n_gpus=1, gpu=None, workdir="/tmp/x", status=RunState(status))


def test_a_record_written_as_strings_reads_as_a_state_and_shows_as_before():
    (runs.runs_dir() / "r.json").write_text(json.dumps(OLD))
    rec = runs.load("r")
    assert rec.status is RunState.RUNNING and rec.status == "running" and rec.active
    assert f"{rec.status}" == "running" and str(rec.status) == "running"
    assert {"running": "green"}[rec.status] == "green"  # tables keyed by the plain words still find it
    runs.save(rec.with_(status="finished"))  # a plain word from older callers is taken as its state
    assert json.loads((runs.runs_dir() / "r.json").read_text())["status"] == "finished"
    assert runs.load("r").status is RunState.FINISHED


def test_the_life_of_a_run_saves_and_an_ended_run_does_not_come_back_running():
    for state in ("provisioning", "starting", "running", "finished"):
        runs.save(record(state))
    with pytest.raises(BadTransition, match="a finished run cannot become running"):
        runs.save(record("running"))
    assert runs.load("r").status is RunState.FINISHED  # the refused save wrote nothing
    runs.save(record("provisioning"))  # resume: a new launch on the run
    runs.save(record("running"))
    runs.save(record("terminate pending"))
    runs.save(record("stopped"))


@pytest.mark.parametrize("old", list(RunState))
def test_every_state_may_be_saved_again_and_the_table_names_only_states(old):
    assert check_transition(old, old) is old
    assert all(isinstance(s, RunState) for s in TRANSITIONS[old])


def test_an_unknown_state_is_refused_when_saved_and_when_read():
    with pytest.raises(BadTransition, match="not a run state"):
        check_transition(None, "paused")
    (runs.runs_dir() / "r.json").write_text(json.dumps({**OLD, "status": "paused"}))
    with pytest.raises(GpucliError) as err:
        runs.load("r")
    assert "not a run state" in str(err.value) and "\n" not in str(err.value)


def test_a_corrupt_record_on_disk_is_replaced_whole_by_a_save():
    (runs.runs_dir() / "r.json").write_text("{not json")
    runs.save(record("failed"))
    assert runs.load("r").status is RunState.FAILED
