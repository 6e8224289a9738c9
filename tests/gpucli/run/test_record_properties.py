"""Property tests over run records: whatever a record holds, it round-trips through its file, and no
file in the runs folder, however broken, makes `ls` fail."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucli.runs import records as runs
from gpucli.runs.limits import Limits
from gpucli.runs.records import PlannedSpeed, RunRecord
from gpucli.ssh import SshTarget

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
names = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)
text = st.text(max_size=30)
opt_text = st.none() | text
pos = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
opt_pos = st.none() | pos
opt_pid = st.none() | st.integers(min_value=1, max_value=2**31)

records = st.builds(
    RunRecord, name=names, provider=st.sampled_from(["local", "ssh", "runpod", "vast"]), created_at=text,
    profile=text, phase=text, model=text, n_gpus=st.integers(1, 64), gpu=opt_text, workdir=text,
    status=st.sampled_from(["provisioning", "starting", "running", "finished", "failed", "stopped"]),
    instance_id=opt_text, label=opt_text,
    ssh=st.none() | st.builds(SshTarget, host=text, port=st.integers(1, 65535), user=text,
                              identity_file=opt_text, host_key=opt_text),
    pid=opt_pid, watchdog_pid=opt_pid, pid_ident=opt_text, watchdog_ident=opt_text,
    cost_usd=st.none() | st.floats(min_value=0, max_value=1e6),
    limits=st.builds(Limits, max_steps=st.none() | st.integers(1, 10**9), max_hours=opt_pos, budget_usd=opt_pos,
                     price_per_hour_usd=opt_pos, stall_minutes=opt_pos),
    planned=st.builds(PlannedSpeed, tokens_per_s=opt_pos, hours=opt_pos, cost_usd=opt_pos, source=opt_text),
    python=text, started_at=opt_text, ended_at=opt_text, end_reason=opt_text, message=opt_text,
    previous_instances=st.lists(text, max_size=3).map(tuple), step=st.none() | st.integers(0, 10**9),
    loss=st.none() | st.floats(allow_nan=False, allow_infinity=False))


@SETTINGS
@given(records)
def test_a_record_round_trips_through_its_file(rec):
    runs.save(rec)
    assert runs.load(rec.name) == rec
    (runs.runs_dir() / f"{rec.name}.json").unlink()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20)
record_keys = st.sampled_from([f.name for f in __import__("dataclasses").fields(RunRecord)])
broken_records = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    # a real record with one field set to anything at all
    st.tuples(record_keys, json_values).map(lambda kv: json.dumps({
        "name": "b", "provider": "local", "created_at": "2026-01-01T00:00:00+00:00", "profile": "cpu",
        "phase": "fast", "model": "tiny", "n_gpus": 1, "gpu": None, "workdir": "w", kv[0]: kv[1]}).encode()),
)


@SETTINGS
@given(broken_records)
def test_no_file_makes_ls_fail(data):
    path = runs.runs_dir() / "b.json"
    path.write_bytes(data)
    bad: list[str] = []
    got = runs.list_runs(bad.append)
    assert len(got) + len(bad) == 1
    if bad:
        assert "b.json" in bad[0] and "\n" not in bad[0]
    else:
        rec = got[0]  # what loads is usable: the numbers a status does arithmetic with are numbers
        assert rec.pid is None or (isinstance(rec.pid, int) and rec.pid > 0)
        assert rec.cost_usd is None or math.isfinite(rec.cost_usd)
        assert rec.limits.checked() == rec.limits
    path.unlink()
