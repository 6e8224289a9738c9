"""Nothing from a pod becomes a local path unchecked, and only a complete checkpoint counts.

The pod is a real OpenSSH sshd on this machine serving a run folder crafted by a hostile job: file
names in meta.json that climb out (``../``), absolute ones, escape sequences in folder names, FIFOs
and links where files should be, empty and partial manifests, huge and deeply nested JSON, steps that
are strings, infinities or 5,000 digits. fetch-best and the mirror bring home only complete, hashed
checkpoints, write nothing outside their destination, never hang, and say what is wrong in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpucli.errors import TransferError
from gpucli.run.host.untrusted import UnsafeRemoteName, checkpoint_manifest, local_path
from gpucli.runs import records as runs
from gpucli.ssh import SshTarget
from tests.support.cli import cli


def good_checkpoint(root: Path, step: int, val: float, name: str | None = None) -> Path:
    d = root / (name or f"step_{step:06d}")
    d.mkdir(parents=True)
    weights = f"weights of step {step}".encode() * 100
    (d / "model.pt").write_bytes(weights)
    sha = hashlib.sha256(weights).hexdigest()
    (d / "meta.json").write_text(json.dumps({"step": step, "val_loss": val, "files": {"model.pt": sha}}))
    return d


def hostile(root: Path, step: int, meta: object, *, raw: bytes | None = None, name: str | None = None) -> Path:
    d = root / (name or f"step_{step:06d}")
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"x")
    (d / "meta.json").write_bytes(raw if raw is not None else json.dumps(meta).encode())
    return d


@pytest.fixture
def pod(sshd, client_key, tmp_path):
    """A run of provider ssh whose folder is served by the real sshd."""
    workdir = tmp_path / "pod"
    (workdir / "checkpoints").mkdir(parents=True)
    record = runs.RunRecord(name="victim", provider="ssh", created_at="2026-11-24T00:00:00+00:00", profile="cpu",
                            phase="fast", model="tiny", n_gpus=1, gpu=None, workdir=str(workdir), status="running",
                            ssh=SshTarget(host=sshd.host, port=sshd.port, user=sshd.user,
                                          identity_file=str(client_key[0])))
    runs.save(record)
    return workdir / "checkpoints"


def fetch(capsys, dest: Path) -> tuple[int, str, str]:
    return cli(capsys, "fetch-best", "victim", "--dest", str(dest), "--json")


SHA = "ab" * 32
BAD_MANIFESTS = {
    "climbs-out": {"step": 9, "val_loss": 0.1, "files": {"model.pt": SHA, "../../../outside.txt": SHA}},
    "absolute": {"step": 9, "val_loss": 0.1, "files": {"model.pt": SHA, "/tmp/outside.txt": SHA}},
    "empty": {"step": 9, "val_loss": 0.1, "files": {}},
    "partial": {"step": 9, "val_loss": 0.1, "files": {"optim_rank0.pt": SHA}},
    "not-a-digest": {"step": 9, "val_loss": 0.1, "files": {"model.pt": "nope"}},
    "list-for-object": {"step": 9, "val_loss": 0.1, "files": [["model.pt", SHA]]},
    "step-string": {"step": "nine", "val_loss": 0.1, "files": {"model.pt": SHA}},
    "step-inf": {"step": float("inf"), "val_loss": 0.1, "files": {"model.pt": SHA}},
    "step-5000-digits": b'{"step": ' + b"9" * 5000 + b', "val_loss": 0.1, "files": {"model.pt": "' + SHA.encode() + b'"}}',
    "step-huge-float": b'{"step": 1e308, "val_loss": 0.1, "files": {"model.pt": "' + SHA.encode() + b'"}}',
    "a-list": [1, 2, 3],
    "escape-in-name": {"step": 9, "val_loss": 0.1, "files": {"model.pt": SHA, "\x1b]52;c;cHduZWQ=\x07": SHA}},
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_a_hostile_manifest_is_not_a_checkpoint_and_the_good_one_comes_home(case, pod, capsys, tmp_path):
    good_checkpoint(pod, 5, 0.5)
    bad = BAD_MANIFESTS[case]
    hostile(pod, 9, bad, raw=bad if isinstance(bad, bytes) else None)  # newer and "better": chosen if it were believed
    dest = tmp_path / "home"
    code, out, err = fetch(capsys, dest)
    assert code == 0, err
    got = json.loads(out)
    assert got["step"] == 5, got
    assert sorted(p.name for p in dest.iterdir()) == ["victim-step_000005"]
    assert not (tmp_path / "outside.txt").exists() and not Path("/tmp/outside.txt").exists()


@pytest.mark.parametrize("case", ["huge", "deep", "not-utf8", "truncated"])
def test_malformed_meta_json_is_skipped_in_bounded_time_and_memory(case, pod, capsys, tmp_path):
    good_checkpoint(pod, 5, 0.5)
    raw = {"huge": b'{"step": 9, "pad": "' + b"a" * (6 << 20) + b'"}', "deep": b"[" * 100_000 + b"]" * 100_000,
           "not-utf8": b'{"step": 9, "\xff\xfe": 1}', "truncated": b'{"step": 9, "files": {"model.pt": "'}[case]
    hostile(pod, 9, None, raw=raw)
    code, out, err = fetch(capsys, tmp_path / "home")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["victim-step_000005"]


def test_only_hostile_checkpoints_is_one_line(pod, capsys, tmp_path):
    hostile(pod, 9, BAD_MANIFESTS["climbs-out"])
    hostile(pod, 10, BAD_MANIFESTS["empty"])
    code, out, err = fetch(capsys, tmp_path / "home")
    assert code != 0
    assert "no checkpoint" in err and "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").iterdir())


def test_a_fifo_or_a_link_where_the_weights_should_be_never_hangs_nor_escapes(pod, capsys, tmp_path):
    good_checkpoint(pod, 5, 0.5)
    d = good_checkpoint(pod, 9, 0.1)
    (d / "model.pt").unlink()
    os.mkfifo(d / "model.pt")  # a read would block forever
    d2 = good_checkpoint(pod, 12, 0.05)
    (d2 / "model.pt").unlink()
    secret = tmp_path / "secret"
    secret.write_text("laptop secret")
    (d2 / "model.pt").symlink_to(secret)
    code, out, err = fetch(capsys, tmp_path / "home")
    assert code != 0, out
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "not a regular file on the pod" in lines[0], err
    assert not any((tmp_path / "home").glob("*/model.pt"))


def test_a_link_in_the_local_destination_is_not_written_through(pod, capsys, tmp_path):
    good_checkpoint(pod, 5, 0.5)
    dest = tmp_path / "home"
    dest.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (dest / "victim-step_000005").symlink_to(elsewhere)
    code, out, err = fetch(capsys, dest)
    assert code != 0 and "symlink" in err and "Traceback" not in err
    assert list(elsewhere.iterdir()) == []


def test_a_folder_name_with_escape_sequences_is_ignored(pod, capsys, tmp_path):
    good_checkpoint(pod, 5, 0.5)
    good_checkpoint(pod, 9, 0.1, name="step_9\x1b[2J\x1b]0;owned\x07")
    code, out, err = fetch(capsys, tmp_path / "home")
    assert code == 0, err
    assert "\x1b" not in out + err
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["victim-step_000005"]


def test_an_empty_manifest_never_replaces_a_good_mirror(pod, tmp_path):
    from gpucli.providers.registry import open_host
    from gpucli.run.files.harvest import mirror_root, newest_good
    from gpucli.run.starting.jobs import mirror_once

    good_checkpoint(pod, 5, 0.5)
    record = runs.load("victim")
    with open_host(record) as host:
        assert mirror_once(host, record).checkpoint == "step_000005"
        hostile(pod, 9, BAD_MANIFESTS["empty"])
        hostile(pod, 10, BAD_MANIFESTS["partial"])
        assert mirror_once(host, record).checkpoint is None
    assert newest_good("victim") == mirror_root("victim") / "checkpoints" / "step_000005"
    # A local copy whose meta.json was emptied afterwards is not a checkpoint to resume from.
    (mirror_root("victim") / "checkpoints" / "step_000005" / "meta.json").write_text('{"step": 5, "files": {}}')
    assert newest_good("victim") is None


def test_own_code_names_from_the_pod_stay_inside(tmp_path):
    from gpucli.providers.local.target import LocalHost
    from gpucli.run.files.harvest import download_files

    root = tmp_path / "pod"
    root.mkdir()
    (root / "ok.pt").write_bytes(b"ok")
    digest = hashlib.sha256(b"ok").hexdigest()
    for bad in ("../escaped.pt", "/tmp/escaped.pt", "a/../../escaped.pt", "ok\x1b[2J.pt", ""):
        with pytest.raises(UnsafeRemoteName) as exc:
            download_files(LocalHost(), str(root), {"ok.pt": digest, bad: digest}, tmp_path / "home" / "ck")
        assert "\x1b" not in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "escaped.pt").exists() and not (tmp_path / "home" / "ck").exists()
    assert isinstance(exc.value, TransferError)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab./\\\x00\x1b:C~ ")), max_size=24))
def test_local_path_never_leaves_its_root(tmp_path_factory, name):
    root = tmp_path_factory.mktemp("root")
    (root / "a").mkdir(exist_ok=True)
    if not (root / "b").exists():
        (root / "b").symlink_to(root.parent)
    try:
        p = local_path(root, name)
    except UnsafeRemoteName:
        return
    real = Path(os.path.realpath(p))
    assert real.is_relative_to(root.resolve()) and real != root.resolve()


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                    max_leaves=20))
def test_any_json_is_a_manifest_or_none(meta):
    files = checkpoint_manifest(meta)
    assert files is None or ("model.pt" in files and all(len(v) == 64 for v in files.values()))
