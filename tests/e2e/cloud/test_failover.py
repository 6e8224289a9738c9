"""One launch across both clouds (``--provider any``) against the RunPod and vast.ai emulators: capacity
refusals, pods that never become reachable and machines below the health bars are ended (gone by the
provider's word) and the next offer, on either provider, is tried; a bad host is avoided; the record
keeps every attempt and names the provider that won; nothing is left billing."""

from __future__ import annotations

import json

from gpucli.run.host import avoid
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, error_lines, launch
from tests.support.cli import cli
from tests.support.emulators import PodBehaviour


def both(request):
    return emulator_for(request, "runpod"), emulator_for(request, "vast")


def test_no_capacity_on_runpod_fails_over_to_vast(request, capsys, tmp_path):
    rp, vast = both(request)
    rp.faults.add("no_capacity", "create", times=50)  # every RunPod offer refused for capacity
    code, out, err = launch(capsys, tmp_path, "any", "fo-cap")
    assert code == 0, err
    record = runs.load("fo-cap")
    assert record.provider == "vast" and record.status == "running"
    failed = [a for a in record.attempts if not a["ok"]]
    assert failed and all(a["provider"] == "runpod" and "no capacity" in a["reason"] for a in failed)
    assert record.attempts[-1]["ok"] and record.attempts[-1]["provider"] == "vast"
    assert "attempt on runpod offer" in err and "no capacity" in err
    assert rp.ledger.alive() == set() and vast.ledger.alive() == {record.instance_id}
    assert cli(capsys, "down", "fo-cap")[0] == 0
    assert_nothing_running(rp)
    assert_nothing_running(vast)


def test_never_reachable_pod_is_ended_before_the_next(request, capsys, tmp_path):
    rp, vast = both(request)
    rp.behaviours.append(PodBehaviour(stuck=True))  # the cheapest offer's pod never starts
    code, out, err = launch(capsys, tmp_path, "any", "fo-stuck", "--ready-timeout", "2")
    assert code == 0, err
    record = runs.load("fo-stuck")
    first, last = record.attempts[0], record.attempts[-1]
    assert not first["ok"] and first["provider"] == "runpod" and first["cost_usd"] > 0
    assert last["ok"]
    stuck_pod = rp.ledger.created()[0].pod_id
    assert stuck_pod not in rp.ledger.alive() and stuck_pod != record.instance_id
    assert cli(capsys, "down", "fo-stuck")[0] == 0
    assert_nothing_running(rp)
    assert_nothing_running(vast)


def test_retry_until_up_gives_up_at_its_deadline(request, capsys, tmp_path):
    rp, vast = both(request)
    rp.faults.add("no_capacity", "create", times=500)
    vast.faults.add("no_capacity", "create", times=500)
    code, out, err = launch(capsys, tmp_path, "runpod,vast", "fo-none", "--retry-until-up", "2s")
    assert code == 4, err  # a provider's error
    lines = error_lines(err)
    assert len(lines) == 1 and "gave a working machine" in lines[0] and "nothing left running" in lines[0], err
    assert "searching again" in err
    record = runs.load("fo-none")
    assert record.status == "failed" and len(record.attempts) >= 2
    assert {a["provider"] for a in record.attempts} == {"runpod", "vast"}
    assert_nothing_running(rp)
    assert_nothing_running(vast)


def test_avoided_host_is_skipped(request, capsys, tmp_path):
    rp, vast = both(request)
    code, out, err = cli(capsys, "offers", "--provider", "runpod", "--json")
    # the RunPod offers of the profile's GPU are all avoided: the launch goes to vast without trying them
    for dc in ("EU-RO-1", "US-KS-2", "US-TX-3", "CA-MTL-1"):
        for cloud in ("SECURE", "COMMUNITY"):
            avoid.add(f"runpod:NVIDIA GeForce RTX 4090|{cloud}|{dc}", "matmul at 12% of peak")
    code, out, err = launch(capsys, tmp_path, "any", "fo-avoid")
    assert code == 0, err
    assert "failed its health check (matmul at 12% of peak)" in err
    record = runs.load("fo-avoid")
    assert record.provider == "vast" and all(a["provider"] == "vast" for a in record.attempts)
    assert rp.ledger.created() == []
    saved = json.loads((avoid._path()).read_text())
    assert all(v["until"] > 0 for v in saved.values())
    assert cli(capsys, "down", "fo-avoid")[0] == 0
    assert_nothing_running(vast)


def test_gpu_profile_without_provider_or_key_says_how_to_set_one(capsys, tmp_path):
    code, out, err = cli(capsys, "launch", "--profile", "8xA100", "--phase", "extreme")
    assert code == 2
    lines = error_lines(err)
    assert len(lines) == 1 and "no cloud API key is set" in lines[0], err
    assert "gpucli keys set runpod" in err


def test_gpu_profile_without_provider_needs_yes_outside_a_terminal(request, capsys, tmp_path):
    rp, vast = both(request)
    code, out, err = cli(capsys, "launch", "--profile", "rtx4090", "--name", "fo-yes")
    assert code == 2 and "--yes" in error_lines(err)[0], err
    assert "chose the cheapest offer" in err and "$" in err
    assert rp.ledger.created() == [] and vast.ledger.created() == []


def test_unhealthy_host_is_ended_avoided_and_replaced(request, capsys, tmp_path):
    rp, vast = both(request)
    # the cheapest machine's driver counts uncorrected ECC errors; the next one (any provider) is healthy
    rp.behaviours.append(PodBehaviour(nvidia_smi="NVIDIA GeForce RTX 4090, 3, Not Active\n"))
    rp.behaviours.append(PodBehaviour(nvidia_smi="NVIDIA GeForce RTX 4090, 0, Not Active\n"))
    vast.behaviours.append(PodBehaviour(nvidia_smi="NVIDIA GeForce RTX 4090, [N/A], Not Active\n"))
    code, out, err = launch(capsys, tmp_path, "any", "fo-sick")
    assert code == 0, err
    record = runs.load("fo-sick")
    first = record.attempts[0]
    assert not first["ok"] and "3 uncorrected ECC errors" in first["reason"] and first["cost_usd"] > 0
    bad_pod = rp.ledger.created()[0].pod_id
    assert bad_pod not in rp.ledger.alive() and record.instance_id != bad_pod
    assert record.attempts[-1]["ok"] and len(record.attempts) == 2
    # the machine that passed: nvidia-smi's figures are in the record (and `status`)
    assert record.preflight is not None and record.preflight.ok and record.preflight.smi_gpus == 1
    assert record.preflight.ecc_uncorrected == 0
    assert "nvidia-smi 1x NVIDIA GeForce RTX 4090, 0 ECC errors" in cli(capsys, "status", "fo-sick")[1]
    table = avoid.load()
    assert first["host"] in table and "ECC" in table[first["host"]].why
    assert cli(capsys, "down", "fo-sick")[0] == 0
    # the next launch does not try the avoided host
    code, out, err = launch(capsys, tmp_path, "any", "fo-sick-2")
    assert code == 0, err
    assert f"host {first['host']} failed its health check" in err
    assert all(a["host"] != first["host"] for a in runs.load("fo-sick-2").attempts)
    assert cli(capsys, "down", "fo-sick-2")[0] == 0
    assert_nothing_running(rp)
    assert_nothing_running(vast)


def test_dry_run_across_providers_shows_the_offers_in_order_and_rents_nothing(request, capsys, tmp_path):
    rp, vast = both(request)
    code, out, err = launch(capsys, tmp_path, "any", "fo-dry", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    offers = plan["across"]["offers"]
    assert {o["provider"] for o in offers} == {"runpod", "vast"} and plan["across"]["providers"] == ["runpod", "vast"]
    assert [o["run_usd"] for o in offers] == sorted(o["run_usd"] for o in offers)  # the order it would try
    assert plan["provider"] == offers[0]["provider"]  # the plan is priced on the first offer's provider
    code, out, err = launch(capsys, tmp_path, "vast,runpod", "fo-dry", "--dry-run")
    assert code == 0, err
    assert "Dry run" in out and "across vast, runpod:" in out and "1. 1x" in out
    assert rp.ledger.created() == [] and vast.ledger.created() == []
    assert not (runs.runs_dir() / "fo-dry.json").exists() and not (runs.runs_dir() / ".reserved" / "fo-dry").exists()


def test_dry_run_of_a_gpu_profile_without_provider_or_key_still_plans(capsys, tmp_path):
    code, out, err = cli(capsys, "launch", "--profile", "8xA100", "--phase", "extreme", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["across"]["offers"] == [] and "no cloud API key is set" in plan["across"]["notes"][0]
    assert plan["n_gpus"] == 8 and plan["provider"] in ("runpod", "vast")
