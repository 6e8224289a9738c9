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
    """The BPE tokenizer's interface (encode, encode_batch, decode) on tiktoken, and
    :meth:`encode_documents`, the pipeline's block encoder."""

    kind = "bpe"

    def __init__(self, enc: Any, vocab_size: int, eot: int) -> None:
        self.enc, self.vocab_size, self.eot = enc, vocab_size, eot

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

    def encode_documents(self, texts: list[bytes], dtype: str) -> tuple[np.ndarray, np.ndarray]:
        """(tokens of ``dtype``, document starts [D+1]): each document encoded whole and copied into
        one array after the previous document's end-of-text. No line table: this encoder serves
        byte-level vocabularies only, whose shard index finds lines from the tokens' newlines."""
        n = len(texts)
        arrays = [self.encode_array(t.decode("utf-8", errors="replace")) for t in texts]
        doc_starts = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter((len(a) + 1 for a in arrays), np.int64, n), out=doc_starts[1:])
        tokens = np.empty(int(doc_starts[-1]), dtype)
        for k, a in enumerate(arrays):
            tokens[doc_starts[k] : doc_starts[k + 1] - 1] = a
        tokens[doc_starts[1:] - 1] = self.eot
        return tokens, doc_starts

    def decode(self, ids: list[int]) -> str:
        return str(self.enc.decode(ids))


def _byte_level(text: str) -> tuple[dict[bytes, int], dict[str, int]] | None:
    """(the bytes of every vocabulary token, the added tokens' text) of a ``tokenizers`` file that is a
    plain byte-level BPE (no normalizer, the ByteLevel pre-tokenizer with the GPT-2 split and no
    prefix space, no dropout), whose tokens' bytes joined are the text encoded; else None."""
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
    return {tok.translate(table).encode("latin-1"): i for tok, i in vocab.items()}, special


def newline_table(text: str) -> tuple[np.ndarray, np.ndarray] | None:
    """For a byte-level BPE file (see :func:`_byte_level`), per token id: how many newline bytes the
    token holds, and whether its last byte is one; None for any other tokenizer. The shard index
    finds every source line from these (trainer.data.shards), so preparation keeps no per-line table."""
    parsed = _byte_level(text)
    if parsed is None:
        return None
    ranks, special = parsed
    items = [*ranks.items(), *((s.encode(), i) for s, i in special.items())]
    n = max(i for _, i in items) + 1
    count, ends = np.zeros(n, np.int32), np.zeros(n, bool)
    for b, i in items:
        if b"\n" in b:
            count[i], ends[i] = b.count(b"\n"), b.endswith(b"\n")
    return count, ends


def from_tokenizer_json(text: str, eot: int) -> TiktokenBPE | None:
    """The tiktoken encoder of a ``tokenizers`` file, or None when it is not a plain byte-level BPE
    (:func:`_byte_level`), lacks a single byte, or tiktoken is not installed."""
    try:
        import tiktoken  # optional (the data extra): the pure-Python BPE is the fallback
    except ImportError:
        return None
    parsed = _byte_level(text)
    if parsed is None:
        return None
    ranks, special = parsed
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    n = max([*ranks.values(), *special.values()]) + 1
    try:
        enc = tiktoken.Encoding("gpucli-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special)
    except ValueError:
        return None
    return TiktokenBPE(enc, n, eot)


def agrees(fast: TiktokenBPE, slow: Any, texts: list[str]) -> bool:
    """Whether both encoders give the same tokens for every text."""
    return all(a == b for a, b in zip(fast.encode_batch(texts), slow.encode_batch(texts), strict=True))
