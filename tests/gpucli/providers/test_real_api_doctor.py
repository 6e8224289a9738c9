"""`gpucli doctor`: read-only, against both emulators, and useful without a network."""

from __future__ import annotations

import json
import socket

from gpucli.cli.app import main
from gpucli.settings import home


def doctor(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["doctor", *args])
    out, err = capsys.readouterr()
    return code, out, err


def by_check(report: dict) -> dict:
    return {c["subject"]: c for c in report["checks"]}


def test_doctor_against_both_emulators_spends_nothing(runpod_emulator, vast_emulator, client_key, capsys):
    home().mkdir(parents=True, exist_ok=True)
    (home() / "id_ed25519.pub").write_text(client_key[1])
    runpod_emulator.account_keys = [client_key[1].strip()]
    code, out, _ = doctor(capsys, "--json")
    assert code == 0, out
    reports = {r["subject"]: by_check(r) for r in json.loads(out)}
    rp, vast = reports["runpod"], reports["vast"]
    assert rp["API key"]["detail"] == "from env RUNPOD_API_KEY" and rp["API"]["status"] == "ok"
    assert rp["balance"]["detail"] == "$25.00" and vast["balance"]["detail"] == "$42.50"
    assert "also on the account" in rp["SSH key"]["detail"]
    assert "first launch registers it" in vast["SSH key"]["detail"]
    # the key is checked against RunPod's REST v2, and every call names the API it goes through
    assert rp["API"]["detail"].endswith("by REST v2 (GET /v2/pods)")
    assert "terminate: REST v2 DELETE /v2/pods/{id}" in rp["calls"]["detail"]
    assert "balance: GraphQL" in rp["calls"]["detail"] and "v1" not in rp["calls"]["detail"]
    assert reports["notifications"]["Telegram"]["status"] == "info"
    for emu in (runpod_emulator, vast_emulator):  # read-only: no create, no key registered, no writes
        assert emu.ledger.created() == []
        assert all(m == "GET" or (m == "POST" and p == "/graphql") for m, p, _ in emu.requests)
    assert ("GET", "/v2/pods") in [(m, p) for m, p, _ in runpod_emulator.requests]
    assert runpod_emulator.api_key not in out and vast_emulator.api_key not in out
    code, out, _ = doctor(capsys, "--provider", "vast")
    assert code == 0 and "vast" in out and "runpod" not in out and "$42.50" in out


def test_doctor_without_network(monkeypatch, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("VAST_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("VAST_API_KEY", "some-key-value")
    code, out, _ = doctor(capsys, "--provider", "vast", "--json")
    vast = by_check(json.loads(out)[0])
    assert code == 4 and vast["API"]["status"] == "fail" and vast["API"]["detail"].startswith("no network")
    assert "some-key-value" not in out


def test_doctor_key_refused_and_provider_down(vast_emulator, runpod_emulator, monkeypatch, capsys):
    monkeypatch.setenv("VAST_API_KEY", "wrong-key")
    runpod_emulator.faults.add("server_error", "list", times=10)
    code, out, _ = doctor(capsys, "--json")
    reports = {r["subject"]: by_check(r) for r in json.loads(out)}
    assert code == 4
    assert reports["vast"]["API"]["detail"].startswith("key refused")
    assert reports["runpod"]["API"]["detail"].startswith("RunPod down or failing")
    assert "wrong-key" not in out


def test_doctor_missing_key_and_telegram_token(telegram_emulator, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.runpod/config.toml either
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:not-the-token")
    code, out, _ = doctor(capsys, "--provider", "runpod", "--json")
    reports = {r["subject"]: by_check(r) for r in json.loads(out)}
    assert code == 4 and "gpucli keys set runpod" in reports["runpod"]["API key"]["detail"]
    assert reports["notifications"]["Telegram"]["status"] == "fail"
    assert "refused" in reports["notifications"]["Telegram"]["detail"] and "not-the-token" not in out
