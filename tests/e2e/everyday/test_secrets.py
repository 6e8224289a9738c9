"""Secrets by name (``--env NAME``, task.yaml ``env_from_local``): the values reach the job through the
pod's 0600 env file and nowhere else: not a file, log or run record on either side, not a process's
command line, not gpucli's output. A real launch of a job over a real sshd."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from gpucli.errors import UsageError
from gpucli.runs import records as runs
from gpucli.runs.secretenv import check_name, lookup, resolve
from tests.support.cli import cli, wait_for

JOB = '''
import hashlib, json, os, pathlib, time
names = ["A_SECRET", "WANDB_API_KEY", "HF_TOKEN", "PLAIN"]
seen = {n: hashlib.sha256(os.environ.get(n, "").encode()).hexdigest() for n in names}
pathlib.Path("seen.json").write_text(json.dumps(seen))
print("step 1: loss 2.5", flush=True)
deadline = time.time() + 90
while not pathlib.Path("go").exists() and time.time() < deadline:
    time.sleep(0.1)
print("step 2: loss 2.0", flush=True)
'''


@pytest.fixture(autouse=True)
def quick_guards(monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "15")


def _cmdlines() -> list[bytes]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((p / "cmdline").read_bytes())
            except OSError:
                pass
    return out


def _files(*roots: Path, skip: set[Path]) -> list[Path]:
    found = []
    for root in roots:
        for dirpath, _dirs, names in os.walk(root):
            for n in names:
                p = Path(dirpath) / n
                if p not in skip and p.is_file() and not p.is_symlink():
                    found.append(p)
    return found


def test_env_secrets_reach_the_job_and_nothing_else(capsys, tmp_path, sshd, client_key, monkeypatch, isolated_home):
    secrets = {"A_SECRET": "s3cr3t-from-env-" + os.urandom(8).hex(),
               "WANDB_API_KEY": "wandb-from-keys-" + os.urandom(8).hex(),
               "HF_TOKEN": "hf_fromtokenfile" + os.urandom(8).hex()}
    monkeypatch.setenv("A_SECRET", secrets["A_SECRET"])
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hf_home = tmp_path / "hf"
    hf_home.mkdir()
    (hf_home / "token").write_text(secrets["HF_TOKEN"] + "\n")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(secrets["WANDB_API_KEY"]))
    code, out, err = cli(capsys, "keys", "set", "wandb")
    assert code == 0, err
    logs = out + err

    src = tmp_path / "code"
    src.mkdir()
    (src / "job.py").write_text(JOB)
    task = tmp_path / "task.yaml"
    task.write_text(f"run: {sys.executable} job.py\ncode: code\nenv: {{PLAIN: plain-value}}\n"
                    "env_from_local: [HF_TOKEN]\n")
    wd = tmp_path / "pod" / "sec"
    code, out, err = cli(capsys, "launch", str(task), "--name", "sec", "--provider", "ssh", "--host",
                         f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]), "--python",
                         sys.executable, "--workdir", str(wd), "--env", "A_SECRET", "--env", "WANDB_API_KEY")
    assert code == 0, err
    logs += out + err
    seen_file = wait_for(lambda: (wd / "code" / "seen.json").exists() and wd / "code" / "seen.json", 60, "the job")
    # while the job runs: no process on this machine (the laptop's and the pod's side) has a value
    # on its command line
    for cmdline in _cmdlines():
        for value in secrets.values():
            assert value.encode() not in cmdline, cmdline
    seen = json.loads(seen_file.read_text())
    for name, value in {**secrets, "PLAIN": "plain-value"}.items():
        assert seen[name] == hashlib.sha256(value.encode()).hexdigest(), name
    env_file = wd / "env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    (wd / "code" / "go").write_text("")
    wait_for(lambda: json.loads((wd / "status.json").read_text()).get("state") == "finished"
             if (wd / "status.json").exists() else False, 60, "the job to finish")
    for args in (("status", "sec", "--json"), ("tail", "sec", "--no-follow"), ("ls", "--json")):
        code, out, err = cli(capsys, *args)
        logs += out + err

    record = runs.load("sec")
    assert record.launch["request"]["env_names"] == ["A_SECRET", "WANDB_API_KEY"]
    assert record.launch["own"]["env_from_local"] == ["HF_TOKEN"]
    assert record.launch["own"]["env"] == ["PLAIN"]  # names, not values
    # every file on both sides but the pod's env file (and the stores the user put the values in)
    skip = {env_file, hf_home / "token", isolated_home / "keys.json"}
    files = _files(isolated_home, tmp_path, sshd.root, skip=skip)
    assert any(f.name == "sec.json" for f in files) and any(f.name == "console.log" for f in files)
    for f in files:
        data = f.read_bytes()
        for value in [*secrets.values(), "plain-value"]:
            if value == "plain-value" and f.name in ("task.yaml",):
                continue
            assert value.encode() not in data, f"{value[:8]}... found in {f}"
    for value in secrets.values():
        assert value not in logs


def test_resume_reads_task_env_values_again(tmp_path):
    from gpucli.run.starting.jobs.own import task_from_json, task_to_json
    from gpucli.runs.task import load_task

    task_file = tmp_path / "task.yaml"
    task_file.write_text("run: python t.py\nenv: {MODE: offline}\nenv_from_local: [HF_TOKEN]\n")
    task = load_task(task_file)
    stored = json.loads(json.dumps(task_to_json(task)))
    assert "offline" not in json.dumps(stored)
    assert task_from_json(stored).env == (("MODE", "offline"),)
    task_file.write_text("run: python t.py\n")
    with pytest.raises(UsageError, match="names, not values"):
        task_from_json(stored)
    # a record of an older version (pairs) is read as it is
    assert task_from_json({**stored, "env": [["MODE", "x"]]}).env == (("MODE", "x"),)


@pytest.mark.parametrize("bad", ["A=1", "1X", "GPUCLI_HOME", "a b"])
def test_bad_names_are_one_line(bad):
    with pytest.raises(UsageError):
        check_name(bad)


def test_missing_secret_fails_before_renting(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("NOPE_TOKEN", raising=False)
    code, out, err = cli(capsys, "launch", "--code", str(tmp_path), "--run", "true", "--provider", "runpod",
                         "--profile", "rtx4090", "--env", "NOPE_TOKEN")
    assert code != 0 and "NOPE_TOKEN" in err and "Traceback" not in err
    code, out, err = cli(capsys, "launch", "--code", str(tmp_path), "--run", "true", "--env", "NOPE=1")
    assert code != 0 and "name only" in err


def test_lookup_order(monkeypatch, tmp_path):
    from gpucli.settings import save_key

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    (tmp_path / "token").write_text("from-file\n")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert lookup("HF_TOKEN") == ("from-file", "the `hf auth login` token file")
    save_key("hf", "from-keys")
    assert lookup("HF_TOKEN")[0] == "from-keys"
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert resolve(["HF_TOKEN"]) == {"HF_TOKEN": "from-env"}
    save_key("MY_TOKEN", "generic")
    assert lookup("MY_TOKEN") == ("generic", "gpucli keys (MY_TOKEN)")


def test_bundled_trainer_gets_env_secrets_by_name(capsys, tmp_path, monkeypatch, isolated_home):
    from tests.support.cli import FAST_TRAINER

    value = "trainer-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("A_SECRET", value)
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "tr-sec", "--env", "A_SECRET",
                         *FAST_TRAINER[:-2], "--steps", "3")
    assert code == 0, err
    record = runs.load("tr-sec")
    assert record.launch["request"]["env_names"] == ["A_SECRET"]
    env_file = Path(record.workdir) / "env"
    assert f"A_SECRET={value}" in env_file.read_text() or f"A_SECRET='{value}'" in env_file.read_text()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    wait_for(lambda: runs.load("tr-sec").status != "running" or not any(
        value.encode() in c for c in _cmdlines()), 5, "a look at the process table")
    for cmdline in _cmdlines():
        assert value.encode() not in cmdline
    code, out2, err2 = cli(capsys, "down", "tr-sec")
    for f in _files(isolated_home, skip={env_file}):
        assert value.encode() not in f.read_bytes(), f
    assert value not in out + err + out2 + err2
