"""Turn text into token shards: ``python -m trainer.prepare [--input PATH ...] --out DIR``.

With no ``--input`` the corpus is the Python standard library's own source, so the whole
prepare -> train -> sample flow runs on any machine with nothing downloaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.data import prepare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.prepare", description=__doc__)
    ap.add_argument("--input", action="append", default=[], help="text file or directory (repeatable)")
    ap.add_argument("--out", required=True, help="output directory for train.bin/val.bin/meta.json")
    ap.add_argument("--tokenizer", choices=["byte", "bpe"], default="byte")
    ap.add_argument("--vocab-size", type=int, default=32000, help="BPE vocabulary (seed 000: 32000)")
    ap.add_argument("--val-split", type=float, default=0.1)
    ap.add_argument("--max-bytes", type=int, default=64_000_000, help="stop reading after this much text")
    args = ap.parse_args(argv)
    try:
        prepare(args.input, Path(args.out), args.tokenizer, args.vocab_size, args.val_split, args.max_bytes,
                log=lambda m: print(m, file=sys.stderr))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
