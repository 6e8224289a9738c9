"""``launch --data`` end to end: ``pod:`` data on the ssh provider (a real sshd) and on a RunPod
emulator pod, a RunPod network volume whose prepared data a second run reuses, and hf:// refused with
a clear message where huggingface_hub is missing.

The trainer is the real one (torch on CPU), started detached after the pod's data step
(gpucli/pod/fetch.py), exactly as on a pod; only its size is small.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpucli.runs import records as runs
from tests.support.cli import FAST_TRAINER, cli, rows_of, wait_for

TINY_GPU = ["--model", "tiny", "--set", "hardware.device=cpu", "--set", "hardware.compile=false",
            "--set", "hardware.mixed_precision=false", "--set", "training.grad_accum_steps=1", *FAST_TRAINER]
SMALL_PREP = ["--set", "data.shard_tokens=65536", "--set", "data.min_val_tokens=2000", "--set", "data.workers=1"]


def corpus(folder: Path, files: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (folder / f"part-{i}.txt").write_text("".join(f"line {j} of part {i}: the pod already holds this text.\n"
                                                      for j in range(1500)))
    return folder


def trained(capsys, name: str) -> list[dict]:
    def some_steps():
        rows = rows_of(capsys, name)
        return rows if sum(r.get("kind") == "train" for r in rows) >= 2 else None

    return wait_for(some_steps, 240, f"training steps of {name}")


def down(capsys, name: str) -> None:
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err


def prepared_meta(workdir: Path) -> dict:
    return json.loads((workdir / "data" / "prepared" / "meta.json").read_text())


def test_pod_data_on_the_ssh_provider(capsys, tmp_path, sshd, client_key):
    data = corpus(tmp_path / "on-the-host" / "corpus")
    workdir = tmp_path / "host" / "run"
    host = ["--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
            "--python", sys.executable]
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "podssh", "--data", f"pod:{data}",
                         "--workdir", str(workdir), *host, *FAST_TRAINER, *SMALL_PREP)
    assert code == 0, err
    assert "nothing to upload" in err
    trained(capsys, "podssh")
    down(capsys, "podssh")
    assert not (workdir / "data" / "src").exists()  # nothing was uploaded
    meta = prepared_meta(workdir)
    assert meta["train_tokens"] + meta["val_tokens"] > 200_000
    assert all(str(data) in s["name"] for s in meta["sources"])  # prepared from the host's own folder
    phases = {json.loads(line).get("phase") for line in (workdir / "prepare.jsonl").read_text().splitlines()}
    assert phases  # the data step's progress is in the run folder (status, tail and the watchdog read it)

    # A path that is not there stops the launch before the trainer starts, in one line.
    code, _, err = cli(capsys, "launch", "--profile", "cpu", "--name", "podmissing", "--data",
                       f"pod:{tmp_path / 'nothing-here'}", "--workdir", str(tmp_path / "host" / "missing"), *host,
                       *FAST_TRAINER)
    assert code != 0 and "does not exist on the pod" in err and "Traceback" not in err
    assert runs.load("podmissing").status == "failed"


def test_pod_data_on_an_emulator_pod(capsys, tmp_path, runpod_emulator):
    data = corpus(tmp_path / "pod-disk" / "corpus")
    workdir = tmp_path / "pod" / "rp"
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--name", "podrp",
                         "--data", f"pod:{data}", "--workdir", str(workdir), "--python", sys.executable,
                         "--ready-timeout", "20", *TINY_GPU, *SMALL_PREP)
    assert code == 0, err
    trained(capsys, "podrp")
    down(capsys, "podrp")
    assert not (workdir / "data" / "src").exists()
    assert all(str(data) in s["name"] for s in prepared_meta(workdir)["sources"])
    assert runpod_emulator.ledger.alive() == set()  # down terminated the pod


def test_a_network_volume_keeps_prepared_data_and_checkpoints_for_the_next_run(capsys, tmp_path, runpod_emulator,
                                                                              monkeypatch):
    emu = runpod_emulator
    volume_id = emu.create_volume("corpus", "EU-RO-1")
    store = emu.volume_dir(volume_id)
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(store))  # what a pod created with the volume sees at /workspace
    data = corpus(tmp_path / "laptop" / "corpus")
    common = ["--provider", "runpod", "--profile", "rtx4090", "--volume", "corpus", "--data", str(data),
              "--python", sys.executable, "--ready-timeout", "20", *TINY_GPU, *SMALL_PREP]

    code, _, err = cli(capsys, "launch", "--name", "vol1", *common)
    assert code == 0, err
    first = Path(runs.load("vol1").workdir)
    assert first == store / "gpucli-runs" / "vol1"  # the run folder (checkpoints included) is on the volume
    trained(capsys, "vol1")
    down(capsys, "vol1")
    assert any((first / "checkpoints").iterdir())
    cache = (first / "data" / "prepared").resolve()
    assert cache.parent == store / "gpucli-data" and (cache / "meta.json").exists()
    stamp = (cache / "meta.json").stat().st_mtime_ns

    code, _, err = cli(capsys, "launch", "--name", "vol2", *common)
    assert code == 0, err
    second = Path(runs.load("vol2").workdir)
    trained(capsys, "vol2")
    down(capsys, "vol2")
    # The second run prepared nothing: same inputs and tokenizer, the same prepared folder on the volume.
    assert (second / "data" / "prepared").resolve() == cache
    assert (cache / "meta.json").stat().st_mtime_ns == stamp
    assert "reusing prepared data" in (second / "console.log").read_text()
    # Both pods were created with the volume, in its data centre.
    creates = [b for op, b in emu.calls if op == "createPod"]
    assert len(creates) == 2
    assert all(c["mounts"]["network"] == [{"volumeId": volume_id, "path": "/workspace"}]
               and c["dataCenterIds"] == ["EU-RO-1"] for c in creates)
    assert set(emu.pod_volumes().values()) == {volume_id}
    assert emu.ledger.alive() == set()


def test_volume_mistakes_are_one_line(capsys, runpod_emulator):
    code, _, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--volume", "nope",
                       "--name", "novol", *TINY_GPU)
    assert code != 0 and "no RunPod network volume of that name or id" in err and "Traceback" not in err
    assert runpod_emulator.ledger.created() == []  # looked up before anything was created
    code, _, err = cli(capsys, "launch", "--provider", "vast", "--profile", "rtx4090", "--volume", "x", "--dry-run")
    assert code != 0 and "vast has no network volumes" in err and "mirrored" in err


def test_hf_data_is_refused_where_huggingface_hub_is_missing(capsys, tmp_path, monkeypatch):
    # A Python whose huggingface_hub cannot be imported (the trainer's own packages are there) stands
    # for a pod whose image lacks it.
    shadow = tmp_path / "shadow" / "huggingface_hub"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('huggingface_hub is not installed here')\n")
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nPYTHONPATH={shadow.parent} exec {sys.executable} \"$@\"\n")
    bare.chmod(0o755)
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_never_on_a_command_line")
    code, _, err = cli(capsys, "launch", "--profile", "cpu", "--name", "hfmissing", "--provider", "local",
                       "--python", str(bare), "--data", "hf://datasets/allenai/dolmino-mix-1124/data/math/*",
                       "--workdir", str(tmp_path / "run"), *FAST_TRAINER)
    assert code != 0 and "Traceback" not in err
    assert "hf:// data needs the huggingface_hub package on the pod" in err
    record = runs.load("hfmissing")
    assert record.status == "failed" and "SECRET" not in (runs.runs_dir() / "hfmissing.json").read_text()


def test_hf_token_reaches_the_pod_only_through_the_env_file(capsys, tmp_path, monkeypatch):
    """With huggingface_hub there, the launch goes on: HF_TOKEN is in the 0600 env file and nowhere
    else; the hub cannot be reached here, so the data step fails in one line and training never starts."""
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_never_on_a_command_line")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the download fails at once
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    workdir = tmp_path / "run"
    code, _, err = cli(capsys, "launch", "--profile", "cpu", "--name", "hfrun", "--provider", "local",
                       "--python", sys.executable, "--data", "hf://datasets/org/name/*.jsonl",
                       "--workdir", str(workdir), *FAST_TRAINER)
    assert code == 0, err
    env = workdir / "env"
    assert "hf_SECRET" in env.read_text() and env.stat().st_mode & 0o777 == 0o600
    for text in ((workdir / "datasource.json").read_text(), (runs.runs_dir() / "hfrun.json").read_text()):
        assert "SECRET" not in text  # the record carries the command line: no token there either
    log = wait_for(lambda: (workdir / "console.log").exists() and "fetch: error: hf://datasets/org/name"
                   in (workdir / "console.log").read_text() and (workdir / "console.log").read_text(), 120,
                   "the data step's error")
    assert "Traceback" not in log
    assert not (workdir / "metrics.jsonl").exists()  # the trainer never started
    phases = [json.loads(x) for x in (workdir / "prepare.jsonl").read_text().splitlines()]
    assert phases[-1]["phase"] == "failed"
    assert cli(capsys, "down", "hfrun")[0] == 0  # its watchdog goes too: nothing of this test outlives it
