"""scripts/bench_prepare.py's rounds of the pipeline against bare tiktoken run on one text and one
vocabulary (its speeds are for BENCHMARKS.md, never asserted here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VOCAB = REPO / "tests" / "trainer" / "data" / "bpe600.json"

pytest.importorskip("tiktoken")
pytest.importorskip("tokenizers")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_prepare", REPO / "scripts" / "bench_prepare.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rounds_compare_the_pipeline_with_bare_tiktoken_on_the_same_text(tmp_path):
    bench = _bench()
    text_dir, _ = bench.generate(tmp_path, 1, 0, jsonl=False)
    rows = bench.pairs(text_dir, VOCAB, tmp_path / "out", 1)
    (row,) = rows
    ndocs = -(-len((text_dir / "corpus.txt").read_text().splitlines()) // 200)  # 200-line documents
    # the same documents: the pipeline's tokens are bare tiktoken's plus one end-of-text per document
    assert row["tokens"] == row["bare tokens"] + ndocs
    for kind in ("pipeline", "ordinary", "numpy", "ordinary loop", "numpy loop"):
        wall, cpu = row[kind]
        assert wall > 0 and cpu >= 0
    # the encoder share: the pipeline's block encoder and bare encode_to_numpy made the same calls (the same
    # tokens, the pipeline's agreement check on a sample not counted), each a part of its process's CPU
    inside_p, total_p, tokens_p = row["pipeline encoder"]
    inside_b, total_b, tokens_b = row["numpy encoder"]
    assert tokens_p == tokens_b == row["bare tokens"]
    assert 0 < inside_p <= total_p and 0 < inside_b <= total_b  # 0 < share <= 1
    table = bench.pair_table(rows, 1.0)
    assert table[0].startswith("1 rounds, load average")
    assert any(line.startswith("| bare tiktoken encode_to_numpy, encode loop only") and line.endswith("x |")
               for line in table)
    share = table[table.index(next(line for line in table if line.startswith("Encoder share:"))):]
    assert f"pipeline {tokens_p:,}, bare {tokens_b:,} (the same calls" in share[0]
    assert share[2].startswith("| round | load | pipeline I_p / T_p")
    cells = [c.strip() for c in share[4].strip("|").split("|")]
    assert cells[0] == "1" and cells[2] == f"{inside_p:.2f} / {total_p:.2f}" and cells[4] == f"{inside_b:.2f} / {total_b:.2f}"
    sp, sb = inside_p / total_p, inside_b / total_b
    assert cells[3] == f"{sp:.3f}" and cells[5] == f"{sb:.3f}" and cells[6] == f"{sp / sb:.3f}x"
    assert share[5].startswith("| median | | | ") and share[7].startswith("Range over rounds")
    stages = bench.breakdown(text_dir, VOCAB, tmp_path / "out", 1.0)
    assert stages[0].startswith("CPU seconds in one process, 1 MB: pipeline")
    assert stages[4].startswith("| tiktoken encoding (the same calls as bare) |") and len(stages) == 12
