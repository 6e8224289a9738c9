"""Webhook alerts against a local HTTP receiver: each service's payload (Slack, Discord, ntfy, JSON)
from ``gpucli notify test --webhook`` and from the pod-side sender, its retries on 429, a rejected
URL turning it off, a receiver that never answers never holding the caller up, and a real CPU trainer
run posting its events (Telegram's vocabulary) to the webhook."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.everyday.conftest import read_rows, run_trainer, tiny_args, trainer_env
from tests.support.cli import cli, wait_for


class Receiver:
    """A stdlib HTTP server keeping every request; ``script`` answers the next ones (status, headers,
    body) in order, then 200; ``hang`` holds every connection until stop()."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.script: list[tuple[int, dict, bytes]] = []
        self.hang = threading.Event()
        self.stopping = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if outer.hang.is_set():
                    outer.stopping.wait(30)
                    return
                status, headers, answer = outer.script.pop(0) if outer.script else (200, {}, b"ok")
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.mark.parametrize("prefix, check", [
    ("slack+", lambda req: json.loads(req["body"]) == {"text": "hello from gpucli"}),
    ("discord+", lambda req: json.loads(req["body"]) == {"content": "hello from gpucli"}),
    ("ntfy+", lambda req: req["body"] == b"hello from gpucli" and req["headers"]["Title"] == "gpucli"
     and req["headers"]["Markdown"] == "yes"),
    ("", lambda req: json.loads(req["body"]) == {"text": "hello from gpucli", "source": "gpucli"}),
])
def test_notify_test_webhook_payloads(capsys, receiver, prefix, check):
    url = f"{prefix}{receiver.base}/hook/secret-part"
    code, out, err = cli(capsys, "keys", "set", "webhook", url)
    assert code == 0, err
    code, out, err = cli(capsys, "notify", "test", "--webhook", "-m", "hello from gpucli")
    assert code == 0, err
    assert len(receiver.requests) == 1 and receiver.requests[0]["path"] == "/hook/secret-part"
    assert check(receiver.requests[0])
    assert "secret-part" not in out + err


def test_notify_test_webhook_errors_are_one_line(capsys, receiver, monkeypatch):
    receiver.script = [(404, {}, b"no such hook")]
    monkeypatch.setenv("GPUCLI_WEBHOOK_URL", f"slack+{receiver.base}/hook/secret-part")
    code, out, err = cli(capsys, "notify", "test", "--webhook")
    assert code != 0 and "HTTP 404" in err and "secret-part" not in err and "Traceback" not in err
    code, out, err = cli(capsys, "keys", "set", "webhook", "ftp://x")
    assert code != 0 and "http(s)://" in err
    monkeypatch.setenv("GPUCLI_WEBHOOK_URL", "http://127.0.0.1:9/hook/secret-part")  # nothing listens
    code, out, err = cli(capsys, "notify", "test", "--webhook", "--timeout", "5")
    assert code != 0 and "cannot reach" in err and "secret-part" not in err


def test_sender_retries_429_and_stops_on_a_rejected_url(receiver):
    from trainer.watch.webhook import WebhookNotifier

    receiver.script = [(429, {"Content-Type": "application/json"}, b'{"retry_after": 0.1}'), (204, {}, b"")]
    n = WebhookNotifier(f"discord+{receiver.base}/h", backoff_s=0.01)
    assert n.enabled and n.kind == "discord"
    assert n.validation_complete(10, 2.5, 2.4)
    n.close(wait_s=10)
    assert n.sent == 1 and n.failed == 0 and len(receiver.requests) == 2
    assert "Validation Complete" in json.loads(receiver.requests[-1]["body"])["content"]
    receiver.requests.clear()
    receiver.script = [(404, {}, b"")]
    n = WebhookNotifier(f"slack+{receiver.base}/h", backoff_s=0.01)
    n.checkpoint_saved(5, 2.0, 7.4)
    wait_for(lambda: n.failed == 1, 10, "the rejection")
    assert not n.checkpoint_saved(6, 2.0, 7.4)  # off for the rest of the run
    n.close(wait_s=1)
    assert len(receiver.requests) == 1 and "secret" not in repr(n)


def test_a_receiver_that_never_answers_never_holds_the_run(receiver):
    from trainer.watch.webhook import WebhookNotifier

    receiver.hang.set()
    n = WebhookNotifier(f"ntfy+{receiver.base}/topic", timeout_s=30)
    for step in range(200):  # a full queue drops, never blocks
        n.checkpoint_saved(step, 2.0, 7.4)
    assert n.dropped > 0
    n.training_complete(200, 7.0, 0.1)
    n.close(wait_s=0.5)  # bounded: the stuck request is abandoned
    assert n.sent == 0 and n.pending + n.dropped + n.failed > 0


def test_the_trainer_posts_its_events(receiver, data_dir, tmp_path):
    out = tmp_path / "run"
    url = f"slack+{receiver.base}/services/secret-part"
    r = run_trainer(tiny_args(data_dir, out, **{"training.max_steps": 10, "training.val_interval": 5,
                                               "training.checkpoint_interval": 5}),
                    env=trainer_env(GPUCLI_WEBHOOK_URL=url))
    assert r.returncode == 0, r.stderr[-3000:]
    texts = [json.loads(req["body"])["text"] for req in receiver.requests]
    assert any(t.startswith("*Validation Complete*") for t in texts)
    assert any(t.startswith("*Checkpoint Saved*") for t in texts)
    # Once: not necessarily last, since a run that closes with a backlog sends its final alert first
    # (trainer.watch.notify); under load the last checkpoint's message was still queued.
    done = [t for t in texts if t.startswith("*Training Complete*")]
    assert len(done) == 1 and "Total Steps: `10`" in done[0]
    assert "secret-part" not in r.stderr + r.stdout
    assert [row for row in read_rows(out) if row.get("event") == "finished"]


def test_the_env_file_carries_the_webhook(monkeypatch):
    from gpucli.run.starting.start import secrets_env
    from gpucli.settings import save_key

    save_key("webhook", "https://ntfy.sh/my-topic")
    assert secrets_env()["GPUCLI_WEBHOOK_URL"] == "https://ntfy.sh/my-topic"
