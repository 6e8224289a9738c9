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
    """The BPE tokenizer's interface (encode, encode_batch, encode_with_ends, decode) on tiktoken.
    ``encode_with_ends`` gives byte offsets (``offsets_in``), which the provenance index maps lines by."""

    kind = "bpe"
    offsets_in = "bytes"

    def __init__(self, enc: Any, vocab_size: int, eot: int, token_bytes: np.ndarray) -> None:
        self.enc, self.vocab_size, self.eot = enc, vocab_size, eot
        self._len = token_bytes  # bytes per token id

    def encode(self, text: str) -> list[int]:
        return list(self.enc.encode_ordinary(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(x) for x in self.enc.encode_ordinary_batch(texts, num_threads=1)]

    def encode_with_ends(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for ids in self.enc.encode_ordinary_batch(texts, num_threads=1):
            a = np.asarray(ids, np.int64)
            out.append((a, np.cumsum(self._len[a])))
        return out

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
    back = {c: b for b, c in bytes_to_unicode().items()}
    ranks: dict[bytes, int] = {}
    for tok, i in model.get("vocab", {}).items():
        if tok in special:
            continue
        try:
            ranks[bytes(back[c] for c in tok)] = int(i)
        except KeyError:
            return None
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    n = max([*ranks.values(), *special.values()]) + 1
    lengths = np.zeros(n, np.int64)
    for b, i in ranks.items():
        lengths[i] = len(b)
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
