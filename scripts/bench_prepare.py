"""Throughput and peak memory of ``python -m trainer.prepare`` against the bare encoder.

    python scripts/bench_prepare.py [--mb 200] [--bpe-mb 40] [--workers 1,2] [--dir DIR]
    python scripts/bench_prepare.py --mb 5000 --tokenizers bytes --formats text --workers 2   # 5 GB peak RSS

Generates a corpus of random words (plain text, and the same records as 4 .jsonl.gz files), then
times the whole pipeline (read, decompress, encode, write shards and provenance) per tokenizer,
format and worker count, and the ``tokenizers`` library's own ``encode_batch`` over the same text
held in memory, as whole documents (what the pipeline encodes) and as lines (what it encoded until
it encoded whole documents), with as many threads as the pipeline has workers. Peak RSS is the largest of the main process and any worker.
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_PEAK = """import resource, runpy, sys
rc = 0
try:
    runpy.run_module("trainer.prepare", run_name="__main__")
except SystemExit as e:
    rc = e.code
r = resource.getrusage
print("PEAK_RSS_KB", max(r(resource.RUSAGE_SELF).ru_maxrss, r(resource.RUSAGE_CHILDREN).ru_maxrss), file=sys.stderr)
sys.exit(rc)
"""

_BARE = """import os, sys, time, resource
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
if sys.argv[3] == "tiktoken":  # the same vocabulary on tiktoken, as the pipeline builds it
    sys.path.insert(0, os.environ["REPO"])
    from trainer.data.fastbpe import from_tokenizer_json
    fast = from_tokenizer_json(open(sys.argv[1]).read(), 0)
    tok.encode_batch = lambda texts, add_special_tokens: [type("E", (), {"ids": x}) for x in
                                                          fast.enc.encode_ordinary_batch(texts, num_threads=1)]
lines = open(sys.argv[2], encoding="utf-8").read().splitlines(keepends=True)
if sys.argv[3] != "lines":  # the pipeline's documents of a plain text file: 200-line segments
    lines = ["".join(lines[i : i + 200]) for i in range(0, len(lines), 200)]
t = time.perf_counter()
n = 0
for i in range(0, len(lines), 4096 if sys.argv[3] == "lines" else 64):
    n += sum(len(e.ids) for e in tok.encode_batch(lines[i : i + (4096 if sys.argv[3] == "lines" else 64)],
                                                   add_special_tokens=False))
print(time.perf_counter() - t, n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def generate(root: Path, mb: int, seed: int, jsonl: bool = True) -> tuple[Path, Path]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10)))
             for _ in range(20_000)]
    text, jdir = root / f"text{mb}" / "corpus.txt", root / f"jsonl{mb}"
    text.parent.mkdir(parents=True)
    jdir.mkdir()
    outs = [gzip.open(jdir / f"part{i}.jsonl.gz", "wt", compresslevel=1) for i in range(4)] if jsonl else []
    written, k = 0, 0
    with open(text, "w") as f:
        while written < mb * 1_000_000:
            doc = "\n".join(" ".join(rng.choices(vocab, k=rng.randint(5, 20))) for _ in range(rng.randint(1, 30)))
            f.write(doc + "\n")
            if outs:
                outs[k % 4].write(json.dumps({"text": doc + "\n"}) + "\n")
            written += len(doc) + 1
            k += 1
    for o in outs:
        o.close()
    return text.parent, jdir


def run(inp: Path, out: Path, workers: int, tok: list[str]) -> tuple[float, int, dict]:
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _PEAK, "--input", str(inp), "--out", str(out), "--workers",
                        str(workers), *tok], cwd=REPO, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    peak = int(r.stderr.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) * 1024
    return dt, peak, json.loads((out / "meta.json").read_text())


def bare(tok_file: Path, text: Path, threads: int, unit: str = "docs") -> tuple[float, int]:
    """The encoder alone on the text in memory: tiktoken or the ``tokenizers`` library on whole
    documents (what the pipeline encodes), or tokenizers on lines (what it encoded before)."""
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "REPO": str(REPO)}
    r = subprocess.run([sys.executable, "-c", _BARE, str(tok_file), str(text), unit], env=env, capture_output=True,
                       text=True, check=True)
    dt, n, _ = r.stdout.split()
    return float(dt), int(n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="corpus size for the byte tokenizer")
    ap.add_argument("--bpe-mb", type=int, default=40, help="corpus size for BPE (it is ~20x slower)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--formats", default="text,jsonl.gz", help="inputs to time: text, jsonl.gz")
    ap.add_argument("--tokenizers", default="bytes,bpe", help="bytes, bpe (a 5 GB memory check: bytes, text)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    args = ap.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    workers = [int(w) for w in args.workers.split(",")]
    rows = []
    try:
        formats = [f for f in args.formats.split(",") if f]
        tokenizers = [t for t in args.tokenizers.split(",") if t]
        if not set(formats) <= {"text", "jsonl.gz"} or not set(tokenizers) <= {"bytes", "bpe"} or not formats:
            raise SystemExit("--formats: text,jsonl.gz; --tokenizers: bytes,bpe")
        big = generate(root, args.mb, 0, jsonl="jsonl.gz" in formats)
        cases = [("bytes", big, [])] if "bytes" in tokenizers else []
        if "bpe" in tokenizers:
            small = generate(root, args.bpe_mb, 1) if args.bpe_mb != args.mb else big
            # the BPE every BPE case uses, trained once on a sample of the small corpus
            _, _, m = run(small[0], root / "bpe-train", 2, ["--tokenizer", "bpe", "--vocab-size", "8000",
                                                             "--tokenizer-sample", "20000000"])
            tok_file = root / "bpe.json"
            shutil.copyfile(root / "bpe-train" / "tokenizer.json", tok_file)
            cases.append(("BPE 8k", small, ["--tokenizer", str(tok_file)]))
        for name, (text_dir, jdir), tok in cases:
            mb = sum(f.stat().st_size for f in text_dir.rglob("*")) / 1e6
            for fmt, inp in [c for c in (("text", text_dir), ("jsonl.gz", jdir)) if c[0] in formats]:
                for w in workers:
                    dt, peak, meta = run(inp, root / "out", w, tok)
                    toks = meta["train_tokens"] + meta["val_tokens"]
                    rows.append((name, fmt, w, mb, dt, mb / dt, toks / dt / 1e6, peak / 1e6))
                    print(f"{name} {fmt} {w}w: {dt:.1f}s {mb / dt:.1f} MB/s peak {peak / 1e6:.0f} MB",
                          file=sys.stderr, flush=True)
            if tok:
                units = {"tiktoken": "bare tiktoken (the trained merges) on whole documents",
                         "docs": "bare tokenizers encode_batch of whole documents",
                         "lines": "bare tokenizers encode_batch of lines"}
                for unit, label in units.items():
                    for threads in workers if unit != "tiktoken" else [1]:
                        dt, n = bare(tok_file, text_dir / "corpus.txt", threads, unit)
                        rows.append((name, f"{label}, in memory", threads, mb, dt, mb / dt, n / dt / 1e6, 0))
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print("| tokenizer | input | workers/threads | text MB | seconds | text MB/s | Mtok/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, fmt, w, mb, dt, rate, mtok, peak in rows:
        print(f"| {name} | {fmt} | {w} | {mb:.0f} | {dt:.1f} | {rate:.1f} | {mtok:.2f} | {peak:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
