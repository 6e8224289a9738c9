"""`gpucli notify test` against the Telegram emulator: sent, token rejected, unreachable, no token;
the token never printed (not even with --debug)."""

from __future__ import annotations

import json
import os

import pytest

SECRET_PART = "placeholder-bot-token-for-tests-only"


def test_sends_a_test_message_with_the_env_token(run, telegram_emulator):
    code, out, err = run("notify", "test")
    assert code == 0, err
    (msg,) = telegram_emulator.messages
    assert msg.chat_id == telegram_emulator.chat_id and "test message" in msg.text
    assert "sent a test message to Telegram chat 424242 (message 1)" in err and "env TELEGRAM_BOT_TOKEN" in err
    assert SECRET_PART not in out + err


def test_uses_the_keys_json_token_and_chat(run, telegram_emulator, monkeypatch, isolated_home):
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN")
    monkeypatch.delenv("TELEGRAM_CHAT_ID")
    (isolated_home / "keys.json").write_text(json.dumps({"telegram": telegram_emulator.token,
                                                         "telegram-chat": telegram_emulator.chat_id}))
    os.chmod(isolated_home / "keys.json", 0o600)
    code, out, err = run("notify", "test", "--message", "hello from keys.json")
    assert code == 0, err
    assert telegram_emulator.texts() == ["hello from keys.json"] and "keys.json" in err
    assert SECRET_PART not in out + err


@pytest.mark.parametrize("debug", [False, True])
def test_a_wrong_token_is_a_one_line_rejection(run, telegram_emulator, monkeypatch, debug):
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:WrongTokenSecretValue")
    code, out, err = run(*(["--debug"] if debug else []), "notify", "test")
    assert code == 4
    assert "Telegram rejected the bot token from env TELEGRAM_BOT_TOKEN (HTTP 401 Unauthorized)" in err
    assert "gpucli keys set telegram" in err and "WrongTokenSecretValue" not in out + err
    if not debug:
        assert len(err.strip().splitlines()) == 1 and not telegram_emulator.messages


@pytest.mark.parametrize("debug", [False, True])
def test_an_unreachable_telegram_says_so_without_the_token(run, telegram_emulator, monkeypatch, debug):
    telegram_emulator.down()
    code, out, err = run(*(["--debug"] if debug else []), "notify", "test", "--timeout", "2")
    assert code == 5
    assert f"cannot reach Telegram at {telegram_emulator.url}: [Errno 111] Connection refused" in err
    assert SECRET_PART not in out + err
    if not debug:
        assert len(err.strip().splitlines()) == 1


def test_a_hanging_telegram_times_out(run, telegram_emulator):
    telegram_emulator.set_fault("hang", delay_s=10)
    code, out, err = run("notify", "test", "--timeout", "0.5")
    assert code == 5 and "did not answer within 0.5s" in err and SECRET_PART not in out + err


def test_rate_limit_and_unknown_chat_are_explained(run, telegram_emulator, monkeypatch):
    telegram_emulator.set_fault("429", count=1, retry_after=7)
    code, _, err = run("notify", "test")
    assert code == 4 and "rate-limiting" in err and "try again in 7 s" in err
    monkeypatch.setenv("TELEGRAM_CHAT_ID", "111")
    code, _, err = run("notify", "test")
    assert code == 4 and "refused to send to chat 111" in err and "chat not found" in err


def test_no_token_or_no_chat_says_how_to_set_it(run, telegram_emulator, monkeypatch):
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN")
    code, out, err = run("notify", "test")
    assert code == 2 and "no Telegram bot token" in err and "gpucli keys set telegram" in err
    assert "TELEGRAM_BOT_TOKEN" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", telegram_emulator.token)
    monkeypatch.delenv("TELEGRAM_CHAT_ID")
    code, out, err = run("notify", "test")
    assert code == 2 and "no Telegram chat id" in err and "gpucli keys set telegram-chat" in err
    assert not telegram_emulator.requests


def test_notify_has_help(run):
    code, out, err = run("notify", "test", "--help")
    assert code == 0 and "Send a test message" in out
