"""A link measured at launch (gpucli/run/host/linkprobe.py) feeds the plan of a run over several machines
and is kept, typed, in the run record."""

from __future__ import annotations

import pytest

from gpucli.plan.catalog import load_catalog
from gpucli.plan.internode import Link, node_efficiency
from gpucli.run.host.nodes import planned_across
from gpucli.runs import records as runs
from gpucli.runs.records import LinkPair, LinkProbe, PlannedSpeed


def test_the_measured_slowest_pair_sets_the_data_parallel_efficiency():
    model = load_catalog().models["124m"]
    one = PlannedSpeed(tokens_per_s=1e6, hours=1.0, cost_usd=10.0, source="one machine")
    unknown = planned_across(one, model, 2, "ssh", None, 5e5, 20.0)
    assert unknown.tokens_per_s is None and "measured at launch" in (unknown.source or "")
    slow = planned_across(one, model, 2, "ssh", None, 5e5, 20.0, link=Link(1.0, "measured at launch"))
    fast = planned_across(one, model, 2, "ssh", None, 5e5, 20.0, link=Link(100.0, "measured at launch"))
    eff = node_efficiency(model.num_params(), 1e6, 1e6, 2, Link(1.0, "m"))
    assert eff is not None and slow.tokens_per_s == pytest.approx(2e6 * eff)
    assert slow.tokens_per_s < fast.tokens_per_s <= 2e6 and "over 1 Gbps" in (slow.source or "")


def test_the_link_is_kept_typed_in_the_record():
    link = LinkProbe(gbps=2.5, pairs=(LinkPair(rank=1, gbps=2.5, bytes=64 << 20, seconds=0.2147),
                                      LinkPair(rank=2, gbps=9.1, bytes=64 << 20, seconds=0.059)), source="measured")
    record = runs.RunRecord(name="linked", provider="ssh", created_at=runs.now_iso(), profile="cpu", phase="fast",
                            model="tiny", n_gpus=1, gpu=None, workdir="/tmp/x", link=link)
    runs.save(record)
    assert runs.load("linked").link == link
    runs.save(record.with_(name="plain", link=None))
    assert "link" not in (runs.runs_dir() / "plain.json").read_text()  # one-machine records stay as they were
