"""``python -m trainer.prepare``: every input format and compression, every tokenizer, workers,
determinism, a kill and resume to identical bytes, memory bounded below the corpus, progress."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.trainer.conftest import REPO, trainer_env
from trainer.data.loader import TokenSplit, load_tokenizer, prepare
from trainer.data.pipeline import PrepareOptions


def quiet(_m: str) -> None:
    return None


def words_corpus(n_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyzé") for _ in range(rng.randint(2, 8)))
             for _ in range(400)]
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 12))) for _ in range(n_lines)]


def documents(data_dir: Path, split: str) -> list[tuple[str, int, bytes]]:
    """Every document of a byte-tokenized split: (file, first line, its bytes without end-of-text)."""
    ts = TokenSplit(data_dir, split)
    out = []
    for sh in ts.shards:
        ix = sh.index()
        starts = np.append(ix["line_starts"][ix["seg_line_idx"]].astype(np.int64), sh.n)
        for i in range(len(ix["seg_file"])):
            toks = np.asarray(sh.tokens[starts[i] : starts[i + 1]])
            assert toks[-1] == 256  # every document ends with end-of-text
            out.append((ts.files[ix["seg_file"][i]], int(ix["seg_first_line"][i]), toks[:-1].astype(np.uint8).tobytes()))
    return out


def write_all_formats(root: Path, lines: list[str]) -> dict[str, str]:
    """The same records as text, JSON Lines and JSON, plain and in every compression; name -> format."""
    root.mkdir(parents=True)
    text = "".join(line + "\n" for line in lines).encode()
    jsonl = "".join(json.dumps({"id": i, "text": line}) + "\n" for i, line in enumerate(lines)).encode()
    writers = {"": lambda p, b: p.write_bytes(b), ".gz": lambda p, b: p.write_bytes(gzip.compress(b)),
               ".bz2": lambda p, b: p.write_bytes(bz2.compress(b)), ".xz": lambda p, b: p.write_bytes(lzma.compress(b))}
    try:
        import zstandard

        writers[".zst"] = lambda p, b: p.write_bytes(zstandard.ZstdCompressor().compress(b))
    except ImportError:
        pass
    made = {}
    for comp, write in writers.items():
        for name, body, fmt in (("t.txt", text, "text"), ("r.jsonl", jsonl, "jsonl"), ("r.json", jsonl, "jsonl")):
            write(root / (name + comp), body)
            made[name + comp] = fmt
    return made


def test_every_format_and_compression_gives_the_same_documents_with_exact_provenance(tmp_path):
    lines = words_corpus(1000, 1)
    made = write_all_formats(tmp_path / "in", lines)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": lines, "n": list(range(len(lines)))}), tmp_path / "in" / "p.parquet",
                       row_group_size=300)
        made["p.parquet"] = "parquet"
    except ImportError:
        pass
    meta = prepare([str(tmp_path / "in")], tmp_path / "out", "byte", val_split=0.2, log=quiet,
                   options=PrepareOptions(workers=2, min_val_tokens=0))
    assert len(meta["files"]) == len(made) and all(s["documents"] > 0 for s in meta["sources"])
    docs = documents(tmp_path / "out", "train") + documents(tmp_path / "out", "val")
    by_file: dict[str, set] = {}
    for f, line, body in docs:
        name = Path(f).name
        if made[name] == "text":
            assert body == "".join(x + "\n" for x in lines[line - 1 : line - 1 + 200]).encode()
        else:  # a record: its line (JSON Lines) or row (Parquet) holds exactly this text
            assert body == lines[line - 1].encode()
        by_file.setdefault(made[name], set()).add(body)
    assert by_file["jsonl"] == by_file.get("parquet", by_file["jsonl"]) == {x.encode() for x in lines}
    # per format, every compression held the same documents (the count is exact too)
    per_source = {Path(s["name"]).name: (s["documents"], s["tokens"]) for s in meta["sources"]}
    assert len({v for k, v in per_source.items() if k.startswith("t.txt")}) == 1
    assert len({v for k, v in per_source.items() if k.startswith("r.json")}) == 1
    if "p.parquet" in per_source:
        assert per_source["p.parquet"] == per_source["r.jsonl"]
    # the split is by document content: a record is in the same split whatever file it came from
    val = {body for _, _, body in documents(tmp_path / "out", "val")}
    train = {body for _, _, body in documents(tmp_path / "out", "train")}
    assert val and train and not (val & train)


def test_include_exclude_globs_and_bad_records(tmp_path):
    root = tmp_path / "dolma"
    for cat in ("wiki", "code", "math"):
        (root / cat).mkdir(parents=True)
        (root / cat / "part-0.jsonl").write_text("".join(json.dumps({"text": f"{cat} {i}"}) + "\n" for i in range(50))
                                                 + "not json\n" + json.dumps({"other": 1}) + "\n")
    (root / ".cache").mkdir()
    (root / ".cache" / "x.jsonl").write_text(json.dumps({"text": "hidden"}) + "\n")
    meta = prepare([str(root)], tmp_path / "out", "byte", log=quiet,
                   options=PrepareOptions(include=("wiki/*", "math/*"), exclude=("math/*",), workers=1))
    assert [Path(f).parent.name for f in meta["files"]] == ["wiki"]
    assert meta["sources"][0]["bad_records"] == 2 and meta["sources"][0]["documents"] == 50
    with pytest.raises(ValueError, match="no input files"):
        prepare([str(root)], tmp_path / "none", "byte", log=quiet, options=PrepareOptions(include=("*.csv",)))


def test_same_bytes_whatever_the_workers_and_shards_are_capped(tmp_path):
    src = tmp_path / "big.txt"
    src.write_text("\n".join(words_corpus(40_000, 2)) + "\n")
    opts = PrepareOptions(shard_tokens=1 << 18, min_val_tokens=1000)
    a = prepare([str(src)], tmp_path / "a", "byte", log=quiet, options=PrepareOptions(**{**opts.__dict__, "workers": 1}))
    b = prepare([str(src)], tmp_path / "b", "byte", log=quiet, options=PrepareOptions(**{**opts.__dict__, "workers": 2}))
    assert a["shards"] == b["shards"] and len(a["shards"]["train"]) >= 4
    assert all(s["tokens"] <= 1 << 18 for split in a["shards"].values() for s in split)
    for split in ("train", "val"):
        for s in a["shards"][split]:
            for ext in (".bin", ".idx.npz"):
                name = s["name"].replace(".bin", ext)
                assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # the byte tokenizer keeps every byte: train + val + one end-of-text per document is the file
    assert a["train_tokens"] + a["val_tokens"] == src.stat().st_size + a["train_docs"] + a["val_docs"]


def test_char_bpe_file_and_gpt2_tokenizers(tmp_path, monkeypatch):
    pytest.importorskip("tokenizers")
    src = tmp_path / "a.txt"
    src.write_text("\n".join(words_corpus(3000, 3)) + "\n")
    char = prepare([str(src)], tmp_path / "char", "char", log=quiet, options=PrepareOptions(workers=1))
    tok = load_tokenizer(tmp_path / "char")
    assert char["vocab_size"] == 27 + 2 + 2  # letters, space, newline; eot, unknown and tok.decode(tok.encode("abc é\n")) == "abc é\n"
    assert tok.encode("Q") == [tok.unk]  # never in the sample: unknown, not an error
    bpe = prepare([str(src)], tmp_path / "bpe", "bpe", bpe_vocab_size=400, log=quiet,
                  options=PrepareOptions(workers=2))
    tok = load_tokenizer(tmp_path / "bpe")
    assert bpe["vocab_size"] <= 400 and bpe["dtype"] == "uint16" and tok.decode(tok.encode("abc é\n")) == "abc é\n"
    # BPE provenance: each document starts at its first line's first token
    ts = TokenSplit(tmp_path / "bpe", "train")
    f, line = ts.source(0)
    first = src.read_text().splitlines(keepends=True)[line - 1]
    assert tok.decode(np.asarray(ts.tokens[: len(tok.encode(first))]).tolist()) == first

    trained = tmp_path / "bpe" / "tokenizer.json"
    by_file = prepare([str(src)], tmp_path / "file", "file", log=quiet,
                      options=PrepareOptions(tokenizer_file=str(trained), workers=1))
    assert by_file["vocab_size"] == bpe["vocab_size"] and by_file["train_tokens"] == bpe["train_tokens"]
    # GPT-2's BPE: from a path, or from the Hugging Face cache; never downloaded
    gpt2 = prepare([str(src)], tmp_path / "g1", "gpt2", log=quiet,
                   options=PrepareOptions(tokenizer_file=str(trained), workers=1))
    assert gpt2["tokenizer"] == "gpt2" and gpt2["train_tokens"] == bpe["train_tokens"]
    cache = tmp_path / "hub" / "models--openai-community--gpt2" / "snapshots" / "abc"
    cache.mkdir(parents=True)
    (cache / "tokenizer.json").write_bytes(trained.read_bytes())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert prepare([str(src)], tmp_path / "g2", "gpt2", log=quiet)["train_tokens"] == bpe["train_tokens"]
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="tokenizer-file"):
        prepare([str(src)], tmp_path / "g3", "gpt2", log=quiet)


def _cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.prepare", *args], cwd=REPO, env=trainer_env(),
                          capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_killed_prepare_resumes_to_identical_bytes(tmp_path, workers):
    """Killed halfway through a task (each .gz file is one): the resumed run reads the task again
    and writes the same bytes, and counts its bad records once. One worker hands blocks to the
    shards in this process, two through block files."""
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):
        with gzip.open(src / f"part{i}.jsonl.gz", "wt") as f:
            for j, line in enumerate(words_corpus(60_000, 10 + i)):
                f.write(json.dumps({"text": line, "j": j}) + "\n" + ("{not json\n" if j % 20_000 == 7 else ""))
    args = ["--input", str(src), "--shard-tokens", "200000", "--workers", workers, "--min-val-tokens", "5000"]
    assert _cli(*args, "--out", str(tmp_path / "whole")).returncode == 0
    out = tmp_path / "killed"
    p = subprocess.Popen([sys.executable, "-m", "trainer.prepare", *args, "--out", str(out)], cwd=REPO,
                         env=trainer_env(), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill once a few shards are committed
        st = out / "state.json"
        if st.exists() and len(json.loads(st.read_text())["shards"]["train"]) >= 3:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (out / "meta.json").exists(), "finished before it could be killed"
    r = _cli(*args, "--out", str(out), "--progress-file", str(tmp_path / "progress.jsonl"))
    assert r.returncode == 0, r.stderr
    assert "resuming preparation" in r.stderr
    whole = sorted(p.relative_to(tmp_path / "whole") for p in (tmp_path / "whole").rglob("*") if p.is_file())
    again = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert whole == again
    for rel in whole:
        if rel.name != "meta.json":
            assert (tmp_path / "whole" / rel).read_bytes() == (out / rel).read_bytes(), rel
    a, b = (json.loads((d / "meta.json").read_text()) for d in (tmp_path / "whole", out))
    assert a == b and [x["bad_records"] for x in a["sources"]] == [3, 3, 3]
    rows = [json.loads(x) for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert rows[-1]["done"] and rows[-1]["tokens"] == a["train_tokens"] + a["val_tokens"]
    assert {"bytes_read", "bytes_total", "mb_s", "eta_s"} <= set(rows[0])


_PEAK = """import resource, runpy, sys
rc = 0
try:
    runpy.run_module("trainer.prepare", run_name="__main__")
except SystemExit as e:
    rc = e.code
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child forked from a big process
# (a pytest worker that imported torch) would report its parent's peak
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print("PEAK_RSS_KB", hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(rc)
"""


def test_memory_stays_below_the_corpus_under_a_cap(tmp_path):
    src = tmp_path / "big.txt"
    line = ("the quick brown fox jumps over the lazy dog " * 3 + "\n").encode()
    with open(src, "wb") as f:
        for _ in range(190):
            f.write(line * 10_000)  # 253 MB
    size = src.stat().st_size
    cap = 240 << 20

    def limit() -> None:  # the whole address space the process may have: less than the corpus
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    r = subprocess.run([sys.executable, "-c", _PEAK, "--input", str(src), "--out", str(tmp_path / "out"),
                        "--workers", "1", "--shard-tokens", "2000000"], cwd=REPO,
                       env=trainer_env(OPENBLAS_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert r.returncode == 0, r.stderr[-2000:]
    assert size > cap
    peak = int(r.stderr.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) * 1024
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["train_tokens"] + meta["val_tokens"] == size + meta["train_docs"] + meta["val_docs"]
    assert peak < 120e6, f"peak RSS {peak / 1e6:.0f} MB for a {size / 1e6:.0f} MB corpus"


def test_cli_errors_are_one_line(tmp_path):
    for args, needle in ((["--input", str(tmp_path / "nope")], "does not exist"),
                         (["--val-split", "nan"], "not in [0, 1)"),
                         (["--tokenizer", "wordpiece"], "unknown tokenizer")):
        r = _cli(*args, "--out", str(tmp_path / "o"))
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_parquet_column_and_zstd_inputs(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs the data extra (pip install '.[data]')")
    zstandard = pytest.importorskip("zstandard", reason=".zst input needs the data extra (pip install '.[data]')")
    import pyarrow.parquet as pq

    lines = words_corpus(400, 7)
    pq.write_table(pa.table({"body": lines}), tmp_path / "a.parquet")
    (tmp_path / "b.txt.zst").write_bytes(zstandard.ZstdCompressor().compress("".join(x + "\n" for x in lines).encode()))
    meta = prepare([str(tmp_path / "a.parquet"), str(tmp_path / "b.txt.zst")], tmp_path / "o", "byte", log=quiet,
                   options=PrepareOptions(text_field="body", workers=1))
    assert [s["documents"] for s in meta["sources"]] == [400, 2]
    with pytest.raises(ValueError, match="no column 'text'"):
        prepare([str(tmp_path / "a.parquet")], tmp_path / "o2", "byte", log=quiet)
