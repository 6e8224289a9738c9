"""The published JSON Schemas of task.yaml and run.yaml: equal to what the dataclasses generate, and
agreeing with the loaders on real files (the trainer's configs, a launch's run.yaml, task files)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from gpucli.errors import UsageError
from gpucli.runs import schemas
from gpucli.runs.task import parse_task
from tests.support.cli import cli

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("kind", ["task", "run"])
def test_published_schema_matches_the_dataclasses(capsys, kind):
    published = (schemas.PUBLISHED / f"{kind}.schema.json").read_text()
    assert published == schemas.render(kind), f"regenerate: gpucli schema {kind} > gpucli/schemas/{kind}.schema.json"
    code, out, err = cli(capsys, "schema", kind)
    assert code == 0 and out == published
    jsonschema.Draft202012Validator.check_schema(json.loads(published))


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((schemas.PUBLISHED / f"{kind}.schema.json").read_text()))


GOOD_TASKS = [
    {"run": "python train.py"},
    {"run": "torchrun train.py", "code": ".", "setup": "pip install -r r.txt", "checkpoints": "out/", "data": "./c",
     "profile": "h100", "provider": "runpod", "name": "big", "metrics_regex": r"it (?P<step>\d+) l=(?P<loss>[\d.]+)",
     "spot": False, "grace": 60, "limits": {"budget": 40, "hours": 6, "stall_minutes": 30},
     "env": {"WANDB_MODE": "offline", "N": 3}, "env_from_local": ["WANDB_API_KEY", "HF_TOKEN"]},
]
BAD_TASKS = [{}, {"run": "x", "providr": "runpod"}, {"run": "x", "provider": "aws"}, {"run": "x", "grace": -1},
             {"run": "x", "limits": {"budgt": 3}}, {"run": "x", "env_from_local": ["1BAD"]},
             {"run": "x", "env": {"GPUCLI_X": "1"}}, {"run": "x", "spot": "yes"}]


@pytest.mark.parametrize("data", GOOD_TASKS)
def test_task_files_the_loader_takes_validate(data, tmp_path):
    parse_task(data, base=tmp_path)
    _validator("task").validate(data)


@pytest.mark.parametrize("data", BAD_TASKS)
def test_task_files_the_loader_refuses_do_not(data, tmp_path):
    with pytest.raises(UsageError):
        parse_task(data, base=tmp_path)
    assert not _validator("task").is_valid(data)


def test_run_yaml_files_validate(capsys):
    v = _validator("run")
    for path in sorted((REPO / "trainer" / "configs").glob("*.yaml")):
        v.validate(yaml.safe_load(path.read_text()) or {})
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--tracker", "trackio", "--dry-run", "--json")
    assert code == 0, err
    v.validate(json.loads(out)["run_yaml"])
    assert not v.is_valid({"training": {"batch_sise": 4}})
    assert not v.is_valid({"tracking": {"backend": 3}})
