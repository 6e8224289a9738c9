"""Streaming preparation: input files -> tokenizer -> worker processes -> shards + meta.json.

The order of everything written is fixed by the inputs and options alone (pieces and blocks are
cut by byte counts, results are consumed in task order), so the same inputs give the same bytes
whatever ``workers`` is. Shards close in pairs (train and val) at a document boundary, and each
close commits ``state.json`` (where the next document is, and every total so far): a killed
preparation starts again from there and writes the same bytes it would have written. The
validation split is decided per document by its hash; until it holds ``min_val_tokens`` every
second document also goes to it, so a small corpus still gets one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np

from trainer.data.fastbpe import TiktokenBPE, agrees, newline_table
from trainer.data.progress import Progress
from trainer.data.shards import SplitWriter
from trainer.data.sources import Source, collect_sources, plan_pieces, stdlib_source_list
from trainer.data.tokenizer import BPETokenizer, CharTokenizer, find_gpt2_tokenizer
from trainer.data.workers import (
    TaskResult,
    WorkerSetup,
    block_path,
    init_worker,
    load_encoder,
    read_block,
    run_task,
    sample_piece,
)

FORMAT = 3  # 3: no line table for a byte-level BPE (trainer.data.shards)
TOKENIZERS = ("byte", "char", "bpe", "gpt2", "file")
CHECK_BYTES = 64_000  # text both BPE encoders must agree on before tiktoken encodes the corpus


@dataclass(frozen=True)
class PrepareOptions:
    tokenizer: str = "byte"
    tokenizer_file: str | None = None
    vocab_size: int = 32000
    tokenizer_sample_bytes: int = 100_000_000
    val_split: float = 0.1
    min_val_tokens: int = 65536
    max_bytes: int | None = None
    shard_tokens: int = 1 << 26
    workers: int = 0  # 0: every core
    text_field: str = "text"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    segment_lines: int = 200
    max_doc_bytes: int = 1 << 20
    block_bytes: int = 16 << 20
    progress_file: str | None = None
    progress_every_s: float = 2.0
    encoder: str = "auto"  # BPE: tiktoken where it gives the same tokens (trainer.data.fastbpe), or tokenizers

    def check(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {self.tokenizer!r} (one of {', '.join(TOKENIZERS)})")
        if self.tokenizer == "file" and not self.tokenizer_file:
            raise ValueError("--tokenizer file needs --tokenizer-file PATH")
        if not 0.0 <= self.val_split < 1.0:
            raise ValueError(f"val split {self.val_split} must be in [0, 1)")
        for name in ("vocab_size", "tokenizer_sample_bytes", "segment_lines", "max_doc_bytes", "block_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not 1 << 16 <= self.shard_tokens < 1 << 32:
            raise ValueError(f"shard size {self.shard_tokens} must be in [65536, 2**32) tokens")
        if self.min_val_tokens < 0 or self.workers < 0 or (self.max_bytes is not None and self.max_bytes < 1):
            raise ValueError("min val tokens, workers and max bytes cannot be negative")


def prepare(inputs: list[str], out_dir: Path, tokenizer: str = "byte", bpe_vocab_size: int = 32000,
            val_split: float = 0.1, max_bytes: int | None = None, log: Callable[[str], None] = print,
            options: PrepareOptions | None = None) -> dict:
    """Tokenize ``inputs`` (files/folders; empty = the stdlib demo corpus) into ``out_dir``; returns
    meta.json's content. A finished directory is left alone; a partial one is resumed."""
    opts = replace(options or PrepareOptions(), tokenizer=tokenizer, vocab_size=bpe_vocab_size,
                   val_split=val_split, max_bytes=max_bytes)
    opts.check()
    out = Path(out_dir)
    if (out / "meta.json").exists():
        return json.loads((out / "meta.json").read_text())
    if inputs:
        sources, corpus = collect_sources(inputs, list(opts.include), list(opts.exclude)), "files"
    else:
        sources, corpus = stdlib_source_list(), "python-stdlib"
    if opts.max_bytes is not None:  # plain files beyond the cap are never opened
        keep, total = [], 0
        for s in sources:
            if total >= opts.max_bytes:
                break
            keep.append(s)
            total += s.size if not s.compression else 0
        sources = keep
    if not sources:
        raise ValueError("no input files found" + (" (check --include/--exclude)" if opts.include or opts.exclude
                                                   else ""))
    return _Run(out, sources, corpus, opts, log).run()


def _fingerprint(sources: list[Source], opts: PrepareOptions) -> str:
    h = hashlib.sha256()
    keep = {k: v for k, v in asdict(opts).items()
            if k not in ("workers", "progress_file", "progress_every_s", "encoder")}  # same tokens either way
    h.update(json.dumps(keep, sort_keys=True).encode())
    for s in sources:
        h.update(f"{s.path}\0{s.size}\0{os.stat(s.path).st_mtime_ns}\n".encode())
    return h.hexdigest()


@dataclass
class _State:
    fingerprint: str
    position: list[int] = field(default_factory=lambda: [0, 0, 0])  # task, block, document
    shards: dict[str, list[dict]] = field(default_factory=lambda: {"train": [], "val": []})
    tokens: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})
    docs: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})
    text_bytes: int = 0
    disk_bytes: int = 0
    piece_lines: dict[str, int] = field(default_factory=dict)
    source_tokens: dict[str, int] = field(default_factory=dict)
    source_docs: dict[str, int] = field(default_factory=dict)
    bad_records: dict[str, int] = field(default_factory=dict)
    binary: list[int] = field(default_factory=list)
    done: bool = False


class _Run:
    def __init__(self, out: Path, sources: list[Source], corpus: str, opts: PrepareOptions,
                 log: Callable[[str], None]) -> None:
        self.out, self.sources, self.corpus, self.opts, self.log = out, sources, corpus, opts, log
        # Blocks must fit a shard: a block's tokens are at most its bytes plus one per document.
        self.block_bytes = max(1, min(opts.block_bytes, opts.shard_tokens // 2))
        self.pieces = plan_pieces(sources, self.block_bytes)
        self.tasks = self._group()
        # Processes cost ~0.3 s each to start: no more of them than there are tasks.
        self.workers = max(1, min(opts.workers or os.cpu_count() or 1, len(self.tasks)))
        self.fp = _fingerprint(sources, opts)
        self.threshold = np.uint64(min(int(opts.val_split * 2.0**64), 2**64 - 1))
        self.encoder = "numpy"  # bytes and characters; BPE: set by _encoder

    def _group(self) -> list[list[int]]:
        """Consecutive small pieces share a task (the stdlib is 1,900 small files)."""
        tasks: list[list[int]] = []
        size = self.block_bytes
        for p in self.pieces:
            n = self.sources[p.source].size if p.end < 0 else p.end - p.start
            if size + n > self.block_bytes or self.sources[p.source].compression:
                tasks.append([])
                size = 0
            tasks[-1].append(p.index)
            size += n
        return tasks

    # -- state ------------------------------------------------------------------------------------

    def _load_state(self) -> _State:
        path = self.out / "state.json"
        if path.exists():
            try:
                st = _State(**json.loads(path.read_text()))
            except (ValueError, TypeError):
                st = None
            if st is not None and st.fingerprint == self.fp:
                kept = {s["name"] for split in st.shards.values() for s in split}
                self._clean(kept)
                self.log(f"resuming preparation at {st.tokens['train'] + st.tokens['val']:,} tokens "
                         f"({len(kept)} finished shards)")
                return st
            self.log("inputs or options changed since the partial preparation: starting again")
        self._clean(set())
        return _State(self.fp)

    def _clean(self, kept: set[str]) -> None:
        """Drop whatever a killed run wrote after its last commit."""
        shutil.rmtree(self.out / "work", ignore_errors=True)
        for split in ("train", "val"):
            d = self.out / split
            for f in sorted(d.glob("*")) if d.is_dir() else []:
                if f"{split}/{f.name.split('.')[0]}.bin" not in kept:
                    f.unlink()

    def _commit(self, st: _State) -> None:
        tmp = self.out / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(st)))
        os.replace(tmp, self.out / "state.json")

    # -- tokenizer --------------------------------------------------------------------------------

    def _tokenizer(self, setup: WorkerSetup, pool, resumed: bool) -> tuple[str | None, int, int]:
        """(tokenizer file for the workers or None for bytes, vocab size, eot)."""
        o, path = self.opts, self.out / "tokenizer.json"
        if o.tokenizer == "byte":
            return None, 257, 256
        if not (resumed and path.exists()):
            if o.tokenizer in ("gpt2", "file"):
                src = find_gpt2_tokenizer(o.tokenizer_file) if o.tokenizer == "gpt2" else Path(o.tokenizer_file or "")
                if not src.is_file():
                    raise FileNotFoundError(f"tokenizer file {src} does not exist")
                load_encoder(str(src))  # refuse a bad file before any work
                shutil.copyfile(src, path)
            else:
                texts = self._sample(setup, pool)
                if not texts:
                    raise ValueError("no text to learn a vocabulary from")
                self.log(f"learning a {o.tokenizer} vocabulary from {sum(map(len, texts)):,} characters")
                tok = (CharTokenizer("".join(set("".join(texts)))) if o.tokenizer == "char"
                       else BPETokenizer.train(texts, o.vocab_size))
                tok.save(path)
        tok = load_encoder(str(path))
        return str(path), tok.vocab_size, tok.eot

    def _encoder(self, setup: WorkerSetup, tok_file: str | None) -> str:
        """tiktoken for a byte-level BPE when installed and it encodes a sample of the corpus exactly as
        the tokenizers library does (trainer.data.fastbpe), unless ``encoder`` says otherwise. The
        sample is ``CHECK_BYTES``, spread over the starts of up to 64 pieces."""
        if tok_file is None or self.opts.encoder == "tokenizers" or self.opts.tokenizer == "char":
            return "tokenizers"

        slow = load_encoder(tok_file)
        fast = load_encoder(tok_file, "tiktoken")
        fast = fast if isinstance(fast, TiktokenBPE) else None
        if fast is None:
            why = "not a plain byte-level BPE" if isinstance(slow, BPETokenizer) else "not a BPE"
            if self.opts.encoder == "tiktoken":
                raise ValueError(f"--encoder tiktoken: {why}, or tiktoken is not installed (pip install tiktoken)")
            return "tokenizers"
        init_worker(setup, _Counter(0))
        quota = max(1, CHECK_BYTES // min(len(self.pieces), 64))
        texts = [t for pid in range(min(len(self.pieces), 64)) for t in sample_piece(pid, quota)]
        if not agrees(fast, slow, texts):
            if self.opts.encoder == "tiktoken":
                raise ValueError("--encoder tiktoken: it encodes this corpus differently from the tokenizer file")
            self.log("encoder: tiktoken differs from the tokenizer file on this corpus; using tokenizers")
            return "tokenizers"
        self.log(f"encoder: tiktoken (same tokens as the tokenizer file on {sum(map(len, texts)):,} characters)")
        return "tiktoken"

    def _sample(self, setup: WorkerSetup, pool) -> list[str]:
        sizes = [self.sources[p.source].size if p.end < 0 else p.end - p.start for p in self.pieces]
        total = max(1, sum(sizes))
        # compressed pieces hold ~4x their size in text; parquet's own compression is similar
        quotas = [max(1, self.opts.tokenizer_sample_bytes * n // total) for n in sizes]
        args = list(zip(range(len(self.pieces)), quotas, strict=True))
        parts = pool.starmap(sample_piece, args) if pool else [sample_piece(*a) for a in args]
        return [t for part in parts for t in part]

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        st = self._load_state()
        resumed = st.position != [0, 0, 0]
        counter = mp.get_context("spawn").Value("q", st.disk_bytes) if self.workers > 1 else _Counter(st.disk_bytes)
        setup = WorkerSetup(str(self.out), tuple(self.sources), tuple(self.pieces), None, "uint32",
                            self.opts.text_field, self.opts.segment_lines, self.opts.max_doc_bytes,
                            self.block_bytes, self.opts.val_split)
        ctx = mp.get_context("spawn")
        pool = None
        try:
            if self.opts.tokenizer in ("bpe", "char") and not (resumed and (self.out / "tokenizer.json").exists()):
                if self.workers > 1:
                    pool = ctx.Pool(self.workers, init_worker, (setup, counter))
                else:
                    init_worker(setup, counter)
            tok_file, vocab, eot = self._tokenizer(setup, pool, resumed)
            if pool is not None:
                pool.close()
                pool.join()
                pool = None
            dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
            encoder = self._encoder(setup, tok_file)  # tiktoken only for a byte-level BPE: no line table
            setup = replace(setup, tokenizer_file=tok_file, dtype=dtype.name, encoder=encoder,
                            line_table=tok_file is None or (encoder != "tiktoken"
                                                            and newline_table(Path(tok_file).read_text()) is None))
            self.encoder = setup.encoder
            if self.workers > 1:
                pool = ctx.Pool(self.workers, init_worker, (setup, counter))
            else:
                init_worker(setup, counter)
            progress = Progress(sum(s.size for s in self.sources), self.opts.progress_file, self.log,
                                self.opts.progress_every_s, counter, st.disk_bytes)
            self._encode(st, pool, dtype, progress)
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
        return self._finish(st, vocab, eot, dtype, progress)

    def _encode(self, st: _State, pool, dtype: np.dtype, progress: Progress) -> None:
        writers = {k: SplitWriter(self.out, k, dtype, st.shards[k]) for k in ("train", "val")}
        t0, b0, d0 = st.position
        ahead = max(2, 2 * self.workers)
        pending: dict[int, object] = {}
        nxt = t0

        def submit() -> None:
            nonlocal nxt
            while pool is not None and nxt < len(self.tasks) and len(pending) < ahead:
                pending[nxt] = pool.apply_async(run_task, (nxt, self.tasks[nxt], b0 if nxt == t0 else 0))
                nxt += 1

        def lines(done: dict[int, int]) -> None:  # of each piece read whole: later pieces' line numbers
            for pid, n in done.items():
                st.piece_lines[str(pid)] = n

        def sink(t: int, b: int, blk: dict[str, np.ndarray], done: dict[int, int]) -> bool:
            """One worker, in this process: each block straight into the shards, no block file."""
            lines(done)
            stop = self._consume(st, writers, t, b, blk, d0 if (t, b) == (t0, b0) else 0)
            progress.tick(st.tokens["train"] + st.tokens["val"])
            return stop

        try:
            for t in range(t0, len(self.tasks)):
                if pool is None:
                    res: TaskResult = run_task(t, self.tasks[t], b0 if t == t0 else 0, partial(sink, t))
                    lines(res.piece_lines)
                    self._task_counts(st, res)
                    if res.stopped:
                        break
                    continue
                submit()
                fut = pending.pop(t)
                while not fut.ready():  # type: ignore[attr-defined]
                    fut.wait(0.5)  # type: ignore[attr-defined]
                    progress.tick(st.tokens["train"] + st.tokens["val"])
                res = fut.get()  # type: ignore[attr-defined]
                submit()
                lines(res.piece_lines)
                stop = False
                for b in range(b0 if t == t0 else 0, res.blocks):
                    path = block_path(self.out, t, b)
                    stop = self._consume(st, writers, t, b, read_block(path), d0 if (t, b) == (t0, b0) else 0)
                    path.unlink()
                    progress.tick(st.tokens["train"] + st.tokens["val"])
                    if stop:
                        break
                self._task_counts(st, res)
                if stop:
                    break
        except BaseException:
            for w in writers.values():
                w.abandon()  # not committed: a resumed run writes these documents again
            raise
        self._close_pair(st, writers, [len(self.tasks), 0, 0])

    @staticmethod
    def _task_counts(st: _State, res: TaskResult) -> None:
        """Counted once a task's blocks are in the shards: a shard committed halfway through a task
        must not hold them, or the resumed run, which reads the whole task again, counts them twice."""
        for src, n in res.bad_records.items():
            st.bad_records[str(src)] = st.bad_records.get(str(src), 0) + n
        st.binary.extend(res.binary)

    def _line_base(self, st: _State, pid: int) -> int:
        src, base, q = self.pieces[pid].source, 0, pid - 1
        while q >= 0 and self.pieces[q].source == src:
            base += st.piece_lines[str(q)]
            q -= 1
        return base

    def _close_pair(self, st: _State, writers: dict[str, SplitWriter], position: list[int]) -> None:
        for k, w in writers.items():
            w.close()
            st.shards[k] = w.shards
        st.position = position
        self._commit(st)

    def _consume(self, st: _State, writers: dict[str, SplitWriter], t: int, b: int, blk: dict[str, np.ndarray],
                 d0: int) -> bool:
        """Append one block's documents from ``d0``; True when max_bytes is reached."""
        n = len(blk["doc_hash"])
        doc_len = np.diff(blk["doc_starts"])
        bases = {p: self._line_base(st, p) for p in set(blk["doc_piece"].tolist())}  # np.unique imports numpy.ma
        first_line = blk["doc_line"] + np.array([bases[int(p)] for p in blk["doc_piece"]], np.int64)
        is_val = blk["doc_hash"] < self.threshold
        # Until validation has its minimum, every second document joins it too (by its global index).
        i, val_tokens, ndocs = d0, st.tokens["val"], st.docs["train"] + st.docs["val"]
        while i < n and val_tokens < self.opts.min_val_tokens:
            is_val[i] |= (ndocs + i - d0) % 2 == 1
            val_tokens += int(doc_len[i]) if is_val[i] else 0
            i += 1
        cap, stop_at = self.opts.shard_tokens, n
        if self.opts.max_bytes is not None:
            cum = st.text_bytes + np.cumsum(blk["doc_bytes"])
            stop_at = min(n, int(np.searchsorted(cum, self.opts.max_bytes, side="left")) + 1)
        d = d0
        while d < stop_at:
            tr = np.cumsum(np.where(is_val[d:stop_at], 0, doc_len[d:stop_at]))
            va = np.cumsum(np.where(is_val[d:stop_at], doc_len[d:stop_at], 0))
            fit = min(int(np.searchsorted(tr, cap - writers["train"].tokens, side="right")),
                      int(np.searchsorted(va, cap - writers["val"].tokens, side="right")))
            if fit == 0:
                if writers["train"].tokens == 0 and writers["val"].tokens == 0:
                    raise ValueError(f"a document of {int(doc_len[d]):,} tokens is bigger than a shard "
                                     f"({cap:,}): raise --shard-tokens")
                self._close_pair(st, writers, [t, b, d])
                continue
            self._append(st, writers, blk, is_val, first_line, d, d + fit)
            d += fit
        return stop_at < n or (self.opts.max_bytes is not None and st.text_bytes >= self.opts.max_bytes)

    def _append(self, st: _State, writers: dict[str, SplitWriter], blk: dict, is_val: np.ndarray,
                first_line: np.ndarray, a: int, b: int) -> None:
        ds, lpd = blk["doc_starts"], blk["lines_per_doc"]
        line_first = np.concatenate([[0], np.cumsum(lpd)]) if blk["has_line_table"] else None
        for name, want in (("train", False), ("val", True)):
            sel = is_val[a:b] == want
            docs = np.flatnonzero(sel) + a
            if len(docs) == 0:
                continue
            lens = ds[docs + 1] - ds[docs]
            # runs of consecutive documents of this split: one slice of tokens each, no mask per token
            runs = np.flatnonzero(np.diff(np.concatenate([[0], sel, [0]]).astype(np.int8))).reshape(-1, 2) + a
            parts = [blk["tokens"][ds[r0] : ds[r1]] for r0, r1 in runs.tolist()]
            tokens = parts[0] if len(parts) == 1 else np.concatenate(parts)
            new_start = np.concatenate([[0], np.cumsum(lens)[:-1]])
            rel = None
            if line_first is not None:
                lines = np.flatnonzero(np.repeat(sel, lpd[a:b])) + line_first[a]
                line_doc = np.repeat(np.arange(len(docs)), lpd[docs])  # position of each line's doc in docs
                rel = blk["line_starts"][lines] - ds[docs][line_doc] + new_start[line_doc]
            writers[name].append(tokens, new_start, lpd[docs], blk["doc_file"][docs], first_line[docs], rel)
            st.tokens[name] += int(lens.sum())
            st.docs[name] += len(docs)
            per_tok, per_doc = np.bincount(blk["doc_file"][docs], weights=lens), np.bincount(blk["doc_file"][docs])
            files = np.flatnonzero(per_doc)
            for f, nt, nd in zip(files.tolist(), per_tok[files].tolist(), per_doc[files].tolist(), strict=True):
                st.source_tokens[str(f)] = st.source_tokens.get(str(f), 0) + int(nt)
                st.source_docs[str(f)] = st.source_docs.get(str(f), 0) + int(nd)
        st.text_bytes += int(blk["doc_bytes"][a:b].sum())
        st.disk_bytes += int(blk["disk"]) if a == 0 else 0

    def _finish(self, st: _State, vocab: int, eot: int, dtype: np.dtype, progress: Progress) -> dict:
        progress.tick(st.tokens["train"] + st.tokens["val"], final=True)
        ndocs = st.docs["train"] + st.docs["val"]
        if st.tokens["train"] == 0 or st.tokens["val"] == 0:
            raise ValueError(f"the corpus has {ndocs} document(s), {st.tokens['train'] + st.tokens['val']:,} "
                             f"tokens: too little for both a training and a validation split")
        o = self.opts
        meta = {
            "format": FORMAT, "tokenizer": o.tokenizer, "vocab_size": vocab, "eot": eot, "dtype": dtype.name,
            "corpus": self.corpus, "train_tokens": st.tokens["train"], "val_tokens": st.tokens["val"],
            "train_docs": st.docs["train"], "val_docs": st.docs["val"], "text_bytes": st.text_bytes,
            "files": [s.name for s in self.sources], "shards": st.shards,
            "sources": [{"name": s.name, "bytes": s.size, "format": s.fmt, "compression": s.compression,
                         "documents": st.source_docs.get(str(i), 0), "tokens": st.source_tokens.get(str(i), 0),
                         "bad_records": st.bad_records.get(str(i), 0), "binary_skipped": i in st.binary}
                        for i, s in enumerate(self.sources)],
            "val_split": o.val_split, "min_val_tokens": o.min_val_tokens, "segment_lines": o.segment_lines,
            "text_field": o.text_field, "shard_tokens": o.shard_tokens, "max_bytes": o.max_bytes,
            "tokenizer_file": o.tokenizer_file, "fingerprint": self.fp, "encoder": self.encoder,
        }
        tmp = self.out / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, self.out / "meta.json")  # meta.json last: its presence marks a finished directory
        (self.out / "state.json").unlink(missing_ok=True)
        shutil.rmtree(self.out / "work", ignore_errors=True)
        self.log(f"prepared {len(self.sources)} files: {st.tokens['train']:,} train + {st.tokens['val']:,} val "
                 f"tokens ({o.tokenizer}, vocab {vocab}, {len(st.shards['train']) + len(st.shards['val'])} "
                 f"shards) in {self.out}")
        return meta


class _Counter:
    """mp.Value's interface, for one in-process worker."""

    def __init__(self, value: int) -> None:
        self.value = value

    def get_lock(self):
        return contextlib.nullcontext()
