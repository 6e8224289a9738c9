"""A vast rental lasts as long as the run (issue 41 point 4), against the vast emulator.

"Every offer has a maximum rental duration ... When the rental end date is reached, the rental contract
expires and the instance is stopped" (vast-ai/docs guides/reference/faq/instances.mdx L13); "Expired
instances may be deleted 48 hours after expiration" (instance-types.mdx L49). The search's ``duration``
is "Minimum required rental duration in seconds" (search_offers.yaml L104-106). A price increase on a
live contract is accepted per contract (vast-cli vastai/api/price_increase.py): gpucli shows it and
never accepts it.
"""

from __future__ import annotations

import json
import time

from gpucli.plan.catalog import load_catalog
from gpucli.providers.registry import get_target
from gpucli.providers.vast.target import rental_hours
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, launch
from tests.support.cli import cli


def test_offers_without_enough_rental_time_are_never_taken(request):
    emu = emulator_for(request, "vast")
    target, catalog = get_target("vast"), load_catalog()
    short = next(o for o in emu.offers if o["id"] == 1011)
    short["duration"] = 10 * 3600.0  # the cheapest verified 1x RTX 4090: ten hours left on its listing
    from tests.support.emulators.vast import _offer

    emu.offers.append(_offer(1012, "RTX 4090", 1, 24564, 0.55, 0.25, 0.99, 900.0, "Lyon, FR", 29.0))  # 60 days
    two_days = target.choose_offers(catalog, "rtx4090", 1, spot=False, hours=40)
    assert [o.offer_id for o in two_days] == ["1012"]
    asked = emu.search_bodies[-1]["duration"]
    assert asked == {"gte": rental_hours(40) * 3600.0} and rental_hours(40) >= 60  # 40 h x 1.5 in seconds
    an_hour = target.choose_offers(catalog, "rtx4090", 1, spot=False, hours=1)
    assert an_hour[0].offer_id == "1011"  # ten hours outlast a one-hour run with its margin
    target.choose_offers(catalog, "rtx4090", 1, spot=False)  # no planned length: a day at least
    assert emu.search_bodies[-1]["duration"] == {"gte": 24 * 3600.0}


def test_status_shows_the_rental_end_and_a_price_increase_never_accepted(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    code, out, err = launch(capsys, tmp_path, "vast", "contract")
    assert code == 0, err
    (created,) = emu.ledger.created()
    emu.price_increases.append({"pending_price_increase_id": 7, "contract_id": int(created.pod_id), "host_id": 1,
                                "old_gpu_costpersec": 0.45 / 3600, "new_gpu_costpersec": 0.60 / 3600,
                                "contract_end_date": time.time() + 3600, "created_at": time.time()})
    code, out, err = cli(capsys, "status", "contract")
    assert code == 0, err
    text = " ".join(out.split())
    assert "ends" in text and "h left" in text and "delete it 48 h later" in text
    assert "$0.450/h -> $0.600/h" in text and "NOT accepted" in text
    code, out, err = cli(capsys, "status", "contract", "--json")
    assert "NOT accepted" in json.loads(out)["contract_note"]
    assert emu.price_answers == []  # never accepted (nor refused) on the user's behalf
    assert cli(capsys, "down", "contract")[0] == 0
    assert_nothing_running(emu)
