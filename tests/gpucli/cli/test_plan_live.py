"""`gpucli plan --live`: the planner on emulator offers; every front member names its offer."""

import json

from gpucli.plan.planner import dominates


def plan_json(run, *args):
    code, out, err = run("plan", "--model", "124m", "--live", "--json", *args)
    assert code == 0, err
    return json.loads(out), err


def test_front_members_carry_offer_ids(run, runpod_emulator, vast_emulator):
    data, _ = plan_json(run)
    assert data["front"]
    vast_ids = {str(o["id"]) for o in vast_emulator.offers}
    for member in data["front"]:
        price = member["price"]
        assert price["offer_id"] and price["as_of"] == "live" and not price["stale"]
        assert price["source"] == f"live {price['provider']} offer {price['offer_id']}"
        if price["provider"] == "vast":
            assert price["offer_id"] in vast_ids
        else:
            assert price["offer_id"].endswith(f"|{member['n_gpus']}")
        assert abs(member["usd_per_hour"] - price["usd_per_gpu_hour"] * member["n_gpus"]) < 1e-9
    everything = data["front"] + data["dominated"]
    assert {e["price"]["provider"] for e in everything} == {"vast", "runpod"}
    assert all(e["price"]["offer_id"] for e in everything)
    points = [(e["hours"], e["cost_usd"]) for e in everything]
    for m in data["front"]:  # the front is the front of the live setups
        assert not any(dominates(p, (m["hours"], m["cost_usd"])) for p in points)


def test_front_uses_the_cheapest_live_price(run, runpod_emulator, vast_emulator):
    # the 8x H100 on vast (1007, $2.00/GPU-h) beats RunPod's 8x H100 ($2.69): same speed, cheaper
    data, _ = plan_json(run, "--gpu", "h100")
    h100x8 = [e for e in data["front"] if e["n_gpus"] == 8]
    assert [e["price"]["offer_id"] for e in h100x8] == ["1007"]
    assert all(e["gpu"] == "h100-sxm" for e in data["front"] + data["dominated"])


def test_query_spot_and_provider(run, runpod_emulator, vast_emulator):
    data, _ = plan_json(run, "--query", "num_gpus>=4", "--spot", "--provider", "vast")
    everything = data["front"] + data["dominated"]
    assert everything and all(e["n_gpus"] >= 4 and e["price"]["kind"] == "spot" for e in everything)
    assert {e["price"]["provider"] for e in everything} == {"vast"}
    assert vast_emulator.search_bodies[-1]["type"] == "bid" and not runpod_emulator.requests
    one = next(e for e in everything if e["price"]["offer_id"] == "1001")
    assert abs(one["price"]["usd_per_gpu_hour"] - 0.10) < 1e-12  # 1001's min bid 0.40 / 4 GPUs


def test_table_says_live_offer_and_id(run, runpod_emulator, vast_emulator):
    code, out, err = run("plan", "--model", "124m", "--live", "--no-chart")
    assert code == 0, err
    assert "live on-demand offer prices" in out
    assert "live vast offer 1007" in out  # 8x H100 is the fastest member


def test_live_errors(run, runpod_emulator, vast_emulator):
    code, _, err = run("plan", "--model", "124m", "--query", "num_gpus=8")
    assert code == 2 and "only apply with --live" in err
    code, _, err = run("plan", "--model", "124m", "--live", "--price", "1")
    assert code == 2 and "--price and --live" in err
    code, _, err = run("plan", "--model", "124m", "--live", "--gpu", "b200")
    assert code == 6 and "live offers" in err and len(err.strip().splitlines()) == 1


def test_live_skips_a_provider_without_key(run, runpod_emulator, vast_emulator, monkeypatch):
    monkeypatch.delenv("VAST_API_KEY")
    data, err = plan_json(run)
    assert "skipping vast" in err
    assert {e["price"]["provider"] for e in data["front"] + data["dominated"]} == {"runpod"}
