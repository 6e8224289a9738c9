"""The preflight's download check end to end: a real HTTP server on loopback serves the run's ``--data``
file fast, or slowly (rate-limited, as a far or congested source would); the host reads the start of it
(a bounded Range read, python3's urllib on the host) before the trainer's checks. Below health.yaml's
``min_download_mb_s`` the machine is refused in one line (an ssh host) or ended (an emulator pod, gone by
the provider's word); above it the rate and the data's time at it are in the record and ``status``."""

from __future__ import annotations

import sys
import time
from http.server import BaseHTTPRequestHandler

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, error_lines
from tests.e2e.data.test_launch_data import SMALL_PREP, TINY_GPU
from tests.support.cli import FAST_TRAINER, cli
from tests.support.httpserve import LoopbackHttp

BODY = "".join(f"line {j}: a corpus served over HTTP, read by the host before the run.\n"
               for j in range(16_000)).encode()  # ~1.1 MB
SLOW_BYTES_PER_S = 256 << 10  # 0.26 MB/s, far under the 5 MB/s bar


class DataServer(LoopbackHttp):
    """``/fast/corpus.txt`` at loopback speed, ``/slow/corpus.txt`` at SLOW_BYTES_PER_S; Range honoured."""

    def __init__(self) -> None:
        self.ranges: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _head(self, status: int, length: int) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(length))
                self.send_header("Content-Type", "text/plain")
                self.end_headers()

            def do_HEAD(self):  # noqa: N802
                if self.path not in ("/fast/corpus.txt", "/slow/corpus.txt"):
                    return self._head(404, 0)
                self._head(200, len(BODY))

            def do_GET(self):  # noqa: N802
                if self.path not in ("/fast/corpus.txt", "/slow/corpus.txt"):
                    return self._head(404, 0)
                body, status = BODY, 200
                asked = self.headers.get("Range")
                if asked and asked.startswith("bytes=0-"):
                    outer.ranges.append(asked)
                    body, status = BODY[: int(asked[len("bytes=0-"):]) + 1], 206
                self._head(status, len(body))
                step = 16 << 10
                try:
                    for i in range(0, len(body), step):
                        self.wfile.write(body[i:i + step])
                        if self.path.startswith("/slow/"):
                            time.sleep(step / SLOW_BYTES_PER_S)
                except OSError:  # the reader had enough: a bounded read closes early
                    pass

        super().__init__(Handler, clear_on_exit=True)


def test_download_rate_on_an_ssh_host(capsys, tmp_path, sshd, client_key):
    host = ["--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
            "--python", sys.executable]
    with DataServer() as files:
        t0 = time.monotonic()
        code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "dl-slow", "--data",
                             f"{files.url}/slow/corpus.txt", "--workdir", str(tmp_path / "host" / "slow"), *host,
                             *FAST_TRAINER, *SMALL_PREP)
        slow_s = time.monotonic() - t0
        assert code == 1, err
        lines = error_lines(err)
        assert len(lines) == 1 and "preflight failed (download)" in lines[0] and "(the bar: 5 MB/s)" in lines[0], err
        pf = runs.load("dl-slow").preflight
        assert pf is not None and not pf.ok and pf.stage == "download" and pf.download_mb_s is not None
        assert 0 < pf.download_mb_s < 1 and pf.download_gb is not None and abs(pf.download_gb - len(BODY) / 1e9) < 1e-6
        assert files.ranges and all(r.startswith("bytes=0-") for r in files.ranges)  # a bounded read, never all

        code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "dl-fast", "--data",
                             f"{files.url}/fast/corpus.txt", "--workdir", str(tmp_path / "host" / "fast"), *host,
                             *FAST_TRAINER, *SMALL_PREP)
        assert code == 0, err
        pf = runs.load("dl-fast").preflight
        assert pf is not None and pf.ok and pf.download_mb_s is not None and pf.download_mb_s >= 5
        assert pf.download_eta_s is not None and pf.download_eta_s < 1
        code, out, _ = cli(capsys, "status", "dl-fast")
        assert code == 0 and f"download {pf.download_mb_s:g} MB/s" in " ".join(out.split()), out
        assert cli(capsys, "down", "dl-fast")[0] == 0
    print(f"download check on an ssh host: slow source {runs.load('dl-slow').preflight.download_mb_s} MB/s refused "
          f"(launch {slow_s:.0f} s), fast source {pf.download_mb_s} MB/s passed")


def test_a_slow_download_ends_an_emulator_pod(request, capsys, tmp_path):
    emu = emulator_for(request, "runpod")
    with DataServer() as files:
        code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--name", "dl-pod",
                             "--data", f"{files.url}/slow/corpus.txt", "--workdir", str(tmp_path / "pod" / "dl"),
                             "--python", sys.executable, "--ready-timeout", "20", *TINY_GPU, *SMALL_PREP)
    assert code == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and "preflight failed (download)" in lines[0] and "the machine cost $" in lines[0], err
    record = runs.load("dl-pod")
    assert record.status == "failed" and record.preflight is not None and record.preflight.download_mb_s < 1
    assert record.instance_id not in emu.ledger.alive()  # the provider says it is gone
    assert_nothing_running(emu)
