"""`gpucli serve CHECKPOINT` end to end: the real console entry starts trainer.serve, prints the URL,
and the API answers there; Ctrl-C stops both. Bad input is one line, no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.sshd import free_port

REPO = Path(__file__).resolve().parents[3]


def test_serve_a_checkpoint_folder(tiny_checkpoint, isolated_home):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "serve", str(tiny_checkpoint),
                             "--port", str(port)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1", proc.stderr.read() if proc.poll() is not None else url
        rest = proc.stdout.readline() + proc.stdout.readline() + proc.stdout.readline() + proc.stdout.readline()
        assert "python -m trainer.sample --checkpoint" in rest and "--prompts-file" in rest
        with urllib.request.urlopen(url + "/models", timeout=30) as r:
            assert json.loads(r.read())["data"][0]["id"] == tiny_checkpoint.name
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)  # a deadline: a loaded machine can take long to end a server
    assert proc.returncode == 130 or proc.returncode != 0  # interrupted, not a crash: the server is gone too
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/models", timeout=5)
    assert (isolated_home / "serve" / f"{tiny_checkpoint.name}.log").exists()


def test_serve_unknown_run_is_one_line(isolated_home):
    r = subprocess.run([sys.executable, "-m", "gpucli.cli.entry", "serve", "no-such-run"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_serve_json_is_one_line_with_the_url_once_it_answers(tiny_checkpoint, isolated_home):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "serve", str(tiny_checkpoint),
                             "--port", str(port), "--json"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read() if proc.poll() is not None else "no line"
        data = json.loads(first)
        assert data["url"] == f"http://127.0.0.1:{port}/v1" and data["engine"] == "own"
        assert data["checkpoint"] == str(tiny_checkpoint.resolve()) and data["log"].endswith(".log")
        with urllib.request.urlopen(data["url"] + "/models", timeout=30) as r:  # it answers already
            assert json.loads(r.read())["data"][0]["id"] == tiny_checkpoint.name
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert out.strip() == ""  # nothing but the one JSON line on stdout


def test_serve_a_run_caches_its_checkpoint_in_gpucli_home_not_the_current_folder(capsys, isolated_home, tmp_path):
    """`gpucli serve RUN` from a project folder (a git checkout, say) leaves that folder untouched: the
    run's best checkpoint goes to GPUCLI_HOME/serve/checkpoints unless --dest says otherwise."""
    from tests.support.cli import FAST_TRAINER, cli, wait_for

    name = "serve-cache"
    code, _, err = cli(capsys, "launch", "--provider", "local", "--profile", "cpu", "--phase", "fast", "--name", name,
                       "--set", "data.max_bytes=200000", *FAST_TRAINER[:-2], "--steps", "10")
    assert code == 0, err

    def finished():
        code, out, _ = cli(capsys, "status", name, "--json")
        return code == 0 and json.loads(out).get("state") in ("finished", "stopped", "failed")

    wait_for(finished, 300, "the run to finish")
    project = tmp_path / "project"
    project.mkdir()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "serve", name, "--port", str(port)],
                            cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1", proc.stderr.read() if proc.poll() is not None else url
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    assert list(project.iterdir()) == []
    cached = list((isolated_home / "serve" / "checkpoints").iterdir())
    assert [p.name for p in cached] == [f"{name}-best"]
    assert (cached[0] / "meta.json").is_file()
