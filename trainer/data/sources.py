"""Input files for preparation: finding them, opening them (compressed or not) and reading them as
documents, one piece (a file, or a byte range of a big uncompressed file) at a time.

A document is what ends with an end-of-text token and what the validation split decides on: a
JSON Lines record's text field, a Parquet row, or ``segment_lines`` lines of a text file (cut at
``max_doc_bytes`` so one endless line cannot take the memory).
"""

from __future__ import annotations

import bz2
import fnmatch
import gzip
import io
import json
import lzma
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
READ_BYTES = 1 << 22
ZERO = np.zeros(1, np.int64)


@dataclass(frozen=True)
class Source:
    path: str  # as opened
    name: str  # as recorded in provenance (relative to the folder given, or as given)
    size: int
    compression: str  # "" or one of COMPRESSIONS
    fmt: str  # "text" | "jsonl" | "parquet"


@dataclass(frozen=True)
class Piece:
    """A whole file (start 0, end -1) or the lines that start in bytes [start, end) of a plain file."""

    index: int
    source: int
    start: int
    end: int


def describe(path: Path, name: str) -> Source:
    suffixes = [s.lower() for s in path.suffixes]
    comp = suffixes[-1] if suffixes and suffixes[-1] in COMPRESSIONS else ""
    inner = suffixes[-2] if comp and len(suffixes) > 1 else (suffixes[-1] if suffixes and not comp else "")
    fmt = "jsonl" if inner in JSON_SUFFIXES else "parquet" if inner == ".parquet" else "text"
    return Source(str(path), name, path.stat().st_size, comp, fmt)


def _matches(rel: str, patterns: list[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def collect_sources(inputs: list[str], include: list[str] | None = None, exclude: list[str] | None = None
                    ) -> list[Source]:
    """Files in ``inputs`` (files, or folders searched recursively), in a fixed order. In folders,
    ``include``/``exclude`` globs match a file's path relative to the folder or its name."""
    out: list[Source] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            for f in sorted(x for x in p.rglob("*") if x.is_file()):
                rel = f.relative_to(p).as_posix()
                if any(part.startswith(".") for part in f.relative_to(p).parts):
                    continue  # .git, .cache, editors' files: never training text
                if include and not _matches(rel, include):
                    continue
                if exclude and _matches(rel, exclude):
                    continue
                out.append(describe(f, str(p / rel)))
        elif p.is_file():
            out.append(describe(p, str(p)))
        else:
            raise FileNotFoundError(f"data input {item} does not exist")
    return out


def collect_files(inputs: list[str]) -> list[Path]:
    return [Path(s.path) for s in collect_sources(inputs)]


def stdlib_sources() -> tuple[Path, list[Path]]:
    """The Python standard library's own .py files: a corpus every machine with Python has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    return root, files


def stdlib_source_list() -> list[Source]:
    root, files = stdlib_sources()
    return [describe(f, str(f.relative_to(root))) for f in files]


def plan_pieces(sources: list[Source], chunk_bytes: int) -> list[Piece]:
    """Big plain (uncompressed text or JSON Lines) files are cut into byte ranges so that several
    workers share one file (the $1000 8x H100 setup guide's one big file); the cut depends only on sizes, never on the
    number of workers, so the output does not either."""
    pieces: list[Piece] = []
    for i, s in enumerate(sources):
        if s.compression or s.fmt == "parquet" or s.size <= chunk_bytes:
            pieces.append(Piece(len(pieces), i, 0, -1))
            continue
        for start in range(0, s.size, chunk_bytes):
            pieces.append(Piece(len(pieces), i, start, min(start + chunk_bytes, s.size)))
    return pieces


# ------------------------------------------------------------------------------------------ reading


def open_stream(src: Source) -> tuple[io.RawIOBase | io.BufferedIOBase, object]:
    """(decompressed binary stream, raw file whose tell() is the bytes read from disk)."""
    raw = open(src.path, "rb")  # noqa: SIM115
    c = src.compression
    if not c:
        return raw, raw
    if c == ".gz":
        return gzip.GzipFile(fileobj=raw), raw
    if c == ".bz2":
        return bz2.BZ2File(raw), raw
    if c == ".xz":
        return lzma.LZMAFile(raw), raw
    try:
        import zstandard  # optional: only for .zst files
    except ImportError:
        raw.close()
        raise RuntimeError(f"{src.name}: .zst files need the 'zstandard' package (pip install zstandard)") from None
    return zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20), raw


class _Range:
    """The lines of a plain file that start in bytes [start, end)."""

    def __init__(self, f, start: int, end: int) -> None:
        self.f, self.end = f, end
        if start > 0:
            f.seek(start - 1)
            f.readline()  # the line holding byte start-1 belongs to the range before
        self.pos = f.tell()
        self.tail_done = False

    def read(self, n: int) -> bytes:
        if self.pos < self.end:
            data = self.f.read(min(n, self.end - self.pos))
            self.pos += len(data)
            if self.pos >= self.end and data and not data.endswith(b"\n"):
                data += self.f.readline()  # finish the line that started inside the range
                self.tail_done = True
            return data
        return b""


def _looks_binary(head: bytes) -> bool:
    return b"\x00" in head[:8192]


def text_docs(stream, segment_lines: int, max_doc_bytes: int) -> Iterator[tuple[bytes, int, np.ndarray]]:
    """(document bytes, 1-based first line, byte offset of each line start in it)."""
    buf, line_no, eof = b"", 1, False
    while True:
        if not eof:
            chunk = stream.read(READ_BYTES)
            if chunk:
                buf = buf + chunk if buf else chunk
            else:
                eof = True
        nl = np.flatnonzero(np.frombuffer(buf, np.uint8) == 10)
        pos, k = 0, 0
        while pos < len(buf):
            need = k + segment_lines - 1
            end = int(nl[need]) + 1 if need < len(nl) else (len(buf) if eof else -1)
            kk = need + 1  # newlines before end, when it follows the segment's last newline
            if end < 0 or end - pos > max_doc_bytes:
                if len(buf) - pos < max_doc_bytes and end < 0:
                    break
                end = pos + max_doc_bytes
                while end > pos + 1 and (buf[end] & 0xC0) == 0x80:  # whole UTF-8 characters
                    end -= 1
                kk = int(np.searchsorted(nl, end))
            elif need >= len(nl):
                kk = len(nl)  # the end of the file
            offs = np.concatenate([ZERO, nl[k:kk] + 1 - pos])
            if offs[-1] == end - pos:
                offs = offs[:-1]
            yield buf[pos:end], line_no, offs
            line_no += kk - k
            pos, k = end, kk
        buf = buf[pos:]
        if eof and not buf:
            return


def _lines(stream) -> Iterator[bytes]:
    rest = b""
    while True:
        chunk = stream.read(READ_BYTES)
        if not chunk:
            if rest:
                yield rest
            return
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        yield from parts


@dataclass
class PieceStats:
    lines: int = 0
    bad_records: int = 0
    binary: bool = False


def piece_docs(src: Source, piece: Piece, text_field: str, segment_lines: int, max_doc_bytes: int,
               stats: PieceStats, position: list[int]) -> Iterator[tuple[bytes, int, np.ndarray]]:
    """The documents of one piece. ``position[0]`` follows the bytes read from disk (for progress)."""
    if src.fmt == "parquet":
        yield from _parquet_docs(src, text_field, stats, position)
        return
    stream, raw = open_stream(src)
    try:
        base = raw.tell()
        reader = _Range(stream, piece.start, piece.end) if piece.end >= 0 else stream
        if src.fmt == "text":
            peek = reader.read(8192)
            if _looks_binary(peek):
                stats.binary = True
                return
            reader = _Prefixed(peek, reader)
            for doc in text_docs(reader, segment_lines, max_doc_bytes):
                position[0] = raw.tell() - base
                stats.lines += int(doc[2].shape[0]) if doc[0].endswith(b"\n") else int(doc[2].shape[0]) - 1
                yield doc
        else:
            for line in _lines(reader):
                stats.lines += 1
                s = line.strip()
                if not s:
                    continue
                try:
                    rec = json.loads(s)
                except ValueError:
                    stats.bad_records += 1
                    continue
                text = rec.get(text_field) if isinstance(rec, dict) else None
                if not isinstance(text, str):
                    stats.bad_records += 1
                    continue
                if text:
                    position[0] = raw.tell() - base
                    yield text.encode("utf-8", errors="replace"), stats.lines, ZERO
    finally:
        stream.close()
        raw.close()


class _Prefixed:
    def __init__(self, head: bytes, rest) -> None:
        self.head, self.rest = head, rest

    def read(self, n: int) -> bytes:
        if self.head:
            h, self.head = self.head, b""
            return h
        return self.rest.read(n)


def _parquet_docs(src: Source, text_field: str, stats: PieceStats, position: list[int]
                  ) -> Iterator[tuple[bytes, int, np.ndarray]]:
    try:
        import pyarrow.parquet as pq  # optional: only for parquet files
    except ImportError:
        raise RuntimeError(f"{src.name}: Parquet files need the 'pyarrow' package (pip install pyarrow)") from None
    if src.compression:
        raise ValueError(f"{src.name}: Parquet compresses its own columns; give the .parquet file itself")
    pf = pq.ParquetFile(src.path)
    if text_field not in pf.schema_arrow.names:
        raise ValueError(f"{src.name} has no column {text_field!r} (it has {', '.join(pf.schema_arrow.names)})")
    total = max(1, pf.metadata.num_rows)
    row = 0
    for batch in pf.iter_batches(batch_size=4096, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            row += 1
            if not isinstance(text, str):
                stats.bad_records += 1
                continue
            if text:
                position[0] = src.size * row // total
                yield text.encode("utf-8", errors="replace"), row, ZERO
    stats.lines = row
