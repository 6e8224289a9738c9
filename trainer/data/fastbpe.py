"""tiktoken as the encoder of a byte-level BPE: the vocabulary trained here (or GPT-2's), turned into
tiktoken's mergeable ranks, as nanochat encodes its trained BPE with tiktoken. tiktoken merges the
adjacent pair whose joined bytes rank lowest, the ``tokenizers`` library the pair whose merge comes
first; for a vocabulary whose ids follow its merges the two agree, and :func:`agrees` checks that on
real text before the pipeline uses it (a mismatch keeps the ``tokenizers`` encoder). Either way the
shards hold the same tokens; tiktoken only makes them faster (scripts/bench_prepare.py)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

# The GPT-2 split that the ``tokenizers`` ByteLevel pre-tokenizer applies (its use_regex) and
# tiktoken's gpt2 encoding uses.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level table: printable Latin-1 bytes stand for themselves, the others take the
    characters from U+0100 on, in byte order (so every byte is one visible character)."""
    keep = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)}
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class TiktokenBPE:
    """The BPE tokenizer's interface (encode, encode_batch, encode_with_ends, decode) on tiktoken, and
    :meth:`encode_documents`, the pipeline's block encoder. Token ends are byte offsets
    (``offsets_in``), which the provenance index maps lines by."""

    kind = "bpe"
    offsets_in = "bytes"

    def __init__(self, enc: Any, vocab_size: int, eot: int, token_bytes: np.ndarray) -> None:
        self.enc, self.vocab_size, self.eot = enc, vocab_size, eot
        self._len = token_bytes  # bytes per token id

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        """One text as uint32 ids, in the calling thread. tiktoken's ``encode_to_numpy`` with no special
        token allowed or refused is its ``encode_ordinary`` (special tokens' text is plain text) without
        the list of Python ints; ``encode_ordinary_batch`` would add a thread pool per call."""
        try:
            return self.enc.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:  # lone surrogates: tiktoken's own fix-up in encode_ordinary
            return np.asarray(self.enc.encode_ordinary(text), np.uint32)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode_array(t).tolist() for t in texts]

    def encode_with_ends(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for t in texts:
            a = self.encode_array(t).astype(np.int64)
            out.append((a, np.cumsum(self._len[a])))
        return out

    def encode_documents(self, texts: list[bytes], line_offsets: list[np.ndarray], dtype: str
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What ``tokenizer.encode_block`` returns for BPE, built per batch of ~1 MB of documents
        rather than per document: each document encoded whole and copied into the batch's array
        after the previous document's end-of-text; a line starts at the token holding its first
        byte, found in one running sum of token lengths over the batch (end-of-text counted as 0
        bytes, so the sum runs on across documents)."""
        n = len(texts)
        lpd = np.fromiter((len(o) for o in line_offsets), np.int64, n)
        doc_len = np.empty(n, np.int64)
        parts: list[np.ndarray] = []
        line_parts: list[np.ndarray] = []
        lo = 0
        while lo < n:
            hi, size = lo, 0
            while hi < n and (hi == lo or size < 1 << 20):
                size += len(texts[hi])
                hi += 1
            arrays = [self.encode_array(t.decode("utf-8", errors="replace")) for t in texts[lo:hi]]
            counts = np.fromiter((len(a) + 1 for a in arrays), np.int64, hi - lo)
            start = np.zeros(hi - lo + 1, np.int64)  # of each document in the batch
            np.cumsum(counts, out=start[1:])
            batch = np.empty(int(start[-1]), dtype)
            for k, a in enumerate(arrays):
                batch[start[k] : start[k + 1] - 1] = a
            batch[start[1:] - 1] = self.eot
            lens = self._len[batch]
            lens[start[1:] - 1] = 0  # end-of-text stands for no text
            # byte end of each token, after a 0; int32 like lens (no cast: a batch is a few MB)
            cum = np.zeros(len(batch) + 1, np.int32)
            np.cumsum(lens, out=cum[1:])
            base = cum[start].astype(np.int64)  # byte offset of each document in the batch, as encoded
            at = np.concatenate(line_offsets[lo:hi]).astype(np.int64)
            owner = np.repeat(np.arange(hi - lo), lpd[lo:hi])
            raw = np.fromiter((len(t) for t in texts[lo:hi]), np.int64, hi - lo)
            for k in np.flatnonzero(base[1:] - base[:-1] != raw).tolist():
                # invalid UTF-8 grew by its replacement characters: offsets in the decoded text's bytes
                sel = owner == k
                at[sel] = [len(texts[lo + k][:b].decode("utf-8", errors="replace").encode()) for b in at[sel].tolist()]
            # Tokens that end at or before the line's first byte: every token of the documents before
            # (their end-of-text included) and those of its own; never its own end-of-text.
            g = np.searchsorted(cum, (at + base[owner]).astype(np.int32), side="right") - 1
            line_parts.append(np.minimum(g, start[owner + 1] - 1) - start[owner])
            parts.append(batch)
            doc_len[lo:hi] = counts
            lo = hi
        doc_starts = np.zeros(n + 1, np.int64)
        np.cumsum(doc_len, out=doc_starts[1:])
        tokens = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else np.zeros(0, dtype)
        lines = np.concatenate(line_parts) if line_parts else np.zeros(0, np.int64)
        return tokens, doc_starts, lines + np.repeat(doc_starts[:-1], lpd)

    def decode(self, ids: list[int]) -> str:
        return str(self.enc.decode(ids))


def from_tokenizer_json(text: str, eot: int) -> TiktokenBPE | None:
    """The tiktoken encoder of a ``tokenizers`` file, or None when it is not a plain byte-level BPE
    (another model, a normalizer, a pre-tokenizer other than ByteLevel with the GPT-2 split) or
    tiktoken is not installed."""
    try:
        import tiktoken  # optional (the data extra): the pure-Python BPE is the fallback
    except ImportError:
        return None
    j = json.loads(text)
    model, pre = j.get("model") or {}, j.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or j.get("normalizer") or pre.get("type") != "ByteLevel" \
            or not pre.get("use_regex", True) or pre.get("add_prefix_space") or model.get("dropout"):
        return None
    special = {t["content"]: int(t["id"]) for t in j.get("added_tokens", [])}
    table = {ord(c): b for b, c in bytes_to_unicode().items()}  # for str.translate: byte-level char -> byte
    vocab = {tok: int(i) for tok, i in model.get("vocab", {}).items() if tok not in special}
    if not set("".join(vocab)) <= {chr(c) for c in table}:  # a character that stands for no byte
        return None
    ranks = {tok.translate(table).encode("latin-1"): i for tok, i in vocab.items()}
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    n = max([*ranks.values(), *special.values()]) + 1
    lengths = np.zeros(n, np.int32)  # bytes per token id (gathered per token: the smaller the faster)
    lengths[np.fromiter(ranks.values(), np.int64, len(ranks))] = np.fromiter(map(len, ranks), np.int32, len(ranks))
    for s, i in special.items():
        lengths[i] = len(s.encode())
    try:
        enc = tiktoken.Encoding("gpucli-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special)
    except ValueError:
        return None
    return TiktokenBPE(enc, n, eot, lengths)


def agrees(fast: TiktokenBPE, slow: Any, texts: list[str]) -> bool:
    """Whether both encoders give the same tokens for every text."""
    return all(a == b for a, b in zip(fast.encode_batch(texts), slow.encode_batch(texts), strict=True))
