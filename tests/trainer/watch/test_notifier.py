"""The trainer's Notifier in process against the emulator: retry_after, bounded retries, a rejected
token, a full queue, Markdown fallback, message shapes, and no token in logs or reprs."""

from __future__ import annotations

import logging

import pytest

from tests.support.telegram import TelegramEmulator, fields, markdown_ok
from trainer.spec.alerts import EVENTS
from trainer.spec.config import ConfigError
from trainer.spec.load import load_config
from trainer.watch import notify
from trainer.watch.notify import Notifier, Secret, scrub


def _notifier(emu: TelegramEmulator, **kw) -> Notifier:
    kw.setdefault("backoff_s", 0.05)
    return Notifier(emu.token, emu.chat_id, api_base=emu.url, **kw)


def test_429_waits_the_retry_after_telegram_asks_for(telegram_emulator):
    emu = telegram_emulator
    emu.set_fault("429", count=1, retry_after=1)
    n = _notifier(emu)
    assert n.send("hello")
    assert emu.wait_for(lambda e: e.messages, timeout=5)
    first, second = emu.requests[0], emu.requests[1]
    assert first.status == 429 and second.status == 200
    assert second.at - first.at >= 0.95  # retry_after, not the 0.05 s backoff
    n.close()
    assert (n.sent, n.failed, n.dropped) == (1, 0, 0)


def test_at_close_a_short_retry_after_is_still_honoured(telegram_emulator):
    emu = telegram_emulator
    emu.set_fault("429", count=1, retry_after=1)
    n = _notifier(emu)
    n.training_complete(10, 30.0, 0.5)
    n.close(wait_s=3.0)
    assert [r.status for r in emu.requests] == [429, 200] and n.sent == 1
    assert emu.requests[1].at - emu.requests[0].at >= 0.95


def test_500_is_retried_a_bounded_number_of_times_then_counted(telegram_emulator, notify_log):
    emu = telegram_emulator
    emu.set_fault("500")
    n = _notifier(emu, max_attempts=3)
    n.send("x")
    assert emu.wait_for(lambda e: n.failed == 1, timeout=5)
    n.close()
    assert [r.status for r in emu.requests] == [500, 500, 500] and n.sent == 0
    assert "send failed after 3 attempt(s): HTTP 500 Internal Server Error" in notify_log.text


@pytest.fixture
def notify_log(caplog, monkeypatch):
    """caplog for trainer.watch.notify alone (an in-process trainer test may have left the "trainer"
    logger non-propagating with handlers on a closed stream)."""
    logger = logging.getLogger("trainer.watch.notify")
    monkeypatch.setattr(logger, "handlers", [caplog.handler])
    monkeypatch.setattr(logger, "propagate", False)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    return caplog


def test_a_rejected_token_turns_alerts_off_after_one_request(telegram_emulator, notify_log):
    emu, caplog = telegram_emulator, notify_log
    n = Notifier("999999:WrongTokenValue_abcdef", emu.chat_id, api_base=emu.url, backoff_s=0.05)
    n.send("a")
    assert emu.wait_for(lambda e: n.failed == 1, timeout=5)
    n.send("b")
    n.send("c")
    n.close()
    assert [r.status for r in emu.requests] == [401] and n.dropped == 2
    assert "rejected" in caplog.text and "WrongTokenValue" not in caplog.text


def test_a_hanging_telegram_never_blocks_send_and_the_queue_stays_bounded(telegram_emulator):
    emu = telegram_emulator
    emu.set_fault("hang", delay_s=30)
    n = _notifier(emu, max_queue=5, timeout_s=0.5)
    results = [n.send(f"m{i}") for i in range(50)]
    # every send returned while the first request still hangs (nothing answered yet): none waited on it
    assert n.sent == 0 and n.failed == 0
    assert results.count(True) <= 6 and n.dropped >= 44  # the thread may hold one; 5 fit the queue
    n.close(wait_s=0.5)
    # close() gave up on the queue instead of trying each message to the end (4 tries of 0.5 s each)
    assert n.sent == 0 and n.failed < results.count(True)
    assert n.sent + n.failed + n.dropped <= 50


def test_at_close_the_final_alert_goes_before_the_backlog(telegram_emulator):
    emu = telegram_emulator
    emu.set_fault("slow", delay_s=0.3)
    n = _notifier(emu)
    n.send("spike 0")
    assert emu.wait_for(lambda e: e.requests, timeout=3)  # in flight when the run ends
    for i in range(1, 10):
        n.send(f"spike {i}")
    n.training_complete(10, 30.0, 0.5)
    n.close(wait_s=1.0)
    # 0.3 s a request and 1 s to close in: the backlog was cut at the deadline, not sent in full
    assert n.sent < 11
    assert emu.wait_for(lambda e: len(e.messages) >= 2, timeout=3)
    first, second = emu.texts()[:2]
    assert first == "spike 0" and fields(second)["title"] == "Training Complete"
    assert n.sent >= 2 and n.sent + n.failed + n.dropped + n.pending == 11


def test_dropped_connections_and_a_down_server_are_failures_not_exceptions(telegram_emulator):
    emu = telegram_emulator
    emu.set_fault("drop", count=1)
    n = _notifier(emu)
    n.send("survives a reset")
    assert emu.wait_for(lambda e: e.messages, timeout=5)
    emu.down()
    n.send("lost")
    assert emu.wait_for(lambda e: n.failed == 1, timeout=5)
    n.close()
    assert emu.texts() == ["survives a reset"] and n.sent == 1


def test_markdown_telegram_cannot_parse_is_resent_as_plain_text(telegram_emulator):
    emu = telegram_emulator
    n = _notifier(emu)
    n.send("*Odd* name_odd underscore")
    n.close()
    assert [r.status for r in emu.requests] == [400, 200]
    assert emu.messages[0].parse_mode is None and emu.messages[0].text == "*Odd* name_odd underscore"


def test_filtered_events_and_disabled_notifier_send_nothing(telegram_emulator, monkeypatch):
    emu = telegram_emulator
    n = _notifier(emu, events=["training_complete"])
    assert not n.ppl_spike(5, 300.0, 100.0) and not n.cost_update(4.0, 2.39)
    assert n.training_complete(10, 30.0, 0.5)
    n.close()
    assert [fields(t)["title"] for t in emu.texts()] == ["Training Complete"]
    off = Notifier(emu.token, emu.chat_id, enabled=False, api_base=emu.url)
    assert not off.send("x") and not off.enabled
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN")
    assert not Notifier(None, emu.chat_id).enabled  # no token anywhere: a no-op


def test_message_shapes_follow_seed_000_and_are_valid_markdown():
    shapes = {
        "Checkpoint Saved": notify.format_checkpoint_saved(12345, 2.3456, 10.44, 0.0),
        "Validation Complete": notify.format_validation_complete(500, 2.5, 2.4),
        "Training Complete": notify.format_training_complete(88000, 12.34, 31.25, "max_steps", 74.69),
        "ERROR": notify.format_error_occurred("ValueError: bad `thing` in my_file_name", 7,
                                              "line_one\nTraceback ```x```\nlast_line"),
        "PPL Spike Detected": notify.format_ppl_spike(1500, 250.0, 100.0),
        "Stage Transition": notify.format_stage_transition(2, 80000, 256),
        "Cost Update": notify.format_cost_update(4.0, 2.39),
    }
    for title, text in shapes.items():
        assert fields(text)["title"] == title and markdown_ok(text), text
    assert fields(shapes["Checkpoint Saved"]) | {"Time": "-"} == {
        "title": "Checkpoint Saved", "Step": "12,345", "Loss": "2.3456", "PPL": "10.4", "Time": "-"}
    assert fields(shapes["Training Complete"])["Total Steps"] == "88,000"
    assert "Duration: `31.2` hours" in shapes["Training Complete"]
    assert fields(shapes["PPL Spike Detected"]) == {"title": "PPL Spike Detected", "Step": "1,500",
                                                    "Current PPL": "250.0", "Rolling Avg": "100.0", "Ratio": "2.5x"}
    assert fields(shapes["Stage Transition"])["Stage"] == "2"
    assert fields(shapes["Cost Update"]) == {"title": "Cost Update", "Hours": "4.0", "Rate": "$2.39/hr",
                                             "Total": "$9.56"}
    assert "Rate" not in notify.format_cost_update(4.0, None)
    assert "last_line" in shapes["ERROR"] and len(notify.format_error_occurred("e", 1, "x" * 10000)) <= 4096


def test_the_token_stays_out_of_reprs_and_scrubbed_errors(telegram_emulator):
    emu = telegram_emulator
    n = _notifier(emu)
    secret = emu.token.split(":", 1)[1]
    assert secret not in repr(n) and secret not in str(n._token) and secret not in f"{n._token}"
    assert Secret("abc").reveal() == "abc" and repr(Secret("abc")) == "Secret('****')"
    msg = f"HTTPSConnectionPool(host='api.telegram.org'): Max retries exceeded with url: /bot{emu.token}/sendMessage"
    assert secret not in scrub(msg) and secret not in scrub(msg, emu.token)
    n.send(f"a message that quotes the token {emu.token} by mistake")
    n.close()
    assert secret not in emu.messages[0].text


def test_config_knows_the_events_and_the_cost_interval(tmp_path):
    cfg = load_config(None, ["--training.max_steps=5", "--notifications.cost_update_hours=0.5",
                             "--notifications.telegram.timeout_s=3"])
    assert cfg.notifications.cost_update_hours == 0.5 and "cost_update" in cfg.notifications.events
    assert set(cfg.notifications.events) == set(EVENTS)
    with pytest.raises(ConfigError, match="unknown event 'ppl_spikes'"):
        load_config(None, ["--training.max_steps=5", "--notifications.events=[ppl_spikes]"])
    with pytest.raises(ConfigError, match="cost_update_hours must be > 0"):
        load_config(None, ["--training.max_steps=5", "--notifications.cost_update_hours=0"])
