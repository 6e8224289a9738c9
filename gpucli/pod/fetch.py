"""gpucli's pod-side data step: fetch the run's inputs, then prepare them, before the trainer starts.

Started by ``gpucli launch`` in the same process group as the trainer (``fetch.py && trainer``), so
the watchdog that limits the run's hours and dollars also limits this; standard library only:

    python3 fetch.py --spec ../datasource.json        (from <run>/code, as the trainer)

The spec (written by gpucli/run/inputs/datasources.py) says where the data is:
- ``local``: already synced to ``<run>/data/src``;
- ``pod``: a path on this machine or a mounted volume; it must exist;
- ``url``: files downloaded into ``<run>/data/src`` in parallel, each resumed from its ``.part`` with
  an HTTP Range request after a cut, verified against its sha256 when one is given;
- ``hf``: a Hugging Face dataset downloaded with ``huggingface_hub`` (``HF_TOKEN`` from the env file).
Then ``python -m trainer.prepare`` on every core writes ``<run>/data/prepared`` (with its progress in
``<run>/prepare.jsonl``). With a ``cache_root`` (a network volume), prepared data lives under
``cache_root/<content hash of the raw files and the prepare options>`` and is reused by later runs.
Exit status: 0 ready; 2 the data cannot be had (message on stderr); prepare's own status otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import importlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ATTEMPTS = 6  # per file; each resumes where the last one stopped
CHUNK = 1 << 20
TIMEOUT_S = 60.0
KEY_VERSION = "gpucli-prepared-v1"


class FetchError(Exception):
    """The data cannot be had; the message says why (one line)."""


class Progress:
    """JSON lines in the run folder (the watchdog counts a fresh line as progress) and stderr lines
    (the console log that ``gpucli tail`` shows), at most every ``every_s`` seconds."""

    def __init__(self, path: Path, every_s: float = 2.0) -> None:
        self.path, self.every_s = path, every_s
        self.lock = threading.Lock()
        self.done_bytes = 0
        self.total_bytes = 0
        self.files_done = 0
        self.phase = "start"
        self.started = time.monotonic()
        self.last = 0.0

    def add(self, n: int) -> None:
        with self.lock:
            self.done_bytes += n
        self.tick()

    def start_phase(self, phase: str) -> None:
        with self.lock:
            self.phase, self.done_bytes, self.total_bytes = phase, 0, 0
            self.started = time.monotonic()

    def file_done(self) -> None:
        with self.lock:
            self.files_done += 1

    def tick(self, force: bool = False, **extra: Any) -> None:
        now = time.monotonic()
        with self.lock:
            if not force and now - self.last < self.every_s:
                return
            self.last = now
            elapsed = max(1e-9, now - self.started)
            row: dict[str, Any] = {"time": time.time(), "phase": self.phase, "bytes": self.done_bytes,
                   "total_bytes": self.total_bytes or None, "files_done": self.files_done,
                   "mb_per_s": round(self.done_bytes / elapsed / 1e6, 3), **extra}
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        total = f" of {row['total_bytes'] / 1e6:.1f}" if row["total_bytes"] else ""
        say(f"{self.phase}: {row['bytes'] / 1e6:.1f}{total} MB, {row['mb_per_s']} MB/s")


def say(message: str) -> None:
    print(f"fetch: {message}", file=sys.stderr, flush=True)


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                return h.hexdigest()
            h.update(block)
            if progress is not None:
                progress.add(len(block))


# ---- downloads -----------------------------------------------------------------------------------


def local_names(urls: list[str]) -> list[str]:
    """A file name per URL: its last path segment (so .jsonl.gz and friends keep their suffixes),
    made safe, numbered where two would collide."""
    names: list[str] = []
    for i, url in enumerate(urls):
        base = urllib.request.url2pathname(url.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1])
        base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".") or "download"
        names.append(base if base not in names else f"{i:05d}-{base}")
    return names


def _content_range_start(value: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-", value or "")
    return int(m.group(1)) if m else None


def download(url: str, sha256: str | None, dest: Path, progress: Progress, *, sleep=time.sleep) -> str:
    """One file into ``dest``, resumed from ``dest.part``; 'kept' when a verified copy is there."""
    if dest.exists():
        if sha256 is None or sha256_file(dest) == sha256:
            progress.file_done()
            return "kept"
        dest.unlink()
    part = dest.with_name(dest.name + ".part")
    last_error = ""
    for attempt in range(ATTEMPTS):
        have = part.stat().st_size if part.exists() else 0
        headers = {"User-Agent": "gpucli-fetch/1", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S) as resp:
                if have and (resp.status != 206 or _content_range_start(resp.headers.get("Content-Range")) != have):
                    have = 0  # the server sent the whole file: start over
                length = resp.headers.get("Content-Length")
                expected = have + int(length) if length and length.isdigit() else None
                with open(part, "ab" if have else "wb") as fh:
                    while True:
                        block = resp.read(CHUNK)
                        if not block:
                            break
                        fh.write(block)
                        progress.add(len(block))
            if expected is not None and part.stat().st_size != expected:
                raise http.client.IncompleteRead(b"", expected - part.stat().st_size)
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and have:  # nothing left past what we have: the .part is whole
                break
            if exc.code < 500 and exc.code not in (408, 429):
                raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
            last_error = f"HTTP {exc.code}"
        except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        say(f"{url}: {last_error}; resuming (attempt {attempt + 2} of {ATTEMPTS})")
        sleep(min(30.0, 0.5 * 2 ** attempt))
    else:
        raise FetchError(f"{url}: gave up after {ATTEMPTS} attempts ({last_error})")
    if sha256 is not None:
        got = sha256_file(part)
        if got != sha256:
            part.unlink()
            raise FetchError(f"{url}: sha256 mismatch (expected {sha256}, got {got}); the partial file was removed")
    os.replace(part, dest)
    progress.file_done()
    return "downloaded"


def download_all(items: list[dict], raw: Path, progress: Progress, threads: int = 8) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    names = local_names([d["url"] for d in items])
    progress.start_phase("download")
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        futures = [pool.submit(download, d["url"], d.get("sha256"), raw / n, progress)
                   for d, n in zip(items, names, strict=True)]
        errors = [str(f.exception()) for f in futures if f.exception() is not None]
    if errors:
        raise FetchError(errors[0] + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    progress.tick(force=True)


def hf_download(repo: str, pattern: str | None, raw: Path, progress: Progress) -> None:
    try:  # optional, only for hf:// data (by name: everything else here is the standard library)
        snapshot_download = importlib.import_module("huggingface_hub").snapshot_download
    except ImportError:
        raise FetchError("hf:// data needs the huggingface_hub package on the pod, and it is not installed "
                         "(pip install huggingface_hub)") from None
    raw.mkdir(parents=True, exist_ok=True)
    progress.start_phase("download")
    stop = threading.Event()

    def beat() -> None:  # snapshot_download reports nothing we can read: count the bytes on disk
        while not stop.wait(progress.every_s):
            with progress.lock:
                progress.done_bytes = sum(f.stat().st_size for f in raw.rglob("*") if f.is_file())
            progress.tick()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        snapshot_download(repo_id=repo, repo_type="dataset", allow_patterns=pattern, local_dir=str(raw),
                          token=os.environ.get("HF_TOKEN") or None, max_workers=max(8, os.cpu_count() or 1))
    except Exception as exc:  # the hub's errors are many; the message says which
        raise FetchError(f"hf://datasets/{repo}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
    finally:
        stop.set()
        thread.join()


# ---- preparation ---------------------------------------------------------------------------------


def input_files(raw: Path) -> list[Path]:
    if raw.is_file():
        return [raw]
    return sorted(p for p in raw.rglob("*") if p.is_file() and not p.name.endswith(".part"))


def content_key(raw: Path, prepare_args: list[str], progress: Progress) -> str:
    """sha256 over the raw files' contents (with their relative names) and the preparation options:
    the same inputs and tokenizer give the same key, wherever they were fetched from."""
    progress.start_phase("hash")
    h = hashlib.sha256(KEY_VERSION.encode())
    h.update(json.dumps(prepare_args).encode())
    for f in input_files(raw):
        rel = f.name if raw.is_file() else f.relative_to(raw).as_posix()
        h.update(f"\0{rel}\0{f.stat().st_size}\0{sha256_file(f, progress)}".encode())
    return h.hexdigest()[:32]


def link(prepared: Path, target: Path) -> None:
    """``prepared`` -> ``target`` (a symlink, replaced if it pointed elsewhere)."""
    if prepared.is_symlink():
        if Path(os.readlink(prepared)) == target:
            return
        prepared.unlink()
    elif prepared.exists():
        return  # a real folder from an earlier attempt: the trainer reads it as it is
    prepared.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, prepared)


def run_prepare(python: str, raw: Path, out: Path, args: list[str], progress_path: Path) -> None:
    cmd = [python, "-m", "trainer.prepare", "--input", str(raw), "--out", str(out), *args,
           "--progress-file", str(progress_path)]
    say(f"preparing {raw} -> {out}")
    code = subprocess.call(cmd)  # stderr goes to the console log; a kill resumes from finished shards
    if code != 0:
        raise SystemExit(code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, type=Path, help="datasource.json in the run folder")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    run_dir = args.spec.resolve().parent
    progress_path = run_dir / spec["progress_file"]
    progress = Progress(progress_path)
    raw = run_dir / spec["raw_dir"]
    prepared = run_dir / spec["prepared_dir"]
    try:
        kind = spec["kind"]
        if kind == "pod":
            raw = Path(os.path.expanduser(spec["pod_path"]))
            if not raw.exists():
                raise FetchError(f"pod:{spec['pod_path']} does not exist on this machine")
        elif kind == "url":
            download_all(spec["downloads"], raw, progress)
        elif kind == "hf":
            hf_download(spec["repo"], spec.get("pattern"), raw, progress)
        elif not raw.exists():
            raise FetchError(f"{raw} is missing: the data was not synced")
        if (prepared / "meta.json").exists():
            say(f"prepared data already in {prepared}")
            return 0
        if (raw / "meta.json").exists():  # a folder trainer.prepare already wrote
            link(prepared, raw.resolve())
            say(f"using the prepared data in {raw}")
            return 0
        if not input_files(raw):
            raise FetchError(f"no input files in {raw}")
        if spec.get("cache_root"):
            key = content_key(raw, spec["prepare_args"], progress)
            target = Path(spec["cache_root"]) / key
            if (target / "meta.json").exists():
                say(f"reusing prepared data {target} (same inputs and options)")
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                run_prepare(spec["python"], raw, target, spec["prepare_args"], progress_path)
            link(prepared, target)
        else:
            run_prepare(spec["python"], raw, prepared, spec["prepare_args"], progress_path)
    except FetchError as exc:
        say(f"error: {exc}")
        with open(progress_path, "a") as fh:
            fh.write(json.dumps({"time": time.time(), "phase": "failed", "error": str(exc)}) + "\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
