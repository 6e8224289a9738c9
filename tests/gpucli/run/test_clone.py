"""`--code git+https://...@ref`: the clone on the host (a local repository stands in for the remote one;
the URL's form is checked by gpucli.runs.task), with the token only in the 0600 env file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpucli.errors import GpucliError
from gpucli.providers.registry import LocalHost
from gpucli.run.starting.jobs.own import clone
from gpucli.runs.task import GitCode


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "train.py").write_text("print('v1')\n")
    git("add", ".", cwd=repo)
    git("commit", "-qm", "v1", cwd=repo)
    git("tag", "v1", cwd=repo)
    (repo / "train.py").write_text("print('v2')\n")
    git("commit", "-qam", "v2", cwd=repo)
    return repo


def test_clone_at_a_ref_with_the_token_in_the_env_file_only(tmp_path, upstream):
    wd = tmp_path / "run"
    (wd / "code").mkdir(parents=True)
    host = LocalHost()
    host.write_env_file(str(wd / "env"), {"GPUCLI_GIT_TOKEN": "tok-never-on-a-command-line"})
    events: list[str] = []
    clone(host, str(wd), GitCode(url=str(upstream), ref="v1"), events.append)
    assert (wd / "code" / "train.py").read_text() == "print('v1')\n"
    assert not any("tok-never" in e for e in events)
    # again on the same host after the branch moved on: fetched, and the branch as the remote has it now
    (upstream / "train.py").write_text("print('v3')\n")
    git("commit", "-qam", "v3", cwd=upstream)
    clone(host, str(wd), GitCode(url=str(upstream), ref="main"), events.append)
    assert (wd / "code" / "train.py").read_text() == "print('v3')\n"


def test_a_missing_repo_is_one_error(tmp_path):
    wd = tmp_path / "run"
    (wd / "code").mkdir(parents=True)
    host = LocalHost()
    host.write_env_file(str(wd / "env"), {})
    with pytest.raises(GpucliError, match="git clone of .* failed"):
        clone(host, str(wd), GitCode(url=str(tmp_path / "nope"), ref=None), lambda m: None)
