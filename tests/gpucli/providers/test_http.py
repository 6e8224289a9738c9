"""The HTTP helper against the emulators: retries, Retry-After, plain-text 429, quota, no key leaks."""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from gpucli.providers.http import (
    AuthError,
    HttpClient,
    NetworkError,
    QuotaExceededError,
    RateLimitError,
    RequestMaybeSent,
    RetryPolicy,
    parse_retry_after,
)

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.01, deadline_s=5)


def client(emu, *, policy=FAST, key=None, sleeps=None, read_timeout_s=5.0):
    sleeps = sleeps if sleeps is not None else []
    return HttpClient(emu.url, api_key=key or emu.api_key, service="vast.ai", policy=policy,
                      sleep=sleeps.append, rng=random.Random(1), read_timeout_s=read_timeout_s)


def search(c):
    return c.request("POST", "/api/v0/bundles/", json_body={"limit": 1}, idempotent=True)


def test_plain_text_429_without_retry_after_is_retried_with_backoff(vast_emulator):
    vast_emulator.faults.add("rate_limit", "search", times=2, plain_text=True)
    sleeps: list[float] = []
    resp = search(client(vast_emulator, sleeps=sleeps))
    assert resp.ok and resp.body["offers"]
    assert len(sleeps) == 2 and all(0 < s <= 0.01 for s in sleeps)


def test_retry_after_seconds_is_honoured(vast_emulator):
    vast_emulator.faults.add("rate_limit", "search", retry_after="0.25", plain_text=False)
    sleeps: list[float] = []
    assert search(client(vast_emulator, sleeps=sleeps)).ok
    assert sleeps == [0.25]


def test_retry_after_http_date_is_honoured():
    now = datetime(2026, 8, 1, 12, 0, 0, tzinfo=timezone.utc)
    header = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(header, now=lambda: now) == pytest.approx(30)
    assert parse_retry_after("garbage") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("-5") == 0.0


def test_retry_after_beyond_the_cap_fails_fast(vast_emulator):
    vast_emulator.faults.add("rate_limit", "search", retry_after="3600")
    sleeps: list[float] = []
    with pytest.raises(RateLimitError, match="3600"):
        search(client(vast_emulator, sleeps=sleeps))
    assert sleeps == []


def test_persistent_429_gives_up_after_bounded_tries(vast_emulator):
    vast_emulator.faults.add("rate_limit", "search", times=50)
    sleeps: list[float] = []
    with pytest.raises(RateLimitError, match="429"):
        search(client(vast_emulator, sleeps=sleeps))
    assert len(sleeps) == FAST.max_attempts - 1


def test_search_quota_is_reported_and_not_retried(vast_emulator):
    vast_emulator.faults.add("quota", "search", times=5)
    sleeps: list[float] = []
    with pytest.raises(QuotaExceededError, match="daily search quota"):
        search(client(vast_emulator, sleeps=sleeps))
    assert sleeps == []


def test_5xx_and_dropped_connections_are_retried_for_idempotent_calls(vast_emulator):
    vast_emulator.faults.add("server_error", "search", status=503)
    vast_emulator.faults.add("drop", "search")
    vast_emulator.faults.add("server_error", "search", status=502)
    assert search(client(vast_emulator)).ok


def test_slow_answer_times_out_and_is_retried(vast_emulator):
    vast_emulator.faults.add("slow", "search", seconds=0.6)
    assert search(client(vast_emulator, read_timeout_s=0.2)).ok


def test_non_idempotent_call_is_not_retried_after_it_may_have_been_sent(vast_emulator):
    vast_emulator.faults.add("drop", "create")
    c = client(vast_emulator)
    with pytest.raises(RequestMaybeSent):
        c.request("PUT", "/api/v0/asks/1001/", json_body={"image": "x", "label": "gpucli-x"})
    assert [m for m, p, _ in vast_emulator.requests if p == "/api/v0/asks/1001/"] == ["PUT"]


def test_429_on_create_is_retried_because_the_server_refused_it(vast_emulator):
    vast_emulator.faults.add("rate_limit", "create")
    resp = client(vast_emulator).request("PUT", "/api/v0/asks/1001/", json_body={"image": "x", "label": "gpucli-x"})
    assert resp.ok and vast_emulator.ledger.alive()


def test_connection_refused_is_retried_then_reported():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = HttpClient(f"http://127.0.0.1:{port}", api_key="k", service="vast.ai", policy=FAST, sleep=lambda s: None)
    with pytest.raises(NetworkError, match="could not reach vast.ai .*after 4 tries"):
        c.request("PUT", "/x", json_body={})  # never connected, so even a PUT may retry


def test_bad_key_is_an_auth_error_and_the_key_never_shows(vast_emulator, caplog):
    caplog.set_level(logging.DEBUG)
    secret = "sk-very-secret-0123456789"
    c = client(vast_emulator, key=secret)
    with pytest.raises(AuthError) as info:
        search(c)
    assert secret not in str(info.value)
    assert secret not in repr(c)
    assert secret not in caplog.text
    assert vast_emulator.auth_headers[-1] == f"Bearer {secret}"  # it was sent, as a header only
