"""Nothing leaves this machine that the user did not put in the folder, against a real sshd.

A repo with links out of it (to a private key), a ``.gitignore`` / ``.gpucliignore`` that re-include
``.git``, credential files, and hostile ignore patterns: the sync sends the folder's own files only,
names the links it left out in one line, and matches patterns in time linear in the name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpucli.errors import GpucliError, TransferError, UsageError
from gpucli.run.starting.jobs.own import code_excludes
from gpucli.ssh.remote import Remote, SshTarget
from gpucli.ssh.transfer import IgnoreRules


@pytest.fixture
def remote(sshd, client_key):
    with Remote(SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))) as r:
        yield r


def hostile_repo(tmp_path: Path) -> tuple[Path, Path]:
    secret = tmp_path / "home" / ".ssh" / "id_ed25519"
    secret.parent.mkdir(parents=True)
    secret.write_text("-----BEGIN OPENSSH " + "PRIVATE KEY----- laptop key (a stand-in, not a key)")
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "train.py").write_text("print('hi')\n")
    (repo / "src" / "model.py").write_text("x = 1\n")
    (repo / "src" / "key").symlink_to(secret)  # a file link out of the folder
    (repo / "home").symlink_to(secret.parent.parent)  # a folder link out of it
    (repo / "alias.py").symlink_to(repo / "train.py")  # a link inside: followed
    (repo / "dots").symlink_to("../repo/../home/.ssh/id_ed25519")  # relative, climbing out
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text("[credential]\n helper = store\n")
    (repo / "sub" / ".git").mkdir(parents=True)
    (repo / "sub" / ".git" / "HEAD").write_text("ref: main\n")
    for name in (".netrc", ".git-credentials", "id_rsa", ".pypirc"):
        (repo / name).write_text("secret\n")
    (repo / ".ssh").mkdir()
    (repo / ".ssh" / "authorized_keys").write_text("secret\n")
    (repo / ".gitignore").write_text("!.git/\n!.git\n!.netrc\n!id_rsa\n")
    (repo / ".gpucliignore").write_text("!.git/\n!**/.git/**\n")
    return repo, secret


def test_links_out_git_and_credentials_never_reach_the_pod(remote, tmp_path):
    repo, secret = hostile_repo(tmp_path)
    events: list[str] = []
    dest = tmp_path / "pod" / "code"
    stats = remote.sync_up(repo, str(dest), excludes=code_excludes(repo, events.append))
    sent = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert sent == [".gitignore", ".gpucliignore", "alias.py", "src/model.py", "train.py"], sent
    assert (dest / "alias.py").read_text() == "print('hi')\n"
    assert not any("laptop key" in p.read_text() for p in dest.rglob("*") if p.is_file())
    assert sorted(stats.links_left_out) == ["dots", "src/key"]
    (line,) = [e for e in events if "symlink" in e]
    assert "2 symlink(s) pointing outside the folder" in line and "src/key" in line and "\n" not in line


def test_an_unreadable_folder_is_one_line(remote, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads every folder")
    repo = tmp_path / "repo"
    (repo / "locked").mkdir(parents=True)
    (repo / "a.py").write_text("1\n")
    (repo / "locked").chmod(0)
    try:
        with pytest.raises(TransferError) as exc:
            remote.sync_up(repo, str(tmp_path / "pod"))
        assert "locked: cannot read this folder" in str(exc.value)
    finally:
        (repo / "locked").chmod(0o755)


@pytest.mark.parametrize("pattern", ["[z-a]", "*.py[9-0]", "[!b-a]x"])
def test_a_bad_range_is_one_line(pattern, tmp_path):
    with pytest.raises(UsageError) as exc:
        IgnoreRules([pattern])
    assert isinstance(exc.value, GpucliError) and pattern in str(exc.value) and "\n" not in str(exc.value)


def test_a_bad_range_in_the_folders_ignore_file_is_one_line_on_sync(remote, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("1\n")
    (repo / ".gpucliignore").write_text("[z-a]\n")
    with pytest.raises(GpucliError) as exc:
        remote.sync_up(repo, str(tmp_path / "pod"))
    assert "[z-a]" in str(exc.value)


HOSTILE = ["*a*a*a*a*a*a*a*a*a*a*a*b", "**/**/**/**/**/**/**/**/x", "a*/**/a*/**/a*/**/b", "/*a*a*a*a*a*a*a*c",
           "**a**a**a**a**a**b", "[a]*[a]*[a]*[a]*[a]*[a]*d"]


@pytest.mark.parametrize("negate", [False, True])
def test_hostile_patterns_take_steps_linear_in_the_name(negate):
    """Counted in steps, not seconds: the matcher visits at most (tokens x characters) states."""
    from gpucli.ssh import globmatch

    rules = IgnoreRules((["!keep"] if negate else []) + HOSTILE)
    steps = 0
    real = globmatch._closure

    def counting(toks, states):
        nonlocal steps
        steps += len(states)
        return real(toks, states)

    globmatch._closure = counting
    try:
        for n in (200, 400, 800):
            steps = 0
            assert not rules.ignored("a" * n, False)
            assert not rules.ignored("a/" * (n // 2), True)
            per_char = steps / n
            assert per_char < 40 * len(HOSTILE), (n, steps)
    finally:
        globmatch._closure = real
    _ = time


def test_ordinary_patterns_still_match_as_gitignore_does():
    rules = IgnoreRules(["*.pyc", "build/", "/top.txt", "docs/**/*.md", "!keep.pyc", "data/**", "a?c", "[ab]x"])
    cases = {("x.pyc", False): True, ("d/keep.pyc", False): False, ("build", True): True, ("build", False): False,
             ("top.txt", False): True, ("d/top.txt", False): False, ("docs/a/b/c.md", False): True,
             ("docs/c.md", False): True, ("data/x/y", False): True, ("abc", False): True, ("d/bx", False): True,
             ("cx", False): False}
    assert {k: rules.ignored(*k) for k in cases} == cases


def test_a_bad_ignore_pattern_in_the_code_is_said_before_anything_is_rented(tmp_path, capsys, runpod_emulator):
    from gpucli.runs import records as runs
    from tests.support.cli import cli

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print(1)\n")
    (repo / ".gitignore").write_text("*.log\n[z-a]\n")
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--code", str(repo),
                         "--run", "python train.py", "--name", "badignore")
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert code != 0 and len(lines) == 1 and "[z-a]" in lines[0] and "internal error" not in err, err
    assert runpod_emulator.ledger.created() == []
    assert not (runs.runs_dir() / "badignore.json").exists()
