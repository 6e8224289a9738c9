"""``--store`` and the user config's ``store`` through the command line: kept as one spelling, quoted by the
dry run, refused in one line when it is not a store."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import cli


def test_a_store_in_the_config_reaches_the_launch_and_its_quote(capsys, monkeypatch):
    assert cli(capsys, "config", "set", "store", "s3://my-bucket/runs/")[0] == 0
    code, out, _ = cli(capsys, "config", "get", "store")
    assert out.strip() == "s3://my-bucket/runs"
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "h100", "--model", "124m", "--dry-run")
    assert code == 0, err
    assert "store: " in out and "transfer not billed by the provider" in out and "(s3://my-bucket/runs)" in out
    # the command line wins over the config
    code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "h100", "--model", "124m", "--dry-run",
                         "--store", "hf://datasets/me/ckpts")
    assert code == 0, err
    assert "(hf://datasets/me/ckpts)" in out and "$0/GB-month" in out and "not known yet" in out
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "h100", "--model", "124m", "--dry-run",
                         "--json")
    assert code == 0 and json.loads(out)  # the JSON plan still parses


@pytest.mark.parametrize("args", [
    ["launch", "--provider", "local", "--profile", "cpu", "--store", "gs://bucket/x", "--dry-run"],
    ["launch", "--provider", "local", "--profile", "cpu", "--store", "s3://Bad_Bucket", "--dry-run"],
    ["config", "set", "store", "hf://only-owner"],
])
def test_a_bad_store_is_one_line(capsys, args):
    code, out, err = cli(capsys, *args)
    assert code != 0 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "store" in lines[0]


def test_fetch_best_of_a_run_without_a_store_says_so(capsys, tmp_path):
    from gpucli.errors import NotFoundError
    from gpucli.run.files import store
    from gpucli.runs.records import RunRecord

    record = RunRecord(name="r", provider="local", created_at="2026-11-28T00:00:00Z", profile="cpu", phase="fast",
                       model="tiny", n_gpus=1, gpu=None, workdir=str(tmp_path), launch={"request": {}})
    assert store.run_store(record) is None
    with pytest.raises(NotFoundError, match="has no checkpoint store"):
        store.fetch_best(record, tmp_path / "d")


def test_plan_quotes_the_store(capsys):
    code, out, err = cli(capsys, "plan", "--model", "124m", "--store", "s3://my-bucket/runs", "--no-chart")
    assert code == 0, err
    assert "store s3://my-bucket/runs:" in out and "$0.023/GB-month" in out and "inet_up_cost" in out
    code, out, err = cli(capsys, "plan", "--model", "124m", "--store", "gs://x")
    assert code != 0 and "store" in err and "Traceback" not in err and not out.strip()


def test_a_resume_whose_store_refuses_falls_back_to_the_mirror(tmp_path, monkeypatch):
    from gpucli.run.files import store
    from gpucli.runs.records import RunRecord
    from tests.support.s3server import RefusingBucket

    record = RunRecord(name="r", provider="vast", created_at="2026-11-28T00:00:00Z", profile="rtx4090", phase="fast",
                       model="tiny", n_gpus=1, gpu=None, workdir="w", launch={"request": {"store": "s3://runs/x"}})
    said: list[str] = []
    with RefusingBucket() as bucket:
        monkeypatch.setenv("AWS_ENDPOINT_URL", bucket.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-example")
        assert store.pull_newest(record, said.append) is None
    assert len(said) == 1 and "AccessDenied" in said[0] and "mirror" in said[0]
