"""Throughput and peak memory of ``python -m trainer.prepare`` against the bare encoder.

    python scripts/bench_prepare.py [--mb 200] [--bpe-mb 40] [--workers 1,2] [--dir DIR]
    python scripts/bench_prepare.py --mb 5000 --tokenizers bytes --formats text --workers 2   # 5 GB peak RSS

Generates a corpus of random words (plain text, and the same records as 4 .jsonl.gz files), then
times the whole pipeline (read, decompress, encode, write shards and provenance) per tokenizer,
format and worker count, and the ``tokenizers`` library's own ``encode_batch`` over the same text
held in memory, as whole documents (what the pipeline encodes) and as lines (what it encoded until
it encoded whole documents), with as many threads as the pipeline has workers. Peak RSS is the largest of the main process and any worker.
Prints a Markdown table.

With BPE it then runs ``--pairs`` rounds of the pipeline (one worker) against bare tiktoken on the same
vocabulary and the same text (see ``_TIKTOKEN``), one process each, one thread each, in rotating
order, and prints the median ratio of each round's figures (wall and CPU seconds, which a loaded host
disturbs less) with the load average: a fair per-core comparison on a busy machine.

A host whose speed drifts (a shared VM: tens of percent within seconds) still moves those ratios, as
each compares two processes run a minute apart. So each process also reports its *encoder share*: the
CPU seconds inside its tiktoken encode calls (I) over its whole CPU seconds (T, getrusage at its end:
start, imports, reading, everything). Both processes make the same encode calls on the same documents
(the token counts are checked), so I is the same work in each, a yardstick measured in the same
process as T, the two alternating every few milliseconds: drift scales both alike and cancels in
I/T. Not quite all of T alternates: the start (imports, building the encoder, the pipeline's encoder
check), a few tenths of a second, runs before the first call, and drift between it and the rest
still moves the share a little. The pipeline's I_p/T_p estimates pipeline ÷ bare encode loop, the
bare command's I_b/T_b bare whole command ÷ its loop, and (I_p/T_p)/(I_b/T_b) = (T_b/I_b)/(T_p/I_p)
pipeline ÷ bare whole command. It assumes an encode call costs the same in both; where the
pipeline's other work slowed its calls (caches), that would count as encoder time and flatter the
pipeline: the median of I_b/I_p across processes (noisy, unbiased) is printed as a check.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import shutil
import statistics
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

_BARE = """import sys, time, resource
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
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

# The bare encoder as a user of a trained BPE would run it: build tiktoken from the merges (as the
# pipeline does), read the file, cut the pipeline's documents (200-line segments), encode each whole
# in this one thread with ``encode_ordinary`` (a list of ints) or ``encode_to_numpy`` (an array, what
# the pipeline calls), count the tokens. Prints the encode loop's wall and CPU seconds, the tokens, the
# CPU seconds inside the encode calls alone and the process's whole CPU seconds so far (see _SHARE).
_TIKTOKEN = """import resource, sys, time
sys.path.insert(0, sys.argv[4])
from trainer.data.fastbpe import from_tokenizer_json
enc = from_tokenizer_json(open(sys.argv[1], encoding="utf-8").read(), 0).enc
lines = open(sys.argv[2], encoding="utf-8").read().splitlines(keepends=True)
docs = ["".join(lines[i : i + 200]) for i in range(0, len(lines), 200)]
numpy = sys.argv[3] == "numpy"
w, c = time.perf_counter(), time.process_time()
n, inside = 0, 0.0
for d in docs:
    t = time.process_time()
    n += len(enc.encode_to_numpy(d, disallowed_special=()) if numpy else enc.encode_ordinary(d))
    inside += time.process_time() - t
w, c = time.perf_counter() - w, time.process_time() - c
u = resource.getrusage(resource.RUSAGE_SELF)
print(w, c, n, inside, u.ru_utime + u.ru_stime)
"""

# The pipeline's command (``python -m trainer.prepare``) with its block encoder's tiktoken calls timed:
# CPU seconds inside ``TiktokenBPE.encode_array`` when ``encode_documents`` calls it (the corpus; not
# the agreement check on a sample, which bare tiktoken does not make), their tokens, and the process's
# whole CPU seconds at the end (getrusage: start and imports included), on stderr. A tree without
# ``encode_documents`` runs unchanged and reports 0 tokens.
_SHARE = """import resource, runpy, sys, time
inside, tokens, depth = 0.0, 0, 0
try:
    from trainer.data.fastbpe import TiktokenBPE as cls
except ImportError:  # a tree from before tiktoken
    cls = None
if hasattr(cls, "encode_documents"):
    encode_array, encode_documents = cls.encode_array, cls.encode_documents
    def timed_array(self, text):
        global inside, tokens
        if not depth:
            return encode_array(self, text)
        t = time.process_time()
        a = encode_array(self, text)
        inside += time.process_time() - t
        tokens += len(a)
        return a
    def in_documents(self, *args, **kwargs):
        global depth
        depth += 1
        try:
            return encode_documents(self, *args, **kwargs)
        finally:
            depth -= 1
    cls.encode_array, cls.encode_documents = timed_array, in_documents
rc = 0
try:
    runpy.run_module("trainer.prepare", run_name="__main__")
except SystemExit as e:
    rc = e.code
u = resource.getrusage(resource.RUSAGE_SELF)
print("ENCODER_CPU", inside, "TOTAL_CPU", u.ru_utime + u.ru_stime, "ENCODER_TOKENS", tokens, file=sys.stderr)
sys.exit(rc)
"""


def installed(env: dict, work: Path, *trees: Path) -> dict:
    """``env`` as on a machine where the package is installed: Python reads cached bytecode (pip
    compiles what it installs) instead of compiling every module on each start, as it would where
    PYTHONDONTWRITEBYTECODE is set. The trees' bytecode goes to ``work``/pycache, compiled once here."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    for tree in trees:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "trainer")], env=env, check=True,
                       capture_output=True)
    return env


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
    """The ``tokenizers`` library alone on the text in memory: whole documents (what the pipeline
    encodes) or lines (what it encoded before)."""
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "REPO": str(REPO)}
    r = subprocess.run([sys.executable, "-c", _BARE, str(tok_file), str(text), unit], env=env, capture_output=True,
                       text=True, check=True)
    dt, n, _ = r.stdout.split()
    return float(dt), int(n)


def _timed(cmd: list[str], env: dict) -> tuple[float, float, str, str]:
    """(wall seconds, CPU seconds of the child, its stdout, its stderr) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, r.stdout, r.stderr


def pairs(text_dir: Path, tok_file: Path, out: Path, rounds: int, before: Path | None = None) -> list[dict]:
    """Rounds of: the pipeline (``python -m trainer.prepare --workers 1`` under ``_SHARE``, whole
    command) and bare tiktoken (``_TIKTOKEN``, whole command and its encode loop alone) with
    encode_ordinary and with encode_to_numpy, on the same text, one thread each, in an order that
    rotates every round; with ``before`` (another checkout of this repository) its pipeline too, on
    the same text. Each process also reports the CPU inside its encode calls, their tokens and its
    whole CPU (``"<kind> encoder"``)."""
    env = installed({**os.environ, "PYTHONPATH": str(REPO), "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                     "TOKENIZERS_PARALLELISM": "false"}, out.parent, REPO, *([before] if before else []))
    pipe = [sys.executable, "-c", _SHARE, "--input", str(text_dir), "--out", str(out), "--workers", "1",
            "--tokenizer", str(tok_file)]
    corpus = text_dir / "corpus.txt"
    kinds = ["pipeline", "ordinary", "numpy", *(["before"] if before else [])]
    rows = []
    for i in range(rounds):
        row: dict = {"load": os.getloadavg()[0]}
        for kind in kinds[i % len(kinds):] + kinds[: i % len(kinds)]:
            if kind in ("pipeline", "before"):
                shutil.rmtree(out, ignore_errors=True)
                wall, cpu, _, err = _timed(pipe, env if kind == "pipeline" else {**env, "PYTHONPATH": str(before)})
                row[kind] = wall, cpu
                row["tokens"] = sum(json.loads((out / "meta.json").read_text())[k] for k in ("train_tokens", "val_tokens"))
                v = err.rsplit("ENCODER_CPU", 1)[1].split()
                row[kind + " encoder"] = float(v[0]), float(v[2]), int(v[4])  # inside, total, tokens
            else:
                wall, cpu, stdout, _ = _timed([sys.executable, "-c", _TIKTOKEN, str(tok_file), str(corpus), kind,
                                               str(REPO)], env)
                loop_wall, loop_cpu, n, inside, total = stdout.split()
                row[kind], row[kind + " loop"] = (wall, cpu), (float(loop_wall), float(loop_cpu))
                row[kind + " encoder"] = float(inside), float(total), int(n)
                row["bare tokens"] = int(n)
        rows.append(row)
        (ip, tp, _), (ib, tb, _) = row["pipeline encoder"], row["numpy encoder"]
        print(f"round {i + 1}: load {row['load']:.1f} " + " ".join(
            f"{k} {row[k][0]:.2f}s/{row[k][1]:.2f}cpu" for k in ("pipeline", "ordinary", "numpy", "numpy loop", "before")
            if k in row) + f" encoder-share estimate {ip / tp / (ib / tb):.3f}x", file=sys.stderr, flush=True)
    return rows


def pair_table(rows: list[dict], mb: float) -> list[str]:
    """Markdown: best-of-N MB/s of each side and the median over rounds of pipeline ÷ bare."""
    out = [f"{len(rows)} rounds, load average {min(r['load'] for r in rows):.1f}–{max(r['load'] for r in rows):.1f}; "
           f"pipeline {rows[0]['tokens']:,} tokens (with one end-of-text per document), bare "
           f"{rows[0]['bare tokens']:,}", "",
           "| what (1 process, 1 thread) | best wall MB/s | best CPU MB/s | pipeline ÷ it, wall (median) "
           "| pipeline ÷ it, CPU (median) |", "|---|---:|---:|---:|---:|"]
    names = {"pipeline": "pipeline, whole command (read, encode, check, shards, provenance)",
             "ordinary": "bare tiktoken encode_ordinary, whole command (start, build, read, encode)",
             "numpy": "bare tiktoken encode_to_numpy, whole command",
             "ordinary loop": "bare tiktoken encode_ordinary, encode loop only (text in memory)",
             "numpy loop": "bare tiktoken encode_to_numpy, encode loop only (text in memory)",
             "before": "pipeline of the --before tree, whole command"}
    for k, label in [(k, v) for k, v in names.items() if k in rows[0]]:
        best = [mb / min(r[k][j] for r in rows) for j in (0, 1)]
        ratio = [statistics.median(r[k][j] / r["pipeline"][j] for r in rows) for j in (0, 1)]
        out.append(f"| {label} | {best[0]:.2f} | {best[1]:.2f} | "
                   + (" | ".join(f"{x:.2f}x" for x in ratio) if k != "pipeline" else "— | —") + " |")
    return out + ["", *share_table(rows)]


def share_table(rows: list[dict]) -> list[str]:
    """Markdown: per round and the median, each process's CPU inside its encode calls over its whole
    CPU (I/T, measured within the process, so host drift cancels) for the pipeline and bare tiktoken's
    encode_to_numpy command, and their quotient, the drift-immune pipeline ÷ bare whole command."""
    p, b = [r["pipeline encoder"] for r in rows], [r["numpy encoder"] for r in rows]
    sp, sb = [i / t for i, t, _ in p], [i / t for i, t, _ in b]
    est = [x / y for x, y in zip(sp, sb, strict=True)]
    cpu = [r["numpy"][1] / r["pipeline"][1] for r in rows]
    agree = all(abs(x[2] - y[2]) <= 0.001 * y[2] for x, y in zip(p, b, strict=True))
    calls = statistics.median(y[0] / x[0] for x, y in zip(p, b, strict=True))  # bare ÷ pipeline, encode calls
    out = [f"Encoder share: CPU seconds inside the tiktoken encode calls (I) ÷ the process's whole CPU "
           f"seconds (T, getrusage at its end), both within one process. Encoder tokens: pipeline "
           f"{p[0][2]:,}, bare {b[0][2]:,} " + ("(the same calls: agree within 0.1% every round)" if agree else
                                                "(DIFFER by more than 0.1%: the estimate does not hold)"), "",
           "| round | load | pipeline I_p / T_p, CPU s | = pipeline ÷ bare encode loop | bare encode_to_numpy "
           "command I_b / T_b, CPU s | its share | pipeline ÷ bare whole command, (I_p/T_p)/(I_b/T_b) |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {k + 1} | {r['load']:.1f} | {x[0]:.2f} / {x[1]:.2f} | {u:.3f} | {y[0]:.2f} / {y[1]:.2f} | {v:.3f} "
            f"| {e:.3f}x |" for k, (r, x, y, u, v, e) in enumerate(zip(rows, p, b, sp, sb, est, strict=True))]
    med = statistics.median
    out += [f"| median | | | {med(sp):.3f} | | {med(sb):.3f} | {med(est):.3f}x |", "",
            f"Range over rounds of pipeline ÷ bare whole command: {min(est):.3f}–{max(est):.3f}x from the encoder "
            f"shares, {min(cpu):.2f}–{max(cpu):.2f}x from the CPU seconds of the separate processes (table above). "
            "The shares are the steadier figure: the same encoder work is the yardstick in both processes, "
            "timed at the same moments as the rest of its own process, so a host that speeds up or slows down "
            "scales I and T alike (all but the start, a few tenths of a second before the first call). Check that an encode call costs the same in both (the estimate counts a "
            f"slower one in the pipeline as encoder time): bare I_b ÷ pipeline I_p, median {calls:.3f} "
            "(across processes: as noisy as the ratios above, but unbiased)."]
    return out


# Where the pipeline's CPU goes, in one process: cProfile on CPU time around the pipeline (one worker,
# in this process), then bare tiktoken on the same documents right after, in the same process.
_BREAKDOWN = """import cProfile, pstats, shutil, sys, time
from pathlib import Path
from trainer.data.pipeline import PrepareOptions, prepare
from trainer.data.workers import load_encoder
text_dir, tok, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
shutil.rmtree(out, ignore_errors=True)
prof = cProfile.Profile(time.process_time)
t = time.process_time()
prof.enable()
prepare([str(text_dir)], out, "file", log=lambda m: None,
        options=PrepareOptions(tokenizer="file", tokenizer_file=tok, workers=1))
prof.disable()
total = time.process_time() - t
enc = load_encoder(tok, "tiktoken").enc
lines = (text_dir / "corpus.txt").read_text(encoding="utf-8").splitlines(keepends=True)
docs = ["".join(lines[i : i + 200]) for i in range(0, len(lines), 200)]
t = time.process_time()
for d in docs:
    enc.encode_to_numpy(d, disallowed_special=())
bare = time.process_time() - t
cum = {f[2]: v[3] for f, v in pstats.Stats(prof).stats.items()}
print(total, bare, *(cum.get(k, 0.0) for k in STAGES))
"""
STAGES = ("encode_array", "encode_documents", "_block_arrays", "run_task", "_consume", "_encoder", "_tokenizer")


def breakdown(text_dir: Path, tok_file: Path, out: Path, mb: float) -> list[str]:
    """Markdown: the pipeline's CPU seconds by stage (cProfile, CPU clock; the profiler's own cost
    included) and bare tiktoken's on the same documents in the same process."""
    env = installed({**os.environ, "PYTHONPATH": str(REPO), "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
                    out.parent, REPO)
    code = _BREAKDOWN.replace("STAGES", repr(STAGES))
    _, _, stdout, _ = _timed([sys.executable, "-c", code, str(text_dir), str(tok_file), str(out)], env)
    total, bare_s, *v = map(float, stdout.split())
    c = dict(zip(STAGES, v, strict=True))
    rows = [("tiktoken encoding (the same calls as bare)", c["encode_array"]),
            ("decode, the block's token array (encode_documents)", c["encode_documents"] - c["encode_array"]),
            ("document hashes, the block's other arrays", c["_block_arrays"] - c["encode_documents"]),
            ("reading and cutting documents", c["run_task"] - c["_block_arrays"] - c["_consume"]),
            ("train/val split, shards, provenance index (consume, in the worker's call)", c["_consume"]),
            ("tiktoken from the merges + the encoder check on a sample", c["_encoder"]),
            ("tokenizer file (load, copy)", c["_tokenizer"])]
    rows.append(("the rest (progress, state, meta.json)", total - sum(x for _, x in rows)))
    out_lines = [f"CPU seconds in one process, {mb:.0f} MB: pipeline {total:.2f} s, bare tiktoken encode_to_numpy on "
                 f"the same documents {bare_s:.2f} s (ratio {bare_s / total:.2f}x; the pipeline's own encoder share "
                 f"{c['encode_array'] / total:.2f})", "", "| stage | CPU s | share |", "|---|---:|---:|"]
    out_lines += [f"| {k} | {x:.2f} | {x / total:.0%} |" for k, x in rows]
    return out_lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="corpus size for the byte tokenizer")
    ap.add_argument("--bpe-mb", type=int, default=40, help="corpus size for BPE (it is ~20x slower)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--formats", default="text,jsonl.gz", help="inputs to time: text, jsonl.gz")
    ap.add_argument("--tokenizers", default="bytes,bpe", help="bytes, bpe (a 5 GB memory check: bytes, text)")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    ap.add_argument("--pairs", type=int, default=5, help="rounds of pipeline against bare tiktoken (BPE; 0: none)")
    ap.add_argument("--before", help="another checkout of this repository whose pipeline joins the rounds")
    args = ap.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    workers = [int(w) for w in args.workers.split(",")]
    rows = []
    pair_lines: list[str] = []
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
                units = {"docs": "bare tokenizers encode_batch of whole documents",
                         "lines": "bare tokenizers encode_batch of lines"}
                for unit, label in units.items():
                    for threads in workers:
                        dt, n = bare(tok_file, text_dir / "corpus.txt", threads, unit)
                        rows.append((name, f"{label}, in memory", threads, mb, dt, mb / dt, n / dt / 1e6, 0))
                if args.pairs > 0 and "text" in formats:
                    pair_lines = pair_table(pairs(text_dir, tok_file, root / "out", args.pairs,
                                                  Path(args.before) if args.before else None), mb)
                    pair_lines += ["", *breakdown(text_dir, tok_file, root / "out", mb)]
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print("| tokenizer | input | workers/threads | text MB | seconds | text MB/s | Mtok/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, fmt, w, mb, dt, rate, mtok, peak in rows:
        print(f"| {name} | {fmt} | {w} | {mb:.0f} | {dt:.1f} | {rate:.1f} | {mtok:.2f} | {peak:.0f} |")
    if pair_lines:
        print()
        print("\n".join(pair_lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
