"""The pod's data step (gpucli/pod/fetch.py) against a real local HTTP server: a download cut mid-file
and resumed with a Range request, sha256 verification, a URL list fetched in parallel and prepared,
and prepared data reused from a cache by content hash.  Also ``--data`` parsing."""

from __future__ import annotations

import hashlib
import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpucli.errors import UsageError
from gpucli.pod import fetch
from gpucli.run.inputs.datasources import parse_data, pod_plan

ROOT = Path(__file__).resolve().parents[3]


class FileServer:
    """Serves ``files`` (path -> bytes) with Range support; ``cut[path] = n`` makes the next ``n``
    whole-file answers stop after half the body (the connection closes: a lost link)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.cut: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):  # noqa: N802
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                if start == 0 and server.cut.get(self.path, 0) > 0:
                    server.cut[self.path] -= 1
                    self.wfile.write(part[: len(part) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(part)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def text_bytes(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "token", "shard", "volume", "pod", "data", "train"]
    out, size = [], 0
    while size < n:
        line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
        out.append(line)
        size += len(line)
    return "".join(out).encode()[:n]


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_a_download_cut_mid_file_resumes_with_range_and_is_verified(tmp_path):
    body = text_bytes(3_000_000, 1)
    with FileServer({"/corpus/big.txt": body}) as srv:
        srv.cut["/corpus/big.txt"] = 1
        progress = fetch.Progress(tmp_path / "prepare.jsonl", every_s=0.0)
        got = fetch.download(f"{srv.url}/corpus/big.txt", sha(body), tmp_path / "big.txt", progress,
                             sleep=lambda s: None)
    assert got == "downloaded"
    assert (tmp_path / "big.txt").read_bytes() == body
    assert not (tmp_path / "big.txt.part").exists()
    # The first answer stopped after half the file; the second asked for exactly the rest.
    assert srv.requests[0] == ("/corpus/big.txt", None)
    assert srv.requests[1] == ("/corpus/big.txt", f"bytes={len(body) // 2}-")
    rows = [json.loads(x) for x in (tmp_path / "prepare.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["bytes"] == len(body)  # every byte counted once across the two answers


def test_a_killed_fetch_continues_from_its_part_file(tmp_path):
    """A pod restarted mid-download: the .part on disk is kept and only the rest is asked for."""
    body = text_bytes(1_500_000, 2)
    raw = tmp_path / "data" / "src"
    raw.mkdir(parents=True)
    (raw / "big.txt.part").write_bytes(body[:1_000_000])
    with FileServer({"/big.txt": body}) as srv:
        progress = fetch.Progress(tmp_path / "p.jsonl")
        fetch.download_all([{"url": f"{srv.url}/big.txt", "sha256": sha(body)}], raw, progress)
        assert srv.requests == [("/big.txt", "bytes=1000000-")]
        # Run again: the verified file is kept, nothing is downloaded.
        fetch.download_all([{"url": f"{srv.url}/big.txt", "sha256": sha(body)}], raw, progress)
        assert len(srv.requests) == 1
    assert (raw / "big.txt").read_bytes() == body


def test_a_sha256_mismatch_is_refused_and_the_partial_file_removed(tmp_path):
    body = text_bytes(200_000, 3)
    with FileServer({"/x.txt": body}) as srv:
        progress = fetch.Progress(tmp_path / "p.jsonl")
        with pytest.raises(fetch.FetchError, match="sha256 mismatch"):
            fetch.download(f"{srv.url}/x.txt", "0" * 64, tmp_path / "x.txt", progress)
        with pytest.raises(fetch.FetchError, match="HTTP 404"):
            fetch.download(f"{srv.url}/missing.txt", None, tmp_path / "m.txt", progress)
    assert not (tmp_path / "x.txt").exists() and not (tmp_path / "x.txt.part").exists()


def _spec(run_dir: Path, source, *, cache_root: str | None) -> Path:
    data = {"tokenizer": "byte", "shard_tokens": 65536, "min_val_tokens": 1000, "workers": 1}
    plan = pod_plan(source, data, python=sys.executable, cache_root=cache_root)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "datasource.json"
    path.write_text(json.dumps(plan))
    return path


def test_a_url_list_is_fetched_in_parallel_prepared_and_reused_from_the_cache(tmp_path, monkeypatch):
    files = {f"/shard-{i}.jsonl": "".join(json.dumps({"text": text_bytes(3000, 10 * i + j).decode()}) + "\n"
                                          for j in range(40)).encode() for i in range(3)}
    monkeypatch.chdir(ROOT)  # fetch.py runs from <run>/code, where `trainer` is importable
    with FileServer(files) as srv:
        listing = tmp_path / "urls.txt"
        listing.write_text("# three shards\n" + "".join(f"{srv.url}{p} {sha(b)}\n" for p, b in files.items()))
        source = parse_data(str(listing))
        assert source.kind == "url" and len(source.downloads) == 3
        cache = tmp_path / "volume"
        assert fetch.main(["--spec", str(_spec(tmp_path / "run1", source, cache_root=str(cache)))]) == 0
        prepared = tmp_path / "run1" / "data" / "prepared"
        meta = json.loads((prepared / "meta.json").read_text())
        text_bytes_total = sum(len(json.loads(line)["text"]) for b in files.values() for line in b.splitlines())
        # bytes tokenizer: a token per byte plus one end-of-text per document
        assert meta["train_tokens"] + meta["val_tokens"] == text_bytes_total + 120
        assert meta["tokenizer"] == "byte" and meta["val_tokens"] >= 1000
        keyed = prepared.resolve()
        assert keyed.parent == (cache / "gpucli-data").resolve()  # on the volume, under its content hash
        stamp = (keyed / "meta.json").stat().st_mtime_ns
        # A second run with the same inputs and options reuses it: the same folder, not prepared again.
        assert fetch.main(["--spec", str(_spec(tmp_path / "run2", source, cache_root=str(cache)))]) == 0
    assert (tmp_path / "run2" / "data" / "prepared").resolve() == keyed
    assert (keyed / "meta.json").stat().st_mtime_ns == stamp
    for name, body in files.items():
        assert (tmp_path / "run2" / "data" / "src" / name.lstrip("/")).read_bytes() == body
    # Other options are another key: the same files with another shard size are prepared anew.
    raw = tmp_path / "run2" / "data" / "src"
    progress = fetch.Progress(tmp_path / "p.jsonl")
    assert fetch.content_key(raw, ["--shard-tokens", "70000"], progress) != keyed.name
    assert fetch.content_key(raw, json.loads((tmp_path / "run2" / "datasource.json").read_text())["prepare_args"],
                             progress) == keyed.name


def test_a_missing_pod_path_fails_with_one_line(tmp_path, capsys):
    spec = _spec(tmp_path / "run", parse_data(f"pod:{tmp_path / 'nowhere'}"), cache_root=None)
    assert fetch.main(["--spec", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "does not exist on this machine" in err and "Traceback" not in err


@pytest.mark.parametrize(("spec", "needle"), [
    ("hf://models/org/name", "expected hf://datasets/ORG/NAME"),
    ("hf://datasets/org", "expected hf://datasets/ORG/NAME"),
    ("ftp://host/file", "unknown scheme"),
    ("https://host/x.txt#md5=abc", "only fragment understood is #sha256"),
    ("https://host/x.txt#sha256=123", "is not a sha256"),
    ("pod:relative/path", "absolute path"),
    ("{missing}", "not a folder"),
    ("{badlist}", "line 2: 'notaurl' is not an http(s) URL"),
])
def test_bad_data_specs_are_one_line_errors(tmp_path, spec, needle):
    (tmp_path / "bad.txt").write_text("https://host/a.txt\nnotaurl\n")
    spec = spec.replace("{missing}", str(tmp_path / "missing")).replace("{badlist}", str(tmp_path / "bad.txt"))
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_data(spec)


def test_good_data_specs():
    hf = parse_data("hf://datasets/allenai/dolmino-mix-1124/data/math/*.jsonl.gz")
    assert (hf.kind, hf.repo, hf.pattern) == ("hf", "allenai/dolmino-mix-1124", "data/math/*.jsonl.gz")
    url = parse_data("https://example.org/a.txt#sha256=" + "A" * 64)
    assert url.downloads[0].sha256 == "a" * 64 and url.downloads[0].url == "https://example.org/a.txt"
    pod = parse_data("pod:/workspace/corpus/")
    assert pod.pod_path == "/workspace/corpus" and pod.pod_input == "/workspace/corpus" and not pod.uploads


def test_the_watchdog_counts_data_progress_as_progress(tmp_path):
    """Hours of downloading and preparing write prepare.jsonl, not metrics rows: not a stall."""
    import os

    from gpucli.pod import watchdog

    started = 1_000_000.0
    assert watchdog.last_progress(tmp_path, started) == started
    (tmp_path / "prepare.jsonl").write_text("{}\n")
    os.utime(tmp_path / "prepare.jsonl", (started + 500, started + 500))
    assert watchdog.last_progress(tmp_path, started) == started + 500
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    os.utime(tmp_path / "metrics.jsonl", (started + 900, started + 900))
    assert watchdog.last_progress(tmp_path, started) == started + 900
