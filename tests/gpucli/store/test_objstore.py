"""The store's client on its own: URLs, manifests and what counts as whole, and the pod's uploader finding
your own code's checkpoints exactly as fetch-best finds them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucli.errors import UsageError
from gpucli.run.files.checkpoints import group_checkpoints
from gpucli.runs.storeurl import store_url
from gpucli.store import objstore, storesync


@pytest.mark.parametrize("text, scheme, bucket, prefix, kind", [
    ("s3://runs", "s3", "runs", "", "model"),
    ("s3://my.bucket-1/team/a/", "s3", "my.bucket-1", "team/a", "model"),
    ("hf://me/ckpts", "hf", "me/ckpts", "", "model"),
    ("hf://datasets/me/ckpts/runs", "hf", "me/ckpts", "runs", "dataset"),
])
def test_urls(text, scheme, bucket, prefix, kind):
    u = objstore.parse_url(text)
    assert (u.scheme, u.bucket, u.prefix, u.repo_type) == (scheme, bucket, prefix, kind)
    assert objstore.parse_url(str(u)) == u


@pytest.mark.parametrize("text", ["s3://", "s3://A_B", "gs://b/x", "hf://me", "s3://runs/../x", "runs", "hf://me/x/a b"])
def test_bad_urls_are_one_line(text):
    with pytest.raises(UsageError) as exc:
        store_url(text)
    assert "\n" not in exc.value.message


def test_a_manifest_that_lies_about_its_files_is_not_whole():
    good = {"format": 1, "name": "step_000010", "kind": "regular", "step": 10, "loss": 2.0, "val_loss": None,
            "files": {"model.pt": {"sha256": "a" * 64, "bytes": 5}}}
    assert objstore.parse_manifest(json.dumps(good).encode(), "p/step_000010") is not None
    for bad in ({**good, "format": 2}, {**good, "files": {"../x": {"sha256": "a" * 64, "bytes": 5}}},
                {**good, "files": {"model.pt": {"sha256": "nothex", "bytes": 5}}}, {**good, "name": "../x"}):
        assert objstore.parse_manifest(json.dumps(bad).encode(), "p") is None
    assert objstore.parse_manifest(b"{not json", "p") is None


LISTINGS = [
    ["checkpoint-500/model.safetensors", "checkpoint-500/config.json", "checkpoint-1000/model.safetensors",
     "runs/events.out.tfevents.1", "checkpoint-1500.tmp/x"],
    ["model_000500.pt", "meta_000500.json", "optim_000500_rank0.pt", "optim_000500_rank1.pt", "model_001000.pt"],
    ["lightning_logs/version_0/checkpoints/epoch=0-step=200.ckpt", "lightning_logs/version_0/hparams.yaml",
     "lightning_logs/version_0/metrics.csv"],
    ["ckpt.pt", ".hidden_step_5/x", "step_5.pt.partial"],
]

part = st.sampled_from(["checkpoint-500", "step_10", "model_000500.pt", "epoch=1-step=20.ckpt", "x", "v2", "ckpt.pt",
                        "optim_000500_rank1.pt", ".tmp_step_3", "events.out.tfevents.9", "run_1", "iter_40"])


@given(st.lists(st.lists(part, min_size=1, max_size=3).map("/".join), max_size=8, unique=True))
def test_the_uploader_groups_checkpoints_as_fetch_best_does(rels):
    rels = [r for r in rels if not any(r.startswith(o + "/") for o in rels)]  # a path is a file or a folder
    stepped, _ = group_checkpoints({r: (1, 0.0) for r in rels})
    ours = storesync.group_own(rels)
    assert sorted((c.step, tuple(sorted(c.files))) for c in stepped) == \
        sorted((step, tuple(sorted(files))) for (_, step), files in ours.items())


@pytest.mark.parametrize("rels", LISTINGS)
def test_the_uploader_groups_known_layouts_as_fetch_best_does(rels):
    stepped, _ = group_checkpoints({r: (1, 0.0) for r in rels})
    ours = storesync.group_own(rels)
    assert sorted((c.step, tuple(sorted(c.files))) for c in stepped) == \
        sorted((step, tuple(sorted(files))) for (_, step), files in ours.items())
