"""RunPod network volumes end to end on the emulator (real sshd pods, the real trainer on CPU):
``--volume NAME --volume-size GB`` creates the volume in the data centre of the chosen GPU and a
second run reuses it and its prepared data; ``status`` shows the data preparation; a resume after a
lost spot pod trains on from the volume's checkpoint when the mirror on this machine is behind.
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from pathlib import Path

import pytest

from gpucli.errors import ProviderError
from gpucli.run.files.harvest import mirror_root, newest_good
from gpucli.run.oversee.observe import summarize_prepare
from gpucli.runs import records as runs
from tests.e2e.data.test_launch_data import SMALL_PREP, TINY_GPU, corpus, down, trained
from tests.support.cli import cli, rows_of, wait_for


def volume_launch(tmp_path: Path, *extra: str) -> list[str]:
    return ["launch", "--provider", "runpod", "--profile", "rtx4090", "--python", sys.executable,
            "--ready-timeout", "20", *TINY_GPU, *SMALL_PREP, *extra]


def test_a_volume_created_by_the_first_launch_is_reused_by_the_second(capsys, tmp_path, runpod_emulator,
                                                                      monkeypatch):
    emu = runpod_emulator
    emu.volume_ids.append("fresh00001")  # the id the create will get: its store is known up front
    store = emu.volume_dir("fresh00001")
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(store))
    data = corpus(tmp_path / "laptop" / "corpus")
    args = volume_launch(tmp_path, "--volume", "fresh", "--volume-size", "20", "--data", str(data))

    code, _, err = cli(capsys, *args, "--name", "made1")
    assert code == 0, err
    err = " ".join(err.split())  # the console wraps long lines
    # Created in the data centre with the most RTX 4090s in stock (the emulator's US-KS-2), at RunPod's
    # published $0.07/GB/month, before the pod; the pod was created with it, and the record holds its id.
    assert "created network volume fresh (fresh00001, 20 GB in US-KS-2)" in err and "$1.40/month" in err
    assert emu.volumes["fresh00001"] == {"id": "fresh00001", "name": "fresh", "size": 20, "dataCenter": "US-KS-2",
                                         "type": "STANDARD"}
    calls = [op for op, _ in emu.calls]
    assert calls.index("createNetworkVolume") < calls.index("createPod")
    first = runs.load("made1")
    assert first.launch is not None and first.launch["volume"]["id"] == "fresh00001"
    assert first.launch["volume"]["created"] is True
    assert Path(first.workdir) == store / "gpucli-runs" / "made1"
    trained(capsys, "made1")

    # status: the data step is over (training has started): its bytes, tokens, time and cost.
    code, out, err = cli(capsys, "status", "made1", "--json")
    assert code == 0, err
    prep = json.loads(out)["prepare"]
    assert prep["phase"] == "done" and prep["tokens"] > 100_000 and prep["bytes_read"] == prep["bytes_total"] > 0
    # at the billed price: Secure Cloud (network volumes are Secure only), read back after create
    price = runs.load("made1").price_per_hour_usd
    assert price == pytest.approx(0.69 + 20 * 0.10 / 730, abs=1e-4)
    assert prep["elapsed_s"] >= 0 and prep["cost_usd"] == pytest.approx(prep["elapsed_s"] / 3600 * price, rel=1e-6)
    code, out, err = cli(capsys, "status", "made1")
    assert code == 0 and "data prep" in out and "tokens written" in out

    code, out, err = cli(capsys, "down", "made1")
    assert code == 0, err
    assert "network volume fresh (fresh00001) kept" in out  # down never deletes the volume: it holds the data
    assert "fresh00001" in emu.volumes

    # The second run finds the volume by name: nothing created, nothing prepared again.
    code, _, err = cli(capsys, *args, "--name", "made2")
    assert code == 0, err
    assert "created network volume" not in err and len(emu.volumes) == 1
    second = runs.load("made2")
    assert second.launch is not None and second.launch["volume"]["id"] == "fresh00001"
    assert second.launch["volume"]["created"] is False
    trained(capsys, "made2")
    down(capsys, "made2")
    assert "reusing prepared data" in (Path(second.workdir) / "console.log").read_text()
    creates = [b for op, b in emu.calls if op == "createPod"]
    assert [(c["mounts"]["network"][0]["volumeId"], c["dataCenterIds"], c["cloud"]) for c in creates] == \
        [("fresh00001", ["US-KS-2"], "SECURE")] * 2
    assert all(c["mounts"]["network"][0]["path"] == "/workspace" for c in creates)  # explicit mount path
    assert emu.ledger.alive() == set()


def test_volume_creation_mistakes_are_one_line_and_create_nothing(capsys, runpod_emulator):
    emu = runpod_emulator
    base = ["launch", "--provider", "runpod", "--profile", "rtx4090", *TINY_GPU]
    code, _, err = cli(capsys, *base, "--volume", "v", "--volume-size", "0")
    assert code != 0 and "--volume-size must be a positive number" in err and "Traceback" not in err
    code, _, err = cli(capsys, *base, "--volume-size", "10")
    assert code != 0 and "--volume-size goes with --volume" in err
    # A size RunPod refuses: its error, in one line, before any pod.
    code, _, err = cli(capsys, *base, "--volume", "huge", "--volume-size", "5000")
    assert code != 0 and "RunPod refused to create network volume huge" in err and "1 to 4000" in err
    assert "Traceback" not in err and emu.volumes == {} and emu.ledger.alive() == set()
    assert not any(op == "createPod" for op, _ in emu.calls)

    from gpucli.providers.clients import get_provider

    client = get_provider("runpod")
    with pytest.raises(ProviderError, match="unknown data center"):
        client.create_volume("x", 10, "XX-NO-1")  # type: ignore[attr-defined]
    with pytest.raises(ProviderError, match="1 to 4000"):
        client.create_volume("x", 0, "EU-RO-1")  # type: ignore[attr-defined]
    assert emu.volumes == {}


def test_dry_run_says_the_volume_would_be_created_and_its_monthly_price(capsys, runpod_emulator):
    base = ["launch", "--provider", "runpod", "--profile", "rtx4090", "--dry-run", "--volume", "corpus"]
    code, out, err = cli(capsys, *base, "--volume-size", "100")
    assert code == 0, err
    assert "else created (100 GB" in out and "$7.00/month" in out and "kept after the run" in out
    code, out, err = cli(capsys, *base, "--volume-size", "1500", "--json")
    assert code == 0, err
    # 1,000 GB at $0.07 and the 500 GB beyond at $0.05 (RunPod's published tiers)
    assert json.loads(out)["volume"] == {"name": "corpus", "create_size_gb": 1500, "create_usd_per_month": 95.0}
    assert runpod_emulator.volumes == {}  # a dry run creates nothing


def test_prepare_status_from_progress_rows():
    t0 = 1_000_000.0
    download = [{"time": t0, "phase": "download", "bytes": 0, "total_bytes": 400_000_000, "mb_per_s": 0.0},
                {"time": t0 + 10, "phase": "download", "bytes": 100_000_000, "total_bytes": 400_000_000,
                 "mb_per_s": 10.0}]
    st = summarize_prepare(download, price=3.6, training_started=False, now=t0 + 20)
    assert st is not None and st.phase == "downloading" and st.bytes_read == 100_000_000
    assert st.eta_s == pytest.approx(30.0) and st.elapsed_s == pytest.approx(20.0)
    assert st.cost_usd == pytest.approx(0.02)
    preparing = download + [{"kind": "prepare", "time": t0 + 70, "bytes_read": 50_000_000,
                             "bytes_total": 400_000_000, "tokens": 12_000_000, "mb_s": 5.0, "elapsed_s": 10.0,
                             "eta_s": 70.0}]
    st = summarize_prepare(preparing, price=None, training_started=False, now=t0 + 75)
    assert st is not None and (st.phase, st.tokens, st.mb_per_s, st.eta_s) == ("preparing", 12_000_000, 5.0, 70.0)
    assert st.elapsed_s == pytest.approx(75.0) and st.cost_usd is None
    done = preparing + [{"kind": "prepare", "time": t0 + 140, "bytes_read": 400_000_000, "bytes_total": 400_000_000,
                         "tokens": 95_000_000, "mb_s": 5.0, "elapsed_s": 80.0, "eta_s": 0.0, "done": True}]
    st = summarize_prepare(done, price=3.6, training_started=False, now=t0 + 9999)
    assert st is not None and st.phase == "done" and st.elapsed_s == pytest.approx(140.0)  # stops at its end
    assert st.cost_usd == pytest.approx(0.14) and st.tokens == 95_000_000
    failed = download + [{"time": t0 + 12, "phase": "failed", "error": "HTTP 404 for part-3"}]
    st = summarize_prepare(failed, price=1.0, training_started=False, now=t0 + 50)
    assert st is not None and st.phase == "failed" and st.error == "HTTP 404 for part-3"
    # Prepared data reused from a volume: only the hash rows, then training: the step is over.
    hashed = [{"time": t0, "phase": "hash", "bytes": 5, "total_bytes": None, "mb_per_s": 1.0}]
    st = summarize_prepare(hashed, price=1.0, training_started=True, now=t0 + 50)
    assert st is not None and st.phase == "done" and st.elapsed_s == 0.0
    assert summarize_prepare([], price=1.0, training_started=True) is None


class SlowServer:
    """One text file over HTTP, sent in small pieces with a pause between them: a download that
    takes seconds, long enough for status to see it under way."""

    def __init__(self, body: bytes, piece: int = 32 << 10, pause_s: float = 0.25) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(0, len(body), piece):
                    try:
                        self.wfile.write(body[i:i + piece])
                        self.wfile.flush()
                    except OSError:
                        return  # the run was stopped mid-download
                    time.sleep(pause_s)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/corpus.txt"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_status_shows_a_download_under_way(capsys, tmp_path, runpod_emulator):
    """A run whose data step is still going: status reads its progress rows over SSH as they come."""
    emu = runpod_emulator
    body = "".join(f"line {j}: a corpus that arrives slowly.\n" for j in range(30000)).encode()  # ~1.2 MB, ~10 s
    server = SlowServer(body)
    try:
        # --no-preflight: the preflight's download check would refuse this source, slow on purpose
        # (tests/e2e/data/test_download_check.py holds it to the bar)
        code, _, err = cli(capsys, *volume_launch(tmp_path, "--data", server.url, "--name", "slowdata",
                                                  "--workdir", str(tmp_path / "pod" / "slowdata"),
                                                  "--no-preflight"))
        assert code == 0, err

        def under_way():
            code, out, _ = cli(capsys, "status", "slowdata", "--json")
            p = json.loads(out).get("prepare") if code == 0 else None
            return p if p and p["phase"] == "downloading" and (p["bytes_read"] or 0) > 0 else None

        p = wait_for(under_way, 120, "the download under way in status", interval=0.3)
        # still in its download phase; under load the last row may already count every byte
        assert 0 < p["bytes_read"] <= len(body) and p["elapsed_s"] >= 0
        price = runs.load("slowdata").price_per_hour_usd  # the billed price, read back after create
        assert price == pytest.approx(0.34 + (20 + 50) * 0.10 / 730, abs=1e-4)
        assert p["cost_usd"] == pytest.approx(p["elapsed_s"] / 3600 * price, rel=1e-6)
        code, out, _ = cli(capsys, "status", "slowdata")
        assert code == 0 and "data prep" in out and "so far" in out
        code, _, err = cli(capsys, "down", "slowdata")
        assert code == 0, err
    finally:
        server.close()
    assert emu.ledger.alive() == set()


def test_resume_trains_on_from_the_volume_when_the_mirror_is_behind(capsys, tmp_path, runpod_emulator,
                                                                     monkeypatch):
    emu = runpod_emulator
    volume_id = emu.create_volume("ckpts", "EU-RO-1")
    store = emu.volume_dir(volume_id)
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(store))
    data = corpus(tmp_path / "laptop" / "corpus")
    name = "volspot"
    code, _, err = cli(capsys, *volume_launch(tmp_path, "--volume", "ckpts", "--data", str(data), "--name", name))
    assert code == 0, err
    first = runs.load(name)

    def mirrored():
        code, _, err = cli(capsys, "mirror", name)
        assert code == 0, err
        return newest_good(name)

    mirror = wait_for(mirrored, 180, "a mirrored checkpoint")
    mirror_step = json.loads((mirror / "meta.json").read_text())["step"]
    workdir = Path(first.workdir)

    def volume_ahead():
        steps = [json.loads((d / "meta.json").read_text())["step"] for d in (workdir / "checkpoints").glob("step_*")
                 if (d / "meta.json").exists()]
        return max(steps) if steps and max(steps) >= mirror_step + 10 else None

    ahead = wait_for(volume_ahead, 180, "a checkpoint on the volume past the mirror's")
    emu.preempt(first.instance_id)  # RunPod stops the pod; the volume (and the run folder on it) stays
    code, out, err = cli(capsys, "status", name, "--json")
    assert code == 0 and json.loads(out)["state"].startswith("preempted")
    held = max(json.loads((d / "meta.json").read_text())["step"] for d in (workdir / "checkpoints").glob("step_*")
               if (d / "meta.json").exists())
    assert held >= ahead

    code, _, err = cli(capsys, "resume", name)
    assert code == 0, err
    err = " ".join(err.split())  # the console wraps long lines
    assert f"resuming from step_{held:06d} (step {held}) on the network volume" in err
    assert f"the mirror on this machine is at step {mirror_step}, not uploaded" in err
    assert "restoring checkpoint" not in err  # nothing was uploaded
    second = runs.load(name)
    assert second.instance_id != first.instance_id and second.previous_instances == (first.instance_id,)
    assert emu.pod_volumes()[second.instance_id] == volume_id

    def resumed_and_going():
        rows = rows_of(capsys, name)
        resumed = [r for r in rows if r.get("event") == "resumed"]
        after = [r for r in rows if r.get("kind") == "train" and resumed and r["step"] > resumed[-1]["step"]]
        return (rows, resumed) if len(after) >= 2 else None

    rows, resumed = wait_for(resumed_and_going, 180, "training to go on from the volume's step")
    assert resumed[-1]["step"] == held > mirror_step
    steps = [r["step"] for r in rows if r.get("kind") == "train"]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # the curve joins up at the volume's step
    assert mirror_root(name).exists()
    down(capsys, name)
    assert emu.ledger.alive() == set()


def _checkpoint(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"w" * 10)
    # a complete manifest (the weights and their sha256): one with no files is not a checkpoint
    digest = hashlib.sha256(b"w" * 10).hexdigest()
    (folder / "meta.json").write_text(json.dumps({"step": step, "files": {"model.pt": digest}}))
    return folder


def test_the_mirror_is_uploaded_when_the_volume_is_behind_or_empty(tmp_path):
    from gpucli.providers.local.target import LocalHost
    from gpucli.run.life.lifecycle import choose_restore

    run = tmp_path / "volume" / "gpucli-runs" / "r"
    mirror = _checkpoint(tmp_path / "mirror" / "step_000020", 20)
    said: list[str] = []
    with LocalHost() as host:
        # Nothing of the run on the volume: the mirror goes up.
        assert choose_restore(host, str(run), mirror, on_step=said.append) == (mirror, True)
        assert "the network volume has no checkpoint of the run" in said[-1]
        # The volume is behind the mirror: the mirror goes up, and the metrics are cut back to its step.
        _checkpoint(run / "checkpoints" / "step_000010", 10)
        rows = [{"kind": "train", "step": s} for s in range(1, 31)] + [{"kind": "event", "event": "x"}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert choose_restore(host, str(run), mirror, on_step=said.append) == (mirror, True)
        assert "has only step_000010" in said[-1]
        kept = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in kept if r.get("kind") == "train"] == list(range(1, 21))
        assert kept[-1] == {"kind": "event", "event": "x"}  # rows without a step stay
        # As far as the mirror, or past it: the volume wins and nothing goes up.
        _checkpoint(run / "checkpoints" / "step_000020", 20)
        assert choose_restore(host, str(run), mirror, on_step=said.append) == (None, True)
        _checkpoint(run / "checkpoints" / "step_000025", 25)
        assert choose_restore(host, str(run), mirror, on_step=said.append) == (None, True)
        assert "resuming from step_000025 (step 25) on the network volume" in said[-1]
        # No mirror at all: the volume's checkpoint; nothing anywhere: nothing to resume from.
        assert choose_restore(host, str(run), None) == (None, True)
        assert choose_restore(host, str(tmp_path / "elsewhere"), None) == (None, False)
