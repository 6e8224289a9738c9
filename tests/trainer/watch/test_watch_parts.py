"""What a run reports, in process: MFU, spikes, the notifier, the integrations when off."""

from __future__ import annotations

import http.server
import json
import logging
import threading

import pytest

from trainer.spec.load import load_config
from trainer.watch.metrics import SpikeDetector, mfu, peak_flops
from trainer.watch.notify import Notifier


def test_mfu_table_and_unknown_device():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("Some Future GPU") is None and mfu(1e6, 1e9, None) is None
    assert mfu(485_937, 6 * 124e6, 989e12) == pytest.approx(485_937 * 6 * 124e6 / 989e12)



def test_spike_detector():
    d = SpikeDetector(window=10, factor=2.0, min_history=3)
    assert all(d.update(v) is None for v in (10, 11, 9, 10))
    assert d.update(25.0) == pytest.approx(10.0)
    assert d.update(12.0) is None



def test_notifier_sends_in_background_and_never_logs_token(monkeypatch, caplog):
    got: list[tuple[str, dict]] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got.append((self.path, body))
            self.send_response(500 if body["text"] == "fail" else 200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("TELEGRAM_API_BASE", f"http://127.0.0.1:{srv.server_port}")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "SECRET-TOKEN-123")
    monkeypatch.setenv("TELEGRAM_CHAT_ID", "42")
    caplog.set_level(logging.WARNING)
    n = Notifier(events=["checkpoint_saved"])
    n.send("hello", "checkpoint_saved")
    n.send("filtered", "ppl_spike")
    n.send("fail", "checkpoint_saved")
    n.close()
    srv.shutdown()
    assert [b["text"] for _, b in got] == ["hello", "fail"]
    assert got[0][0] == "/botSECRET-TOKEN-123/sendMessage" and got[0][1]["chat_id"] == "42"
    assert n.sent == 1 and n.failed == 1
    assert "SECRET" not in caplog.text and "SECRET" not in repr(n)
    # Unreachable server: still never raises.
    monkeypatch.setenv("TELEGRAM_API_BASE", "http://127.0.0.1:9")
    n2 = Notifier(timeout_s=0.5)
    n2.send("x")
    n2.close()
    assert n2.failed == 1



def test_integrations_are_null_objects_when_off(tmp_path):
    from trainer.watch.components import (
        FaultHook,
        NoAlerts,
        NoCostUpdates,
        NoFaults,
        NoHighLossLog,
        make_alerts,
        make_cost_updates,
        make_fault_hook,
        make_high_loss_log,
    )

    on = load_config(None, ["--training.max_steps=5", "--notifications.telegram.enabled=true",
                            "--notifications.telegram.bot_token=t", "--notifications.telegram.chat_id=c"])
    assert isinstance(make_alerts(on, master=False), NoAlerts)  # only rank 0 alerts
    off = load_config(None, ["--training.max_steps=5", "--training.high_loss_threshold=null"])
    alerts = make_alerts(off, master=True)
    assert isinstance(alerts, NoAlerts) and isinstance(make_cost_updates(off, alerts), NoCostUpdates)
    assert isinstance(make_high_loss_log(off, None, 0, tmp_path), NoHighLossLog)  # type: ignore[arg-type]
    assert isinstance(make_fault_hook(off.faults), NoFaults)
    hook = make_fault_hook(load_config(None, ["--training.max_steps=5", "--faults.raise_at_step=3"]).faults)
    assert isinstance(hook, FaultHook)
    hook.after_step(2)
    with pytest.raises(RuntimeError, match="faults.raise_at_step at step 3"):
        hook.after_step(3)
