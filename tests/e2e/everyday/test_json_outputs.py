"""``--json`` on the commands that report an outcome, against a run on a real sshd."""

from __future__ import annotations

import json

from gpucli.runs import records as runs
from tests.support.cli import cli


def test_sync_mirror_watch_down_json(capsys, tmp_path, ssh_run):
    data = tmp_path / "extra"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    (tmp_path / "b.txt").write_text("world")
    code, out, err = cli(capsys, "sync", "r1", str(data), str(tmp_path / "b.txt"), "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [row["path"] for row in lines] == [str(data), str(tmp_path / "b.txt")]
    assert all(row["files_sent"] == 1 for row in lines)

    code, out, err = cli(capsys, "mirror", "r1", "--json")
    assert code == 0, err
    mirrored = json.loads(out)
    assert mirrored["run"] == "r1" and mirrored["checkpoint"] is None and "mirror" in mirrored

    code, out, err = cli(capsys, "down", "r1", "--json")
    assert code == 0, err
    downed = json.loads(out)
    assert downed["run"] == "r1" and downed["status"] == "stopped" and downed["ended_pod"] is False

    code, out, err = cli(capsys, "watch", "r1", "--json", "--poll", "0.1")
    assert code == 0, err
    last = json.loads(out.splitlines()[-1])
    assert last["run"] == "r1" and last["ended"] == "ended"
    assert runs.load("r1").status == "stopped"


def test_down_strays_json_without_providers(capsys):
    code, out, err = cli(capsys, "down", "--strays", "--json")
    assert code == 0, err
    assert json.loads(out) == {"strays": [], "ended": False}
