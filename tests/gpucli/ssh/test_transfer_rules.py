"""The pure parts of syncing: gitignore-style excludes, manifests, part names."""

from __future__ import annotations

import os
from pathlib import Path

from gpucli.ssh.transfer import (
    IgnoreRules,
    is_part,
    load_ignore,
    parse_manifest,
    part_name,
    parts_of,
    walk_local,
)


def test_gitignore_semantics():
    rules = IgnoreRules(["*.log", "build/", "/top.txt", "docs/**/*.tmp", "!keep.log", "# comment", ""])
    assert rules.ignored("a.log", False)
    assert rules.ignored("deep/x/a.log", False)
    assert not rules.ignored("keep.log", False)
    assert rules.ignored("build", True)
    assert rules.ignored("src/build", True)
    assert not rules.ignored("build", False)  # dir-only pattern does not hit a file
    assert rules.ignored("top.txt", False)
    assert not rules.ignored("sub/top.txt", False)  # anchored
    assert rules.ignored("docs/a/b/c.tmp", False)
    assert rules.ignored("docs/c.tmp", False)
    assert not rules.ignored("other/c.tmp", False)


def test_rules_without_negation_match_like_the_ordered_rules():
    # Without '!' the rules fold into one regex per kind; it must decide exactly as the ordered list.
    patterns = ["*.log", "build/", "/top.txt", "docs/**/*.tmp", ".git/", "__pycache__/", "*.py[co]", "a?c"]
    fast = IgnoreRules(patterns)
    ordered = IgnoreRules(patterns + ["!never-matches-anything"])
    paths = ["a.log", "x/a.log", "build", "src/build", "top.txt", "sub/top.txt", "docs/a/b.tmp",
             "docs/b.tmp", "other/b.tmp", ".git", "m/__pycache__", "m.pyc", "m.pyo", "m.py", "abc", "abbc"]
    for rel in paths:
        for is_dir in (False, True):
            assert fast.ignored(rel, is_dir) == ordered.ignored(rel, is_dir), (rel, is_dir)
    assert fast.ignored("x/a.log", False) and not fast.ignored("build", False) and fast.ignored("build", True)
    assert not IgnoreRules([]).ignored("anything", False)


def test_walk_honours_gpucliignore_and_prunes_dirs(tmp_path: Path):
    for rel in ["a.py", "data/x.bin", "data/skip/y.bin", "__pycache__/m.pyc", "notes.md", "ckpt/a.pt"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
    (tmp_path / ".gpucliignore").write_text("data/skip/\n*.md\nckpt/\n")
    files = walk_local(tmp_path, load_ignore(tmp_path, ["__pycache__/"]))
    assert [f.rel for f in files] == [".gpucliignore", "a.py", "data/x.bin"]
    assert files[1].size == len("a.py") and files[1].mtime == int(os.stat(tmp_path / "a.py").st_mtime)


def test_manifest_and_part_names():
    raw = b"12 1700000000.5000000000 a/b c.txt\x003 1700000001.0 x\x00"
    m = parse_manifest(raw)
    assert m["a/b c.txt"].size == 12 and m["a/b c.txt"].mtime == 1700000000
    part = part_name("d/big.bin", 100, 7)
    assert part == "d/.big.bin.100.7.gpucli-part" and is_part(part)
    remote = {part: None, "d/.big.bin.99.1.gpucli-part": None, "d/big.bin": None}
    assert sorted(parts_of("d/big.bin", remote)) == sorted([part, "d/.big.bin.99.1.gpucli-part"])
