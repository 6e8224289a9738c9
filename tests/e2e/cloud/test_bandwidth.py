"""Every billed byte counted (issue 41 rule 7): a launch on vast sizes its data from the source (an https
file's Content-Length from a real HTTP server on loopback, an hf:// dataset's files as the Hub emulator lists
them), its store uploads and its mirror pulls, ranks offers on them, shows them with each offer's $/GB, and
reserves them from --budget before the caps are written; RunPod bills no bandwidth."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest

from gpucli.errors import UsageError
from gpucli.run.files.transfer import data_leg, plan_transfer
from gpucli.run.inputs.launch import LaunchRequest
from gpucli.run.life import lifecycle
from gpucli.runs.limits import Limits
from tests.e2e.cloud.test_cloud_launch import emulator_for, launch
from tests.e2e.cloud.test_launch_offers import _prepare
from tests.support.cli import cli
from tests.support.httpserve import LoopbackHttp

BODY = b"the quick brown fox. " * 50_000  # 1.05 MB


class _Files(LoopbackHttp):
    """A real HTTP server on loopback: /sized answers with Content-Length, /chunked without one."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):  # noqa: N802
                self.send_response(200 if self.path in ("/sized", "/chunked") else 404)
                if self.path == "/sized":
                    self.send_header("Content-Length", str(len(BODY)))
                else:
                    self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

        super().__init__(Handler)


def _vast_offers(emu, up: float, down: float) -> None:
    from tests.support.emulators.vast import _offer

    emu.offers[:] = [dict(_offer(3101, "RTX 4090", 1, 24564, 0.40, 0.2, 0.99, 900.0, "Paris, FR", 29.0),
                          inet_up_cost=up, inet_down_cost=down)]


def test_https_data_is_sized_from_content_length_quoted_and_reserved_from_the_budget(request):
    emu = emulator_for(request, "vast")
    _vast_offers(emu, up=0.02, down=0.05)
    with _Files() as files:
        req = LaunchRequest(profile="rtx4090", provider="vast", data=f"{files.url}/sized", disk_gb=80,
                            limits=Limits(max_steps=400, budget_usd=5.0))
        prepared = _prepare(req)
    gb_in = len(BODY) / 1e9
    assert lifecycle.offer_ask(req, prepared.resolved).transfer_gb == (pytest.approx(gb_in, abs=1e-3), 0.0)
    notes = prepared.provision.notes
    leg = next(n for n in notes if "data download" in n)
    assert f"{gb_in:.3f} GB x $0.05/GB" in leg and "Content-Length" in leg, notes
    usd = round(gb_in, 3) * 0.05
    assert any(n.startswith("bandwidth total: 0.001 GB in, 0.000 GB out") for n in notes), notes
    # reserved from --budget: the caps the trainer and the watchdog get stop compute at what is left
    assert prepared.resolved.limits.budget_usd == pytest.approx(5.0 - usd)
    assert prepared.resolved.trainer_config["limits"]["budget_usd"] == pytest.approx(5.0 - usd)
    assert prepared.request.limits.budget_usd == 5.0  # the record keeps --budget as asked (a resume reserves anew)
    assert emu.ledger.created() == []


def test_a_url_without_content_length_is_size_unknown_never_zero(request):
    emu = emulator_for(request, "vast")
    _vast_offers(emu, up=0.02, down=0.05)
    with _Files() as files:
        req = LaunchRequest(profile="rtx4090", provider="vast", data=f"{files.url}/chunked", disk_gb=80,
                            limits=Limits(max_steps=400))
        prepared = _prepare(req)
    leg = next(n for n in prepared.provision.notes if "data download" in n)
    assert "size unknown" in leg and "gave no Content-Length" in leg and "not counted" in leg
    assert "1 leg(s) of unknown size not in it" in prepared.provision.notes[-1]


def test_hf_data_is_sized_from_the_hub_listing_with_its_pattern(monkeypatch):
    from tests.support.emulators.hfhub import HubEmulator, Repo

    with HubEmulator("hf-tok") as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf-tok")
        hub.repos["org/corpus"] = Repo(private=False, files={"train/a.txt": b"x" * 300_000,
                                                             "train/b.txt": b"y" * 200_000,
                                                             "README.md": b"z" * 9_000})
        from gpucli.run.inputs.datasources import parse_data

        data_leg.cache_clear()
        everything = data_leg(parse_data("hf://datasets/org/corpus"))
        train = data_leg(parse_data("hf://datasets/org/corpus/train/*"))
        data_leg.cache_clear()
        monkeypatch.setenv("HF_TOKEN", "wrong")
        refused = data_leg(parse_data("hf://datasets/org/corpus"))
    assert everything.gb == pytest.approx(509_000 / 1e9) and everything.direction == "in"
    assert train.gb == pytest.approx(500_000 / 1e9) and "2 file(s)" in train.note
    assert refused.gb is None and "did not list it" in refused.note  # unknown, not 0


def test_store_uploads_and_mirror_pulls_are_out_legs_and_rank_offers(request):
    emu = emulator_for(request, "vast")
    _vast_offers(emu, up=0.03, down=0.0)
    req = LaunchRequest(profile="rtx4090", provider="vast", disk_gb=80, mirror=True, store="s3://bucket/runs",
                        limits=Limits(max_steps=400))
    prepared = _prepare(req)
    plan = plan_transfer(prepared.resolved)
    d = prepared.resolved.disk
    store = next(leg for leg in plan.legs if leg.what.startswith("store uploads"))
    mirror = next(leg for leg in plan.legs if leg.what == "mirror pulls")
    assert store.direction == mirror.direction == "out"
    assert mirror.gb == pytest.approx(d.written * d.checkpoints.checkpoint_gb)
    assert lifecycle.offer_ask(req, prepared.resolved).transfer_gb[1] == pytest.approx(store.gb + mirror.gb, abs=1e-3)
    assert any("mirror pulls" in n and "x $0.03/GB" in n for n in prepared.provision.notes)


def test_a_budget_the_bandwidth_alone_uses_up_is_refused_before_anything_is_rented(request):
    emu = emulator_for(request, "vast")
    _vast_offers(emu, up=50.0, down=0.0)  # an absurd $/GB out: the mirror's pulls cost more than the budget
    req = LaunchRequest(profile="rtx4090", provider="vast", disk_gb=80, mirror=True,
                        limits=Limits(max_steps=400, budget_usd=1.0))
    with pytest.raises(UsageError, match=r"does not cover the planned bandwidth alone"):
        _prepare(req)
    assert emu.ledger.created() == []


def test_runpod_bills_no_bandwidth(request):
    emulator_for(request, "runpod")
    with _Files() as files:
        req = LaunchRequest(profile="rtx4090", provider="runpod", data=f"{files.url}/sized",
                            limits=Limits(max_steps=400, budget_usd=5.0))
        prepared = _prepare(req)
    assert any("data download" in n and "$0 (not billed)" in n for n in prepared.provision.notes)
    assert prepared.resolved.limits.budget_usd == 5.0  # nothing reserved


def test_the_dry_run_and_the_launch_show_the_bandwidth(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    _vast_offers(emu, up=0.02, down=0.05)
    with _Files() as files:
        code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "rtx4090", "--data",
                             f"{files.url}/sized", "--dry-run", "--json")
        assert code == 0, err
        lines = json.loads(out)["bandwidth"]
        assert any("data download" in line and "at the offer's $/GB in (chosen at launch)" in line for line in lines)
        code, out, err = launch(capsys, tmp_path, "vast", "bw-run", "--data", f"{files.url}/sized",
                                "--budget", "3", "--dry-run")
    assert code == 0, err
    assert "bandwidth in: data download (1 URL(s)): 0.001 GB" in out
    code, out, err = cli(capsys, "offers", "--provider", "vast", "--json")
    assert code == 0, err
    row = json.loads(out)["offers"][0]
    assert (row["inet_down_usd_per_gb"], row["inet_up_usd_per_gb"]) == (0.05, 0.02)
