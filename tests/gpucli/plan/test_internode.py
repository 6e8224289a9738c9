"""The inter-node link per provider and the data-parallel model across nodes (gpucli/plan/internode.py)."""

from __future__ import annotations

import json

import pytest

from gpucli.plan.internode import comm_seconds, link_for, node_efficiency
from gpucli.providers.registry import get_target


def declared(provider: str, link_gbps: float | None = None):  # noqa: ANN201
    """The link a provider's target declares (its caps), as a launch on it plans with."""
    return link_for(get_target(provider).caps.link(), link_gbps)


def test_links_say_where_they_come_from():
    assert declared("runpod").gbps == 1600 and "instant-clusters" in declared("runpod").source
    assert declared("vast").gbps is None and "overlay" in declared("vast").source
    assert declared("ssh").gbps is None and "--link-gbps" in declared("ssh").source
    assert declared("ssh").probed and "measured at launch" in declared("ssh").source
    assert not declared("ssh", 100).probed and not declared("local").probed
    assert declared("ssh", 100).gbps == 100 and declared("ssh", 100).source == "--link-gbps"


def test_ring_all_reduce_traffic_and_efficiency():
    link = declared("ssh", 100)
    # 1e9 params, bf16 grads (2 GB), 2 nodes: 2 x 1/2 x 2 GB = 2 GB = 16 Gbit over 70 Gbit/s
    assert comm_seconds(1e9, 2, link) == pytest.approx(16 / 70)
    assert comm_seconds(1e9, 2, link, sharded=True) == pytest.approx(32 / 70)
    assert comm_seconds(1e9, 1, link) == 0.0 and comm_seconds(1e9, 2, declared("vast")) is None
    # a step of 1M tokens at 1M tokens/s per node: 0.5 s of compute each against 0.229 s of traffic
    eff = node_efficiency(1e9, 1e6, 1e6, 2, link)
    assert eff == pytest.approx(0.5 / (0.5 + 16 / 70))
    assert node_efficiency(1e9, 1e6, 1e6, 2, declared("runpod")) > eff  # a faster link costs less


def test_plan_puts_multi_node_setups_on_the_front(capsys):
    from tests.support.cli import cli

    code, out, err = cli(capsys, "plan", "--model", "1b", "--gpu", "h100", "--max-nodes", "2", "--json")
    assert code == 0, err
    plan = json.loads(out)
    labels = [e["setup"] for e in plan["front"]]
    assert any(label.startswith("2 nodes x 8x") for label in labels), labels
    two = next(e for e in plan["front"] if e["setup"].startswith("2 nodes"))
    one = next(e for e in plan["front"] + plan["dominated"] if e["setup"] == "8x H100 SXM")
    assert "nodes at" in two["speed_source"] and two["n_gpus"] == 16
    assert two["hours"] < one["hours"] and two["usd_per_hour"] == 2 * one["usd_per_hour"]
