"""The avoid list (gpucli/run/host/avoid.py): hosts that failed their health check, skipped for a week."""

from __future__ import annotations

import json

from gpucli.providers.api import Offer
from gpucli.run.host import avoid


def offer(provider: str, offer_id: str, machine_id: str | None = None) -> Offer:
    return Offer(provider=provider, offer_id=offer_id, gpu_name="RTX 4090", gpu_count=1, vram_gb_per_gpu=24,
                 price_per_hour_usd=0.5, price_per_gpu_hour_usd=0.5, machine_id=machine_id)


def test_host_keys_per_provider():
    assert avoid.host_key(offer("vast", "1011", machine_id="311")) == "vast:311"
    assert avoid.host_key(offer("runpod", "NVIDIA GeForce RTX 4090|1|SECURE|EU-RO-1")) == \
        "runpod:NVIDIA GeForce RTX 4090|SECURE|EU-RO-1"  # the count is not the host
    assert avoid.host_key(offer("runpod", "odd")) is None


def test_entries_expire_after_a_week_and_the_file_is_whole():
    now = 1_000_000.0
    avoid.add("vast:311", "matmul at 12% of peak", now=now)
    avoid.add("vast:312", "3 uncorrected ECC errors", now=now)
    assert set(avoid.load(now + 6 * 86400)) == {"vast:311", "vast:312"}
    assert avoid.avoided(offer("vast", "1", machine_id="311"), avoid.load(now + 1)).why == "matmul at 12% of peak"
    assert avoid.load(now + avoid.WEEK_S + 1) == {}
    data = json.loads(avoid._path().read_text())
    assert data["vast:311"]["until"] == now + avoid.WEEK_S
    assert not list(avoid._path().parent.glob(".avoid.json.*"))  # no temporary file left


def test_a_damaged_file_reads_as_empty():
    avoid._path().parent.mkdir(parents=True, exist_ok=True)
    avoid._path().write_text("{not json")
    assert avoid.load() == {}
    avoid.add("vast:9", "disk 20 MB/s")  # and is replaced whole
    assert set(avoid.load()) == {"vast:9"}
