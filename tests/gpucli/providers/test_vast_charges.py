"""Reading vast.ai's charges (``GET /api/v0/charges/``, vast-ai/docs show_charges.yaml): the instance's
row, its bandwidth items, and answers that are not the documented shape never read as $0."""

from __future__ import annotations

import json

import pytest

from gpucli.errors import ProviderError
from gpucli.providers.api import Billed
from gpucli.providers.clients import get_provider
from gpucli.providers.http import RetryPolicy
from gpucli.providers.query import parse_query
from gpucli.providers.vast.bill import billed_in, charges_params
from tests.gpucli.providers.test_clients import spec_for

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)
ROW = {"source": "instance-7", "amount": 1.5, "items": [{"type": "gpu", "amount": 1.0}, {"type": "bwd", "amount": 0.3},
                                                       {"type": "bwu", "amount": 0.2}, {"type": "disk", "amount": 0.0}]}


def test_billed_in_reads_the_row_of_the_instance():
    assert billed_in({"results": [dict(ROW, source="instance-8"), ROW]}, "7") == (Billed(1.5, 0.5), None)
    assert billed_in({"results": [dict(ROW, source="instance-8")], "next_token": "t"}, "7") == (None, "t")


@pytest.mark.parametrize("body", [None, [], {"results": None}, {"results": [dict(ROW, amount="1.5")]},
                                  {"results": [dict(ROW, amount=float("nan"))]}, {"results": [dict(ROW, amount=-1)]}])
def test_odd_answers_are_no_bill(body):
    assert billed_in(body, "7")[0] is None


def test_the_query_carries_the_required_day_range():
    params = charges_params(1_700_000_000)
    day = json.loads(params["select_filters"])["day"]
    assert day["gte"] <= 1_700_000_000 <= day["lte"]


def test_vast_billed_against_the_emulator(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    inst = vp.create(spec_for(vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=1"))[0], client_key[1]))
    billed = vp.billed(inst.instance_id, vast_emulator.pods[inst.instance_id].created_at)
    assert billed is not None and billed.bandwidth_usd == 0.0 and billed.total_usd >= 0.0
    vast_emulator.faults.add("server_error", "charges", times=5)
    with pytest.raises(ProviderError):
        vp.billed(inst.instance_id, 0)
    vp.terminate(inst.instance_id)
