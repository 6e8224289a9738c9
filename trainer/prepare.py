"""Turn text into token shards: ``python -m trainer.prepare [--input PATH ...] --out DIR``.

Inputs are text files, JSON Lines (``.jsonl``/``.json``, the ``--text-field`` of each record) and
Parquet (a column), each optionally compressed (.gz, .zst, .bz2, .xz), or folders of them
(recursively, filtered by ``--include``/``--exclude`` globs). With no ``--input`` the corpus is the
Python standard library's own source, so prepare -> train -> sample runs with nothing downloaded.

Preparation streams: memory is bounded by the shard size, not the corpus. It runs on every core
(``--workers``), is deterministic (same inputs and options, same bytes, whatever the number of
workers) and resumable: run the same command again after a kill and it continues from its last
finished shards. Progress goes to stderr and, with ``--progress-file``, as JSON lines to a file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.data.pipeline import PrepareOptions, prepare


def _positive_int(text: str) -> int:
    try:
        v = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return v


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= v < 1.0:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1)")
    return v


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m trainer.prepare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", action="append", default=[], help="file or folder (repeatable)")
    ap.add_argument("--out", required=True, help="output folder (meta.json, train/, val/)")
    ap.add_argument("--include", action="append", default=[], help="glob a file in a folder must match")
    ap.add_argument("--exclude", action="append", default=[], help="glob a file in a folder must not match")
    ap.add_argument("--text-field", default="text", help="JSON field or Parquet column holding the text")
    ap.add_argument("--tokenizer", default="byte",
                    help="byte | char | bpe (trained on a sample) | gpt2 | file | PATH to a tokenizer.json")
    ap.add_argument("--tokenizer-file", help="tokenizer.json for --tokenizer file, or GPT-2's for gpt2 "
                                             "(default: the Hugging Face cache)")
    ap.add_argument("--vocab-size", type=_positive_int, default=32000, help="BPE vocabulary size (default 32000: the Atlas 1B plan's vocabulary, a Llama-sized one)")
    ap.add_argument("--tokenizer-sample", type=_positive_int, default=100_000_000,
                    help="bytes of text a bpe or char vocabulary is learned from")
    ap.add_argument("--val-split", type=_fraction, default=0.1, help="share of documents held out")
    ap.add_argument("--min-val-tokens", type=_positive_int, default=65536,
                    help="the validation split gets at least this many tokens (or half a small corpus)")
    ap.add_argument("--shard-tokens", type=_positive_int, default=1 << 26, help="tokens per shard at most")
    ap.add_argument("--workers", type=_positive_int, default=0, help="worker processes (default: every core)")
    ap.add_argument("--max-bytes", type=_positive_int, default=None, help="stop after this much text")
    ap.add_argument("--segment-lines", type=_positive_int, default=200,
                    help="lines of a text file per document")
    ap.add_argument("--progress-file", help="append progress as JSON lines to this file")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tokenizer, tokenizer_file = args.tokenizer, args.tokenizer_file
    if tokenizer.endswith(".json"):
        tokenizer, tokenizer_file = "file", tokenizer
    opts = PrepareOptions(tokenizer=tokenizer, tokenizer_file=tokenizer_file,
                          tokenizer_sample_bytes=args.tokenizer_sample, min_val_tokens=args.min_val_tokens,
                          shard_tokens=args.shard_tokens, workers=args.workers, text_field=args.text_field,
                          include=tuple(args.include), exclude=tuple(args.exclude),
                          segment_lines=args.segment_lines, progress_file=args.progress_file)
    try:
        prepare(args.input, Path(args.out), tokenizer, args.vocab_size, args.val_split, args.max_bytes,
                log=lambda m: print(m, file=sys.stderr, flush=True), options=opts)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to continue", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
