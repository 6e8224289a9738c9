"""A pod whose image lacks the trainer's packages gets the pinned environment; the next run on the same
volume reuses it.

The pod (the RunPod emulator's: a real sshd on this machine) starts from an image-like Python named with
--python (this machine's login shell puts its own python3 first on every session's PATH): a bare venv, no
torch, numpy or tokenizers in it. The launch must bring the environment pinned in
trainer/requirements.txt, built by the same setup_pod.sh and envbuild.py a real pod runs, from this
machine's package index and wheels (GPUCLI_TORCH_INDEX=none: the installer's own configured sources,
with pip), into a venv beside the run folders; the trainer then trains in it. A second run whose folder
is on the same disk finds that venv and builds nothing. Both times are printed (pytest -s) for the notes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from gpucli.runs import records as runs
from gpucli.runs import trainerenv
from tests.e2e.cloud.test_cloud_launch import TINY, assert_nothing_running
from tests.support.cli import cli, rows_of, wait_for


def test_a_bare_image_gets_the_pinned_environment_and_the_volume_keeps_it(runpod_emulator, capsys, tmp_path,
                                                                          monkeypatch):
    emu = runpod_emulator
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image)], check=True, timeout=120)
    monkeypatch.setenv("GPUCLI_TORCH_INDEX", "none")  # this machine's wheel folder and local index
    monkeypatch.setenv("GPUCLI_ENV_INSTALLER", "pip")
    volume = tmp_path / "volume" / "gpucli-runs"
    venv = volume / ".gpucli-envs" / f"trainer-{_hash()}-cpu"  # no nvidia-smi here: the CPU build

    seconds = {}
    for name in ("env-cold", "env-warm"):
        t0 = time.monotonic()
        code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "rtx4090", "--phase", "fast",
                             "--name", name, "--python", str(image / "bin" / "python3"), "--workdir", str(volume / name),
                             "--ready-timeout", "20", *TINY)
        seconds[name] = time.monotonic() - t0
        assert code == 0, err
        record = runs.load(name)
        # the trainer, and everything gpucli later starts with the record's Python, use the venv
        assert record.python == str(venv / "bin" / "python"), record.python
        assert record.env_build_s is not None
        said = "built a venv on the volume" if name == "env-cold" else "reused the venv on the volume"
        assert said in out + err, out + err
        assert (Path(record.workdir) / "code" / "trainer").is_dir()
        rows = wait_for(lambda n=name: (lambda r: r if sum(x.get("kind") == "train" for x in r) >= 2 else None)(
            rows_of(capsys, n)), 180, f"{name} training steps")
        assert rows[0]["event"] == "started"
        code, out, err = cli(capsys, "down", name)
        assert code == 0, err
    # the image itself was never changed: still no torch in it
    assert subprocess.run([str(image / "bin" / "python"), "-c", "import torch"], capture_output=True).returncode != 0
    versions = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import torch, numpy, tokenizers; print(torch.__version__, numpy.__version__, "
                               "tokenizers.__version__)"], capture_output=True, text=True, timeout=300).stdout.split()
    pins = trainerenv.pins().versions
    assert [v.split("+")[0] for v in versions] == [pins["torch"], pins["numpy"], pins["tokenizers"]]
    cold, warm = runs.load("env-cold").env_build_s, runs.load("env-warm").env_build_s
    assert warm is not None and cold is not None and warm < cold
    print(f"\npinned environment: cold build {cold:.1f} s (launch {seconds['env-cold']:.0f} s), "
          f"warm volume {warm:.1f} s (launch {seconds['env-warm']:.0f} s)")
    assert_nothing_running(emu)


def _hash() -> str:
    import hashlib

    return hashlib.sha256(trainerenv.pin_path().read_bytes()).hexdigest()[:16]
