"""`gpucli export RUN` end to end through the real console entry, for a run on an SSH host (the sshd
fixture): the export is made on the host by ``python -m trainer.export`` and downloaded, or pushed from
the host to a Hub (the emulator, at HF_ENDPOINT) with the token only in a 0600 file that is gone after;
an architecture that does not map is refused in one line."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from gpucli.ssh.remote import SshTarget
from tests.support.emulators.hfhub import HubEmulator
from tests.trainer.conftest import write_checkpoint
from trainer.spec.presets import MODELS

pytest.importorskip("huggingface_hub")
REPO = Path(__file__).resolve().parents[3]
TOKEN = "hf_test_" + "x" * 30


def _run(tmp_path: Path, sshd, client_key, spec=None) -> runs.RunRecord:
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "code").symlink_to(REPO)  # the trainer as the launch ships it to the run's folder
    write_checkpoint(workdir, spec=spec or dataclasses.replace(MODELS["tiny"], vocab_size=257), seed=1)
    ssh = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    record = runs.RunRecord(name="exprun", provider="ssh", created_at=runs.now_iso(), profile="cpu", phase="fast",
                            model="tiny", n_gpus=1, gpu=None, workdir=str(workdir), status="finished", ssh=ssh,
                            python=sys.executable)
    runs.save(record)
    return record


def _serving_processes(workdir: str) -> list[int]:
    """Live processes whose command line is trainer.serve on ``workdir``'s checkpoints."""
    import time

    time.sleep(1)  # SIGTERM is delivered; give the interpreter a moment to exit
    found = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if "trainer.serve" in cmd and f"{workdir}/checkpoints" in cmd and state != "Z":
            found.append(int(p.name))
    return found


def _gpucli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    full.update(PYTHONPATH=str(REPO), GPUCLI_HOME=str(home), HF_HOME=str(home / "hf"), **env)
    return subprocess.run([sys.executable, "-m", "gpucli.cli.entry", *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=300)


def test_export_is_made_on_the_host_and_downloaded(tmp_path, sshd, client_key, isolated_home):
    record = _run(tmp_path, sshd, client_key)
    r = _gpucli(isolated_home, "export", "exprun", "--dest", str(tmp_path / "got"))
    assert r.returncode == 0, r.stderr
    local = tmp_path / "got" / "exprun-hf"
    assert r.stdout.splitlines()[0] == str(local)
    remote = Path(record.workdir) / "export"
    names = sorted(p.name for p in remote.iterdir())
    assert names == sorted(p.name for p in local.iterdir())
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(names)
    for n in names:
        assert (local / n).read_bytes() == (remote / n).read_bytes()
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(local)
    assert type(model).__name__ == "GPT2LMHeadModel"

    # --json: one document with the folder, the architecture and the files
    r = _gpucli(isolated_home, "export", "exprun", "--dest", str(tmp_path / "again"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["folder"] == str(tmp_path / "again" / "exprun-hf") and data["architecture"] == "GPT2LMHeadModel"
    assert sorted(data["files"]) == names and data["pushed_url"] is None and data["bytes"] > 0


def test_push_uploads_from_the_host_with_the_token_in_a_0600_file(tmp_path, sshd, client_key, isolated_home):
    record = _run(tmp_path, sshd, client_key)
    with HubEmulator(TOKEN) as hub:
        r = _gpucli(isolated_home, "export", "exprun", "--push", "me/tiny", "--private",
                    HF_TOKEN=TOKEN, HF_ENDPOINT=hub.url)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == f"{hub.url}/me/tiny"
        repo = hub.repos["me/tiny"]
        assert repo.private and len(repo.commits) == 1
        remote = Path(record.workdir) / "export"
        assert {n: hashlib.sha256(b).hexdigest() for n, b in repo.files.items()} == {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in remote.iterdir()}
        assert {auth for _, _, auth in hub.requests} == {f"Bearer {TOKEN}"}
        assert TOKEN not in r.stdout + r.stderr
        # --json: the pushed URL, the architecture and the files, as one document
        r = _gpucli(isolated_home, "export", "exprun", "--push", "me/tiny", "--json",
                    HF_TOKEN=TOKEN, HF_ENDPOINT=hub.url)
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert data["pushed_url"] == f"{hub.url}/me/tiny" and data["folder"] is None
        assert data["architecture"] == "GPT2LMHeadModel" and "model.safetensors" in data["files"]
    assert TOKEN not in r.stdout + r.stderr
    assert not (Path(record.workdir) / ".hub.env").exists()
    assert not (tmp_path / "exports").exists()  # pushed from the host: nothing came here


def test_push_token_from_the_login_file_and_refusals(tmp_path, sshd, client_key, isolated_home):
    _run(tmp_path, sshd, client_key, spec=dataclasses.replace(MODELS["d24"], d_model=64, n_layers=1, n_heads=1,
                                                              d_ff=64, vocab_size=257))
    r = _gpucli(isolated_home, "export", "exprun", "--push", "me/tiny")
    assert r.returncode != 0 and "no Hugging Face token" in r.stderr and "Traceback" not in r.stderr
    (isolated_home / "hf").mkdir()
    (isolated_home / "hf" / "token").write_text(TOKEN + "\n")
    with HubEmulator(TOKEN) as hub:
        r = _gpucli(isolated_home, "export", "exprun", "--push", "me/tiny", HF_ENDPOINT=hub.url)
        assert hub.repos == {}
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "model.logit_softcap=15" in r.stderr.strip().splitlines()[-1]  # one line, after the progress notes
    r = _gpucli(isolated_home, "export", "exprun", "--push", "not-a-repo")
    assert r.returncode != 0 and "ORG/NAME" in r.stderr


def test_serve_on_pod_answers_the_openai_client_through_the_tunnel(tmp_path, sshd, client_key, isolated_home):
    import signal

    import openai

    from tests.support.sshd import free_port

    record = _run(tmp_path, sshd, client_key)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    env.update(PYTHONPATH=str(REPO), GPUCLI_HOME=str(isolated_home))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "serve", "exprun", "--on-pod", "--port",
                             str(port)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1", proc.stderr.read() if proc.poll() is not None else url
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["exprun"]
        r = client.completions.create(model="exprun", prompt="def ", max_tokens=8, temperature=0)
        assert r.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)  # a deadline: a loaded machine can take long to end a server
    log = (Path(record.workdir) / "serve.log").read_text()
    assert "serving exprun" in log
    with pytest.raises(openai.APIConnectionError):  # the tunnel is gone
        openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=5).models.list()
    assert not _serving_processes(record.workdir)  # and the server on the host was stopped
    r = _gpucli(isolated_home, "serve", "exprun", "--on-pod", "--engine", "vllm")
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode != 0:
        assert r.returncode != 0 and "vLLM is not installed on the run's host" in r.stderr
        assert "Traceback" not in r.stderr
