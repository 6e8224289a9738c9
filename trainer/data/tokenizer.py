"""Tokenizers: bytes, characters, BPE (trained here, a ``tokenizer.json``, or GPT-2's) and the block
encoders that turn many documents into one token array at a time.

Every tokenizer has ``vocab_size``, ``eot`` (the end-of-text id that ends each document),
``encode`` and ``decode``. A prepared directory's ``tokenizer.json`` is either a ``tokenizers``
library file (BPE, GPT-2, any file the user gave) or this module's own character table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")
"""End-of-text tokens looked for, in order, in a tokenizer file the user gives."""

CHAR_FORMAT = "gpucli-char-v1"


class Tokenizer(Protocol):
    vocab_size: int
    eot: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 and one end-of-text token, 256. Needs no training and no files."""

    vocab_size = 257
    eot = 256
    kind = "byte"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class CharTokenizer:
    """One token per Unicode character of a fixed alphabet (the $1000 8x H100 setup guide's vocabulary of 32), plus
    end-of-text and unknown. The alphabet comes from a sample of the corpus; a character the sample
    never showed becomes the unknown token rather than an error halfway through a 20 GB corpus."""

    kind = "char"

    def __init__(self, chars: str) -> None:
        self.chars = "".join(sorted(set(chars)))
        self.eot = len(self.chars)
        self.unk = len(self.chars) + 1
        self.vocab_size = len(self.chars) + 2
        self._ids = {c: i for i, c in enumerate(self.chars)}
        # A table over code points makes encoding a block one numpy gather.
        top = max((ord(c) for c in self.chars), default=0) + 1
        self._table = np.full(top, self.unk, dtype=np.int64)
        for i, c in enumerate(self.chars):
            self._table[ord(c)] = i

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def encode_array(self, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        out = np.full(len(cps), self.unk, dtype=np.int64)
        ok = cps < len(self._table)
        out[ok] = self._table[cps[ok]]
        return out

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids if 0 <= i < len(self.chars))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"format": CHAR_FORMAT, "chars": self.chars}))


class BPETokenizer:
    """A ``tokenizers`` library model: byte-level BPE trained here, GPT-2's, or any tokenizer.json."""

    EOT_TEXT = "<|endoftext|>"
    kind = "bpe"

    def __init__(self, tok: object, eot_text: str | None = None) -> None:
        self._tok = tok
        self.vocab_size = int(tok.get_vocab_size())  # type: ignore[attr-defined]
        names = (eot_text,) if eot_text else EOT_CANDIDATES
        ids = [tok.token_to_id(n) for n in names]  # type: ignore[attr-defined]
        found = [i for i in ids if i is not None]
        if not found:
            raise ValueError(f"the tokenizer has none of the end-of-text tokens {', '.join(names)}")
        self.eot = int(found[0])

    @classmethod
    def train(cls, texts, vocab_size: int) -> BPETokenizer:
        HFTokenizer, decoders, models, pre_tokenizers, trainers = _hf()
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[cls.EOT_TEXT],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: Path):
        """The tokenizer in ``path``. A character table is returned as a :class:`CharTokenizer`,
        so a checkpoint's tokenizer.json loads whatever kind it is."""
        return load_tokenizer_file(path)

    def save(self, path: Path) -> None:
        self._tok.save(str(path))  # type: ignore[attr-defined]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.21) computes no offsets: the same ids for ~40 % less CPU
        fast = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch  # type: ignore[attr-defined]
        return [e.ids for e in fast(texts, add_special_tokens=False)]

    def encode_with_ends(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text encoded whole: (token ids, the character offset where each token ends)."""
        encs = self._tok.encode_batch(texts, add_special_tokens=False)  # type: ignore[attr-defined]
        return [(np.asarray(e.ids, np.int64), np.asarray(e.offsets, np.int64).reshape(-1, 2)[:, 1]) for e in encs]

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))  # type: ignore[attr-defined]


def _hf():
    try:
        from tokenizers import Tokenizer as HFTokenizer  # optional: tokenizers only for a trained BPE
        from tokenizers import (  # optional: tokenizers only for a trained BPE
            decoders,
            models,
            pre_tokenizers,
            trainers,
        )
    except ImportError:
        raise RuntimeError("this tokenizer needs the 'tokenizers' package (pip install tokenizers), "
                           "or use the byte or char tokenizer") from None
    return HFTokenizer, decoders, models, pre_tokenizers, trainers


def load_tokenizer_file(path: Path) -> Tokenizer:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read tokenizer file {path}: {e}") from None
    return load_tokenizer_text(text, str(path))


def load_tokenizer_text(text: str, name: str) -> Tokenizer:
    """The tokenizer in a tokenizer file's ``text`` (``name`` for errors)."""
    # CharTokenizer.save writes the format first; a big BPE file is parsed once, by the library, below
    if CHAR_FORMAT in text[:64] or len(text) < 1 << 16:
        try:
            head = json.loads(text)
        except ValueError as e:
            raise ValueError(f"cannot read tokenizer file {name}: {e}") from None
        if isinstance(head, dict) and head.get("format") == CHAR_FORMAT:
            return CharTokenizer(str(head["chars"]))
    HFTokenizer = _hf()[0]
    try:
        return BPETokenizer(HFTokenizer.from_str(text))
    except Exception as e:  # the library raises its own exception type for a malformed file
        raise ValueError(f"cannot read tokenizer file {name}: {e}") from None


def load_tokenizer(data_dir: Path) -> Tokenizer:
    meta = json.loads((Path(data_dir) / "meta.json").read_text())
    if meta["tokenizer"] == "byte":
        return ByteTokenizer()
    return load_tokenizer_file(Path(data_dir) / "tokenizer.json")


def find_gpt2_tokenizer(explicit: str | None = None) -> Path:
    """GPT-2's tokenizer.json from a path, else the Hugging Face Hub cache. Nothing is downloaded:
    preparation must work with no network, and a download belongs to the data step that fetches."""
    if explicit:
        p = Path(explicit)
        p = p / "tokenizer.json" if p.is_dir() else p
        if not p.is_file():
            raise FileNotFoundError(f"GPT-2 tokenizer file {explicit} does not exist")
        return p
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache/huggingface"))
               / "hub")
    for repo in ("models--openai-community--gpt2", "models--gpt2"):
        found = sorted((hub / repo / "snapshots").glob("*/tokenizer.json"))
        if found:
            return found[-1]
    raise FileNotFoundError("GPT-2's tokenizer.json is not on this machine: pass --tokenizer-file PATH, or "
                            "fetch it once with `huggingface-cli download openai-community/gpt2 tokenizer.json`")


# ------------------------------------------------------------------------------------------ blocks


def encode_block(tok: Tokenizer, texts: list[bytes], line_offsets: list[np.ndarray], dtype: str = "int64",
                 lines: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Encode documents (UTF-8 bytes) into one stream, each document ended by ``tok.eot``.

    ``line_offsets[d]`` holds the byte offset of every source line in document d (at least [0]).
    Returns (tokens of ``dtype``, doc_starts int64 [D+1], line_starts int64: token offset of every line,
    or None without ``lines``: a byte-level BPE's shard index finds lines from the tokens' newlines).
    Bytes and characters are encoded a whole block at a time in numpy; BPE a whole document at a
    time (:func:`_encode_documents`: the tokens the model meets when it reads a document, newline
    and indent merges included), each line's first token found from the encoder's offsets."""
    n = len(texts)
    if n == 0:
        return np.zeros(0, dtype), np.zeros(1, np.int64), np.zeros(0, np.int64) if lines else None
    if not lines and hasattr(tok, "encode_documents"):  # BPE on tiktoken (trainer.data.fastbpe)
        return (*tok.encode_documents(texts, dtype), None)
    if not lines and hasattr(tok, "encode_with_ends"):  # BPE on the tokenizers library
        return _encode_documents(tok, texts, None, dtype)
    if isinstance(tok, ByteTokenizer | CharTokenizer):
        lens = np.fromiter((len(t) for t in texts), np.int64, n)
        byte_doc_starts = np.concatenate([[0], np.cumsum(lens)])
        lines_per_doc = np.fromiter((len(o) for o in line_offsets), np.int64, n)
        line_doc = np.repeat(np.arange(n), lines_per_doc)
        line_bytes = np.concatenate(line_offsets).astype(np.int64) + byte_doc_starts[line_doc]
        joined = b"".join(texts)
        if isinstance(tok, ByteTokenizer):
            body = np.frombuffer(joined, np.uint8)
            doc_body = byte_doc_starts
            line_body = line_bytes
        else:
            # character offsets: count the bytes that start a UTF-8 character before each offset
            raw = np.frombuffer(joined, np.uint8)
            starts = np.concatenate([[0], np.cumsum((raw & 0xC0) != 0x80)])
            body = tok.encode_array(joined.decode("utf-8", errors="replace"))
            doc_body, line_body = starts[byte_doc_starts], starts[line_bytes]
            if len(body) != doc_body[-1]:  # replacement characters changed the count: be exact
                return _encode_per_line(tok, texts, line_offsets, dtype)
        doc_starts = doc_body + np.arange(n + 1)
        tokens = np.empty(int(doc_starts[-1]), dtype)
        keep = np.ones(len(tokens), bool)
        keep[doc_starts[1:] - 1] = False  # each document's last token is end-of-text
        tokens[keep] = body
        tokens[doc_starts[1:] - 1] = tok.eot
        return tokens, doc_starts, line_body + line_doc
    if hasattr(tok, "encode_with_ends"):  # BPE on the tokenizers library
        return _encode_documents(tok, texts, line_offsets, dtype)
    return _encode_per_line(tok, texts, line_offsets, dtype)


def _char_offsets(text: bytes, decoded: str, byte_offsets: np.ndarray) -> np.ndarray:
    """Character offsets in ``decoded`` (``text`` decoded with replacement) of ``byte_offsets``."""
    raw = np.frombuffer(text, np.uint8)
    starts = np.concatenate([[0], np.cumsum((raw & 0xC0) != 0x80)])
    if starts[-1] == len(decoded):
        return starts[byte_offsets]
    # invalid UTF-8 somewhere: replacement characters changed the count; decode each prefix
    return np.fromiter((len(text[:b].decode("utf-8", errors="replace")) for b in byte_offsets.tolist()),
                       np.int64, len(byte_offsets))


def _encode_documents(tok: Any, texts: list[bytes], line_offsets: list[np.ndarray] | None, dtype: str
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each document encoded whole (then end-of-text); a line starts at the token holding its first
    character (a token that joins a newline and the next line's indent counts for the next line).
    Without ``line_offsets``, no line table (None)."""
    strs = [t.decode("utf-8", errors="replace") for t in texts]
    tokens: list[np.ndarray] = []
    lines: list[np.ndarray] = []
    doc_len = np.empty(len(texts), np.int64)
    lo = 0
    while lo < len(texts):  # ~1 MB of text per call: the encodings cost ~100 bytes a token
        hi, size = lo, 0
        while hi < len(texts) and (hi == lo or size < 1 << 20):
            size += len(texts[hi])
            hi += 1
        for k, (ids, ends) in enumerate(tok.encode_with_ends(strs[lo:hi])):
            d = lo + k
            tokens.append(np.append(ids.astype(dtype), np.asarray([tok.eot], dtype)))
            doc_len[d] = len(ids) + 1
            if line_offsets is None:
                continue
            at = np.asarray(line_offsets[d], np.int64)
            at = _char_offsets(texts[d], strs[d], at)
            lines.append(np.searchsorted(ends, at, side="right"))
        lo = hi
    doc_starts = np.concatenate([[0], np.cumsum(doc_len)]).astype(np.int64)
    if line_offsets is None:
        return (np.concatenate(tokens) if tokens else np.zeros(0, dtype)), doc_starts, None
    lines_per_doc = np.fromiter((len(o) for o in line_offsets), np.int64, len(line_offsets))
    line_starts = (np.concatenate(lines).astype(np.int64) + np.repeat(doc_starts[:-1], lines_per_doc)
                   if lines else np.zeros(0, np.int64))
    return (np.concatenate(tokens) if tokens else np.zeros(0, dtype)), doc_starts, line_starts


def _encode_per_line(tok: Tokenizer, texts: list[bytes], line_offsets: list[np.ndarray], dtype: str
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pieces: list[str] = []
    for t, offs in zip(texts, line_offsets, strict=True):
        bounds = [*offs.tolist(), len(t)]
        pieces.extend(t[a:b].decode("utf-8", errors="replace") for a, b in zip(bounds, bounds[1:], strict=False))
    lines_per_doc = np.fromiter((len(o) for o in line_offsets), np.int64, len(line_offsets))
    line_last = np.zeros(len(pieces), bool)  # the last line of each document is followed by end-of-text
    line_last[np.cumsum(lines_per_doc)[lines_per_doc > 0] - 1] = True
    # Encoded a few thousand lines at a time: the library's encodings and Python's lists of ids
    # cost ~100 bytes a token, which for a whole block would dwarf the block itself.
    parts, lengths = [], np.empty(len(pieces), np.int64)
    for lo in range(0, len(pieces), 4096):
        batch = pieces[lo : lo + 4096]
        ids = tok.encode_batch(batch) if isinstance(tok, BPETokenizer) else [tok.encode(p) for p in batch]
        for i, row in enumerate(ids):
            lengths[lo + i] = len(row) + int(line_last[lo + i])
        flat = [t for k, row in enumerate(ids) for t in ([*row, tok.eot] if line_last[lo + k] else row)]
        parts.append(np.asarray(flat, dtype))
    line_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(pieces) else \
        np.zeros(0, np.int64)
    ends = np.cumsum(lengths)[line_last] if len(pieces) else np.zeros(0, np.int64)
    doc_starts = np.concatenate([[0], ends]).astype(np.int64)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype)), doc_starts, line_starts
