"""fetch-best on a live run: the trainer may delete the checkpoint being fetched (a better one came
and only the newest and the best are kept). fetch-best chooses again instead of failing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from gpucli.errors import TransferError
from gpucli.providers.local.target import LocalHost
from gpucli.run.starting.jobs import fetch_best
from gpucli.runs.records import RunRecord


def _checkpoint(root: Path, step: int, val: float) -> None:
    d = root / f"step_{step:06d}"
    d.mkdir(parents=True)
    weights = f"weights of step {step}".encode() * 1000
    (d / "model.pt").write_bytes(weights)
    sha = hashlib.sha256(weights).hexdigest()
    (d / "meta.json").write_text(json.dumps({"step": step, "val_loss": val, "kind": "regular",
                                             "sha256": sha, "files": {"model.pt": sha}}))


class _PruningHost(LocalHost):
    """This machine, with a trainer that writes a better checkpoint and prunes the one being
    fetched just as its download starts, ``times`` times."""

    def __init__(self, root: Path, times: int) -> None:
        self.root, self.times, self.step = root, times, 20

    def download(self, remote_path, local_path, **kw):
        if self.times and remote_path.endswith("/model.pt"):
            self.times -= 1
            _checkpoint(self.root, self.step, 3.0 - self.step / 100)
            shutil.rmtree(Path(remote_path).parent)
            self.step += 10
        return super().download(remote_path, local_path, **kw)


def _record(workdir: Path) -> RunRecord:
    return RunRecord(name="live", provider="local", created_at="2026-11-23T00:00:00Z", profile="cpu",
                     phase="fast", model="tiny", n_gpus=1, gpu=None, workdir=str(workdir))


def test_fetch_best_chooses_again_when_the_trainer_prunes_its_choice(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    _checkpoint(root, 10, 2.95)
    _checkpoint(root, 5, 3.10)
    events: list[str] = []
    got = fetch_best(_PruningHost(root, times=1), _record(tmp_path / "run"), tmp_path / "out",
                     on_event=events.append)
    assert got.checkpoint.name == "step_000020" and got.checkpoint.val_loss == pytest.approx(2.8)
    assert (got.dest / "model.pt").read_bytes() == (root / "step_000020" / "model.pt").read_bytes()
    assert any("deleted by the trainer" in e for e in events), events
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["live-step_000020"]  # no half folder


def test_fetch_best_gives_up_after_a_few_tries(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    _checkpoint(root, 10, 2.95)
    with pytest.raises(TransferError, match="does not exist"):
        fetch_best(_PruningHost(root, times=10), _record(tmp_path / "run"), tmp_path / "out")


def test_mirror_chooses_the_newer_checkpoint_when_the_trainer_rotates_its_choice(tmp_path):
    """The newest checkpoint is rotated away (keep_last) while the mirror copies it: the mirror takes
    the newer one from a fresh listing instead of failing with "no such file"."""
    from gpucli.run.files.harvest import mirror_root, mirror_trainer

    root = tmp_path / "run" / "checkpoints"
    _checkpoint(root, 10, 2.95)
    events: list[str] = []
    record = _record(tmp_path / "run")
    got = mirror_trainer(_PruningHost(root, times=1), record, on_event=events.append)
    assert (got.checkpoint, got.step) == ("step_000020", 20)
    mirrored = mirror_root(record.name) / "checkpoints"
    assert [p.name for p in mirrored.iterdir()] == ["step_000020"]  # no partial folder of the rotated one
    assert (mirrored / "step_000020" / "model.pt").read_bytes() == (root / "step_000020" / "model.pt").read_bytes()
    assert any("deleted by the trainer" in e for e in events), events


class _RotatingHost(LocalHost):
    """This machine, with a job that deletes one file of its --checkpoints folder (and writes a new one)
    just as the mirror starts to copy it, once."""

    def __init__(self, victim: Path) -> None:
        self.victim = victim

    def download(self, remote_path, local_path, **kw):
        if self.victim is not None and Path(remote_path) == self.victim:
            Path(local_path).parent.mkdir(parents=True, exist_ok=True)
            Path(str(local_path) + ".partial").write_bytes(b"half")  # what a cut copy leaves
            self.victim.unlink()
            (self.victim.parent / "ckpt_300.pt").write_bytes(b"newer")
            self.victim = None
            raise TransferError(f"downloading files: no such file: {remote_path}")
        return super().download(remote_path, local_path, **kw)


def test_own_code_mirror_lists_again_when_the_job_rotates_a_file(tmp_path):
    from gpucli.run.files.harvest import mirror_folder, mirror_root

    root = tmp_path / "run" / "ckpts"
    root.mkdir(parents=True)
    for step in (100, 200):
        (root / f"ckpt_{step}.pt").write_bytes(f"step {step}".encode() * 100)
    events: list[str] = []
    record = _record(tmp_path / "run")
    mirror_folder(_RotatingHost(root / "ckpt_100.pt"), record, str(root), on_event=events.append)
    mirrored = mirror_root(record.name) / "own-checkpoints"
    assert sorted(p.name for p in mirrored.iterdir()) == ["ckpt_200.pt", "ckpt_300.pt"]
    assert (mirrored / "ckpt_300.pt").read_bytes() == b"newer"
    assert any("listing again" in e for e in events), events
