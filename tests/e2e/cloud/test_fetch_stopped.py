"""`fetch-best` and `mirror` on a run whose pod `--on-end stop` kept (issue 41 rule 6): the pod is started,
read over SSH (sha256 verified), and stopped again, never terminated, also when the read fails; the start
command (boot guard, resume.sh) runs at every start as on the services (startcmd.py), and neither stops the
pod under the read nor resumes the finished run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running
from tests.e2e.cloud.test_outbid_resume import checkpoint_steps, rows
from tests.e2e.cloud.test_restarted_pod import ended_by_stop
from tests.support.cli import cli


def _ends(emu, pod_id: str) -> list[tuple[str, str]]:
    return [(e.event, e.by) for e in emu.ledger.ended(pod_id) if e.event in ("stopped", "terminated")]


def _starts(emu, pod_id: str) -> int:
    return sum(1 for e in emu.ledger.events if e.pod_id == pod_id and e.event == "started")


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_fetch_best_starts_a_stopped_pod_reads_it_and_stops_it_again(provider, request, capsys, tmp_path,
                                                                      monkeypatch):
    name = f"fetch-stopped-{provider}"
    # the guard's window, 25 s: longer than a read here
    emu, record = ended_by_stop(request, capsys, tmp_path, monkeypatch, provider, name, "25")
    pod_id, workdir = record.instance_id, Path(record.workdir)
    assert _ends(emu, pod_id) == [("stopped", "pod-key")]
    kept = checkpoint_steps(workdir)

    dest = tmp_path / "best"
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(dest), "--json")
    assert code == 0, err
    said = " ".join(err.split())
    assert f"pod {pod_id} is stopped: starting it to read the run ($" in said and "/h while it runs" in said
    assert "never terminated" in said and f"pod {pod_id} stopped again" in said
    fetched = json.loads(out)
    first = _hashes(Path(fetched["dest"]))
    assert fetched["files"] and fetched["step"] in kept
    # started once, stopped again by this machine's call (the account key), never terminated
    assert _starts(emu, pod_id) == 1
    assert _ends(emu, pod_id) == [("stopped", "pod-key"), ("stopped", "account-key")]
    assert not any(r.get("event") == "resumed" for r in rows(workdir))  # the finished run did not start again
    assert "left up for copying" in (workdir / "watchdog.log").read_text()  # resume.sh saw the run over
    # the path that stopped the pod, from its watchdog.json, is in the run record and in `status`
    path = {"runpod": "REST v2", "vast": "API"}[provider]
    assert runs.load(name).ended_by == path
    code, out, err = cli(capsys, "status", name)
    assert code == 0, err
    words = {"runpod": "pod key via REST v2", "vast": "instance key via the vast.ai API"}[provider]
    assert "ended by" in out and words in " ".join(out.split()), out

    # twice works the same (the endpoint the start gave is recorded)
    code, out, err = cli(capsys, "mirror", name)
    assert code == 0, err
    assert _starts(emu, pod_id) == 2 and len(_ends(emu, pod_id)) == 3

    # a read that fails (the checkpoints on the pod's disk no longer match their sha256) leaves the pod
    # stopped and the last good copy here intact
    rotten = [f for f in workdir.glob("checkpoints/*/*") if f.is_file() and f.name != "meta.json"]
    assert rotten
    for f in rotten:
        with f.open("ab") as fh:
            fh.write(b"bit rot")
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(dest))
    assert code != 0
    assert _starts(emu, pod_id) == 3
    assert _ends(emu, pod_id)[-1] == ("stopped", "account-key") and len(_ends(emu, pod_id)) == 4
    assert _hashes(Path(fetched["dest"])) == first
    assert pod_id in emu.ledger.alive() and checkpoint_steps(workdir) == kept

    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
