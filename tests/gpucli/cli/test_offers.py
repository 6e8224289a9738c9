"""`gpucli offers` against the RunPod and vast.ai emulators."""

import json
import os
import subprocess
import sys
from pathlib import Path

from gpucli.plan.catalog import load_catalog
from gpucli.providers.api import Offer
from gpucli.providers.offers import describe_offers, match_gpu, offers_to_setups

ROOT = Path(__file__).resolve().parents[3]


def offers_json(run, *args):
    code, out, err = run("offers", "--json", *args)
    assert code == 0, err
    return json.loads(out)["offers"], err


def test_table_merges_both_providers(run, runpod_emulator, vast_emulator):
    code, out, err = run("offers")
    assert code == 0, err
    assert "vast" in out and "runpod" in out
    # catalogue names, VRAM, prices per GPU and machine, spot floor, reliability, inet, location, speed
    for text in ("RTX 3090", "H100 SXM", "A100 PCIe 80GB", "24 GB", "$/GPU/h", "spot $/GPU/h", "99.9%",
                 "5,000 Mb/s", "Virginia, US", "TFLOP/s", "7,916"):
        assert text in out, text
    assert err == ""


def test_json_is_sorted_and_complete(run, runpod_emulator, vast_emulator):
    rows, _ = offers_json(run)
    assert {r["provider"] for r in rows} == {"vast", "runpod"}
    prices = [r["price_per_hour_usd"] for r in rows]
    assert prices == sorted(prices)  # dph_total ascending across both providers
    h100 = next(r for r in rows if r["offer_id"] == "1007")
    assert h100["gpu"] == "h100-sxm" and h100["gpu_count"] == 8
    assert h100["price_per_gpu_hour_usd"] == 2.0 and h100["spot_price_per_hour_usd"] == 9.0
    assert h100["bf16_tflops"] == 8 * load_catalog().gpus["h100-sxm"].bf16_dense_tflops
    assert h100["tflops_per_usd_hour"] == h100["bf16_tflops"] / 16.0
    # RunPod offers are per cloud and pinned to a data centre with the count in stock (REST v2 catalog)
    rp = next(r for r in rows if r["offer_id"].startswith("NVIDIA GeForce RTX 4090|2|COMMUNITY|"))
    assert rp["gpu"] == "rtx4090" and rp["stock"] == "HIGH"
    assert 0.68 < rp["price_per_hour_usd"] < 0.70  # 2 x $0.34 plus the container and volume disks
    # out of stock (A4000) and unverified (1008, the default filter) never show up
    assert not any("A4000" in r["gpu_name"] for r in rows)
    assert "1008" not in {r["offer_id"] for r in rows}


def test_query_filters_both_sides(run, runpod_emulator, vast_emulator):
    rows, err = offers_json(run, "gpu_name=RTX_4090 num_gpus>=2")
    assert rows and err == ""
    assert all(r["gpu"] == "rtx4090" and r["gpu_count"] >= 2 for r in rows)
    assert {r["provider"] for r in rows} == {"vast", "runpod"}
    # sent server-side to vast exactly as the vastai CLI would
    body = vast_emulator.search_bodies[-1]
    assert body["gpu_name"] == {"eq": "RTX 4090"} and body["num_gpus"] == {"gte": "2"}
    assert body["verified"] == {"eq": True}
    # vast-only fields filter vast offers; RunPod offers do not report them and are kept
    rows, _ = offers_json(run, "inet_down>=1000", "--provider", "vast")
    assert {r["offer_id"] for r in rows} == {"1004", "1006", "1007"}
    # ... and the user is told which part of the query RunPod's offers could not be filtered by
    rows, err = offers_json(run, "inet_down>=1000 num_gpus=1")
    assert {r["offer_id"] for r in rows if r["provider"] == "vast"} == {"1006"}
    assert {r["gpu_count"] for r in rows} == {1} and any(r["provider"] == "runpod" for r in rows)
    assert "runpod does not report inet_down" in err and "num_gpus" not in err


def test_order_and_limit(run, runpod_emulator, vast_emulator):
    rows, _ = offers_json(run, "--order", "dlperf_usd-", "--provider", "vast", "--limit", "3")
    assert len(rows) == 3
    # dlperf per $/h: 1010 56/0.78 = 71.8, 1002 15/0.21 = 71.4, 1004 170/2.40 = 70.8 (1008 is unverified)
    assert [r["offer_id"] for r in rows] == ["1010", "1002", "1004"]
    assert vast_emulator.search_bodies[-1]["order"] == [["dlperf_per_dphtotal", "desc"]]
    rows, _ = offers_json(run, "--limit", "4")
    assert len(rows) == 4


def test_spot_shows_the_floor(run, runpod_emulator, vast_emulator):
    code, out, _ = run("offers", "--spot", "gpu_name=RTX_3090", "--provider", "vast")
    assert code == 0
    assert "Live spot offers" in out and "$0.10" in out  # 1002's min bid 0.10 per GPU-hour
    assert vast_emulator.search_bodies[-1]["type"] == "bid"
    rows, err = offers_json(run, "--spot")
    floors = [r["spot_price_per_hour_usd"] for r in rows]
    assert all(f is not None for f in floors) and floors == sorted(floors)  # min_bid ascending
    # RunPod has no spot pods any more (runpodctl PR #267): skipped, with the pointer to vast bids
    assert {r["provider"] for r in rows} == {"vast"} and "--provider vast --spot" in " ".join(err.split())


def test_provider_without_key_is_skipped_with_a_warning(run, runpod_emulator, vast_emulator, monkeypatch):
    monkeypatch.delenv("RUNPOD_API_KEY")
    code, out, err = run("offers")
    assert code == 0
    assert "runpod" not in out and "vast" in out
    assert "Warning" in err and "skipping runpod" in err and "gpucli keys set runpod" in err
    assert len(err.strip().splitlines()) == 1
    assert not runpod_emulator.requests  # never even called


def test_named_provider_without_key_is_an_error(run, vast_emulator, monkeypatch):
    code, out, err = run("offers", "--provider", "runpod")
    assert code == 4 and out == ""
    assert err.startswith("Error: No RunPod key") and "RUNPOD_API_KEY" in err
    assert len(err.strip().splitlines()) == 1


def test_no_keys_at_all_is_an_error(run):
    code, _, err = run("offers")
    assert code == 4 and "no API key" in err and "gpucli keys set" in err and "Traceback" not in err


def test_rate_limit_is_retried_transparently(run, runpod_emulator, vast_emulator):
    vast_emulator.faults.add("rate_limit", endpoint="search", times=2)
    runpod_emulator.faults.add("rate_limit", endpoint="search", retry_after="0", plain_text=False)
    rows, err = offers_json(run)
    assert {r["provider"] for r in rows} == {"vast", "runpod"}
    assert err == ""
    assert len(vast_emulator.search_bodies) == 1  # the two 429s never reached the search
    assert sum(1 for m, p, _ in vast_emulator.requests if p == "/api/v0/bundles/") == 3


def test_bad_input_is_one_line(run, vast_emulator):
    for args, needle in ((["gpu_nme=RTX_3090"], "unknown query field 'gpu_nme'"),
                         (["--order", "price"], "unknown sort field 'price'"),
                         (["--provider", "aws"], "unknown provider 'aws'"),
                         (["num_gpus>=4 oops"], "unknown operator none after 'oops'"),
                         (["--limit", "0"], "--limit must be at least 1")):
        code, out, err = run("offers", *args)
        assert code == 2, (args, err)
        assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_keys_never_reach_the_output(run, runpod_emulator, vast_emulator):
    code, out, err = run("offers", "--json")
    assert code == 0
    for key in (runpod_emulator.api_key, vast_emulator.api_key):
        assert key not in out and key not in err


def test_real_process(runpod_emulator, vast_emulator, tmp_path):
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "offers", "num_gpus=8"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1007" in proc.stdout and "NVIDIA H100 80GB HBM3|8" in proc.stdout and "1005" in proc.stdout
    assert "1001" not in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "offers", "--provider", "runpod"], cwd=ROOT,
                          env=dict(env, RUNPOD_API_KEY="wrong-key"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr and "wrong-key" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- the pure mapping ---------------------------------------------------------------------------------
def test_match_gpu_names():
    cat = load_catalog()
    assert match_gpu(cat, "runpod", "NVIDIA GeForce RTX 4090").id == "rtx4090"
    assert match_gpu(cat, "runpod", "NVIDIA H100 80GB HBM3").id == "h100-sxm"
    assert match_gpu(cat, "vast", "RTX_3090").id == "rtx3090"
    assert match_gpu(cat, "vast", "rtx 4000ada").id == "rtx4000-ada"
    assert match_gpu(cat, "vast", "H100 SXM").id == "h100-sxm"
    assert match_gpu(cat, "vast", "NVIDIA h100_sxm").id == "h100-sxm"
    assert match_gpu(cat, "runpod", "RTX 4090").id == "rtx4090"  # a display name, via the catalogue name
    assert match_gpu(cat, "vast", "a100-80").id == "a100-sxm-80"  # an alias
    # vast says "A100 PCIE" for both cards: VRAM decides, and a size we do not know is no match
    assert match_gpu(cat, "vast", "A100 PCIE", vram_gb=40).id == "a100-40"
    assert match_gpu(cat, "vast", "A100 PCIE", vram_gb=79.6).id == "a100-pcie-80"
    assert match_gpu(cat, "vast", "A100 SXM4", vram_gb=40) is None
    assert match_gpu(cat, "vast", "GTX 1080") is None
    assert match_gpu(cat, "vast", "") is None


def _offer(provider, oid, gpu, n, price, bid=None, vram=24.0):
    return Offer(provider=provider, offer_id=oid, gpu_name=gpu, gpu_count=n, vram_gb_per_gpu=vram,
                 price_per_hour_usd=price, price_per_gpu_hour_usd=price / n,
                 spot_price_per_hour_usd=bid)


def test_offers_to_setups():
    cat = load_catalog()
    offers = [_offer("vast", "1", "RTX 3090", 4, 0.88, bid=0.4), _offer("runpod", "X|2", "NVIDIA GeForce RTX 4090", 2, 0.68),
              _offer("vast", "2", "GTX 1080", 1, 0.05, bid=0.02), _offer("vast", "3", "H100 SXM", 8, 16.0, vram=80)]
    setups = offers_to_setups(cat, offers, spot=False)
    assert [(s.gpu.id, s.n_gpus) for s in setups] == [("rtx3090", 4), ("rtx4090", 2), ("h100-sxm", 8)]
    first = setups[0].price
    assert first.offer_id == "1" and first.provider == "vast" and first.kind == "on-demand"
    assert first.source == "live vast offer 1" and not first.stale and first.age_text == "live"
    assert abs(first.usd_per_gpu_hour - 0.22) < 1e-12 and abs(setups[0].usd_per_hour - 0.88) < 1e-12
    spot = offers_to_setups(cat, offers, spot=True)
    assert [s.price.offer_id for s in spot] == ["1"]  # only offers with a floor
    assert spot[0].price.kind == "spot" and abs(spot[0].price.usd_per_gpu_hour - 0.1) < 1e-12
    assert [s.n_gpus for s in offers_to_setups(cat, offers, spot=False, max_gpus=4)] == [4, 2]
    assert [s.gpu.id for s in offers_to_setups(cat, offers, spot=False, gpu_ids={"h100-sxm"})] == ["h100-sxm"]
    views = describe_offers(cat, offers, spot=False)
    assert views[2].gpu is None and views[2].bf16_tflops is None and views[2].tflops_per_usd_hour is None
