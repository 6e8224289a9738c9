"""A launch whose disk cannot hold the run's checkpoints stops before renting: against the RunPod
emulator, the launch ends with one line naming the numbers and the fix, and no pod was ever created."""

from __future__ import annotations

import sys

from tests.support.cli import cli


def _launch(capsys, tmp_path, name: str, *extra: str) -> tuple[int, str, str]:
    return cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--model", "124m", "--name", name,
               "--workdir", str(tmp_path / "pod" / name), "--python", sys.executable, "--ready-timeout", "20", *extra)


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("Error:")]


def test_a_disk_too_small_is_refused_before_any_pod(runpod_emulator, capsys, tmp_path):
    code, _, err = _launch(capsys, tmp_path, "smalldisk", "--disk", "5")
    assert code == 2 and "Traceback" not in err
    (line,) = _errors(err)
    # 124m on the demo corpus: the byte tokenizer sizes its embedding and head to 320 entries in the
    # trainer (86M parameters), and the launch plans that model: 1.4 GB a checkpoint (the weights twice:
    # model.pt for resume and model.safetensors beside it for other tools).
    assert "--disk 5 GB cannot hold this run: 5 checkpoints of 1.4 GB" in line and "pass --disk 9" in line
    assert runpod_emulator.ledger.created() == [] and runpod_emulator.ledger.alive() == set()


def test_a_network_volume_too_small_is_refused_once_looked_up(runpod_emulator, capsys, tmp_path, monkeypatch):
    volume_id = runpod_emulator.create_volume("tiny-vol", "EU-RO-1", size_gb=4)
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(runpod_emulator.volume_dir(volume_id)))
    code, out, err = cli(capsys, "launch", "--dry-run", "--provider", "runpod", "--profile", "rtx4090",
                         "--model", "124m", "--volume", "tiny-vol")
    assert code == 0 and "network volume tiny-vol: its size is checked at launch" in out  # dry runs look nothing up
    code, _, err = _launch(capsys, tmp_path, "smallvol", "--volume", "tiny-vol")
    assert code == 2 and "Traceback" not in err
    (line,) = _errors(err)
    assert "network volume tiny-vol (4 GB) cannot hold this run" in line
    assert "use a network volume of at least 9 GB" in line  # 1.4 GB checkpoints (model.pt + model.safetensors)
    assert runpod_emulator.ledger.created() == [] and runpod_emulator.ledger.alive() == set()
