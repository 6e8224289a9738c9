"""monitor.summarize for a job gpucli does not know: exit codes, nanochat's bpb, and a projection without steps."""

from __future__ import annotations

import datetime as dt

from gpucli.run.watch.monitor import summarize
from gpucli.runs.limits import Limits
from gpucli.runs.records import RunRecord

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)


def record(**limits) -> RunRecord:
    return RunRecord(name="r", provider="runpod", created_at="2026-01-01T11:00:00+00:00", profile="h100",
                     phase="own-code", model="own-code", n_gpus=1, gpu="h100", workdir="w", status="running",
                     started_at="2026-01-01T11:00:00+00:00", limits=Limits(price_per_hour_usd=2.0, **limits))


def test_failed_reasons_are_failed_with_their_tail():
    for reason in ("failed (exit 1)", "setup failed (exit 4)", "failed (signal 9)"):
        rows = [{"kind": "train", "step": 1, "loss": 2.0},
                {"kind": "event", "event": "finished", "reason": reason, "log_tail": ["a", "boom"]}]
        st = summarize(record(), rows, alive=False, now=NOW)
        assert st.state == "failed" and st.finished_reason == reason and st.log_tail == ("a", "boom")
    rows = [{"kind": "event", "event": "finished", "reason": "exit 0"}]
    assert summarize(record(), rows, alive=False, now=NOW).state == "finished"
    rows = [{"kind": "event", "event": "finished", "reason": "signal"}]
    assert summarize(record(), rows, alive=False, now=NOW).state == "finished"


def test_val_bpb_where_no_val_loss():
    rows = [{"kind": "val", "step": 5, "val_bpb": 1.1}, {"kind": "val", "step": 10, "val_bpb": 0.8},
            {"kind": "val", "step": 15, "val_bpb": 0.9}]
    st = summarize(record(), rows, alive=True, now=NOW)
    assert st.val_loss == 0.9 and st.best_val_loss == 0.8 and st.step == 15


def test_projected_total_is_the_nearest_cap_without_a_step_count():
    # an hour at $2/h so far; caps: $5 budget, 4 h (= $8)
    st = summarize(record(budget_usd=5.0, max_hours=4.0), [], alive=True, now=NOW)
    assert abs(st.cost_usd - 2.0) < 1e-9 and abs(st.projected_cost_usd - 5.0) < 1e-9
    assert summarize(record(), [], alive=True, now=NOW).projected_cost_usd is None  # no cap: unknown


def test_a_run_its_cap_or_a_person_stopped_did_not_finish():
    for reason in ("stopped by cap: max_hours 0.005 h at 18 s", "stopped by you", "max_hours", "max_cost"):
        rows = [{"kind": "train", "step": 3, "loss": 2.0}, {"kind": "val", "step": 2, "val_loss": 1.5},
                {"kind": "event", "event": "finished", "reason": reason}]
        st = summarize(record(), rows, alive=False, now=NOW)
        assert st.state == "stopped" and st.finished_reason == reason, reason
        assert (st.step, st.best_val_loss, st.best_val_step) == (3, 1.5, 2)
    for reason in ("exit 0", "max_steps", "early_stop"):
        rows = [{"kind": "event", "event": "finished", "reason": reason}]
        assert summarize(record(), rows, alive=False, now=NOW).state == "finished", reason
