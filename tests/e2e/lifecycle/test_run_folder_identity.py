"""A new run is never answered by an old one (issue 41 point 10), over a real sshd.

On a host that still had the folder of an earlier run of the same name, a new launch whose job failed
at import was reported ``finished`` by the old run's files. Each run now has an id, written into its
folder by the launch (an earlier run's folder is moved aside, never deleted, never mixed) and checked
by every command that opens the folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpucli.runs import records as runs
from gpucli.runs.runid import RUN_ID_FILE
from tests.e2e.owncode.helpers import finished_rows
from tests.support.cli import cli


def _launch(capsys, tmp_path: Path, sshd, client_key, name: str, script: str, tag: str) -> tuple[int, str, str]:
    code_dir = tmp_path / f"code-{tag}"
    code_dir.mkdir()
    (code_dir / "job.py").write_text(script)
    return cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} job.py", "--name", name,
               "--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
               "--python", sys.executable, "--workdir", str(tmp_path / "pod" / name))


def test_an_earlier_runs_folder_never_answers_for_a_new_run(capsys, tmp_path, sshd, client_key):
    code, out, err = _launch(capsys, tmp_path, sshd, client_key, "same", "print('old run done')\n", "old")
    assert code == 0, err
    finished_rows(capsys, "same")
    old_id = runs.load("same").run_id
    folder = tmp_path / "pod" / "same"
    assert old_id and (folder / RUN_ID_FILE).read_text() == old_id
    (runs.runs_dir() / "same.json").unlink()  # the laptop forgot the run; the host kept its folder

    code, out, err = _launch(capsys, tmp_path, sshd, client_key, "same", "import no_such_module_here\n", "new")
    new = runs.load("same")
    assert new.run_id and new.run_id != old_id
    assert "moved aside to" in out + err
    aside = [p for p in folder.parent.iterdir() if p.name.startswith("same.earlier-")]
    assert len(aside) == 1 and (aside[0] / RUN_ID_FILE).read_text() == old_id  # kept, not deleted
    assert (folder / RUN_ID_FILE).read_text() == new.run_id

    def settled():
        c, o, _ = cli(capsys, "status", "same", "--json")
        state = json.loads(o)["state"] if c == 0 else None
        return state if state in ("failed", "finished") else None

    from tests.support.cli import wait_for

    assert wait_for(settled, 120, "the new run to end") == "failed"  # never the old run's "finished"


def test_a_folder_holding_another_runs_id_is_refused_by_every_reader(capsys, tmp_path, sshd, client_key):
    code, out, err = _launch(capsys, tmp_path, sshd, client_key, "mine", "print('done')\n", "mine")
    assert code == 0, err
    finished_rows(capsys, "mine")
    (tmp_path / "pod" / "mine" / RUN_ID_FILE).write_text("0123456789abcdef")  # another run took the folder
    for cmd in (["status", "mine", "--json"], ["tail", "mine", "--json"], ["fetch-best", "mine", "--dest",
                                                                            str(tmp_path / "d")]):
        code, out, err = cli(capsys, *cmd)
        text = out + err
        assert "belongs to another run" in text, (cmd, text)
        assert "Traceback" not in text and "internal error" not in text
