from __future__ import annotations

from pathlib import Path

import pytest

from gpucli.errors import NotFoundError, UsageError
from gpucli.runs.task import GitCode, Task, load_task, parse_task, with_overrides


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def test_a_full_task_file(tmp_path):
    task = load_task(write(tmp_path, """
run: torchrun --nproc_per_node=$GPUCLI_GPUS train.py
code: repo
setup: pip install -r requirements.txt
checkpoints: out/
data: corpus
profile: h100
provider: RunPod
name: big
metrics_regex: 'it (?P<step>\\d+) l=(?P<loss>[\\d.]+)'
spot: true
limits: {budget: 40, hours: 6.5, stall_minutes: 20}
env: {WANDB_MODE: offline, SEED: 3}
"""))
    assert task == Task(run="torchrun --nproc_per_node=$GPUCLI_GPUS train.py", code=tmp_path / "repo",
                        setup="pip install -r requirements.txt", checkpoints="out/", data=tmp_path / "corpus",
                        profile="h100", provider="runpod", name="big",
                        metrics_regex="it (?P<step>\\d+) l=(?P<loss>[\\d.]+)", spot=True, budget_usd=40.0,
                        max_hours=6.5, stall_minutes=20.0, env=(("WANDB_MODE", "offline"), ("SEED", "3")),
                        source=tmp_path / "task.yaml")
    assert task.env_dict == {"WANDB_MODE": "offline", "SEED": "3"}


def test_defaults_and_git_code(tmp_path):
    task = load_task(write(tmp_path, "run: python train.py\ncode: git+https://github.com/org/repo@v1.2\n"))
    assert task.code == GitCode("https://github.com/org/repo", "v1.2") and task.spot is False
    assert load_task(write(tmp_path, "run: python train.py\n")).code == tmp_path


@pytest.mark.parametrize("text, message", [
    ("run: x\nrunn: y\n", "task.yaml: runn: unknown key (did you mean 'run'?)"),
    ("setup: x\n", "task.yaml: run: missing"),
    ("run: 3\n", "task.yaml: run: expected a string, got int 3"),
    ("run: '  '\n", "task.yaml: run: must not be empty"),
    ("run: x\nlimits: {budget: .nan}\n", "task.yaml: limits.budget: must be a finite number, got nan"),
    ("run: x\nlimits: {hours: .inf}\n", "task.yaml: limits.hours: must be a finite number, got inf"),
    ("run: x\nlimits: {budget: -5}\n", "task.yaml: limits.budget: must be positive, got -5"),
    ("run: x\nlimits: {hours: 0}\n", "task.yaml: limits.hours: must be positive, got 0"),
    ("run: x\nlimits: {budget: '40'}\n", "task.yaml: limits.budget: expected a number, got str '40'"),
    ("run: x\nlimits: {budjet: 4}\n", "task.yaml: limits.budjet: unknown key (did you mean 'budget'?)"),
    ("run: x\nlimits: 40\n", "task.yaml: limits: expected a mapping"),
    ("run: x\nspot: yes please\n", "task.yaml: spot: expected true or false"),
    ("run: x\nprovider: aws\n", "task.yaml: provider: unknown provider 'aws'"),
    ("run: x\nenv: {1BAD: x}\n", "task.yaml: env.1BAD: not an environment variable name"),
    ("run: x\nenv: {GPUCLI_GPUS: 8}\n", "task.yaml: env.GPUCLI_GPUS: GPUCLI_* variables are set by gpucli"),
    ("run: x\nenv: {A: [1]}\n", "task.yaml: env.A: expected a string or number"),
    ("run: x\ncode: git+https://user:tok@github.com/o/r\n", "task.yaml: code: no credentials in the URL"),
    ("run: x\ncode: git+ssh://github.com/o/r\n", "task.yaml: code: expected git+https://"),
    ("run: x\nmetrics_regex: '(?P<step>\\d+)'\n", "task.yaml: metrics_regex: needs named groups"),
    ("run: x\nmetrics_regex: '(?P<step>'\n", "task.yaml: metrics_regex: does not compile"),
    ("- run: x\n", "task.yaml: (top): expected a mapping of keys, got list"),
    ("run: [x\n", "task.yaml: line 2: not valid YAML"),
])
def test_one_line_errors(tmp_path, text, message):
    with pytest.raises(UsageError) as err:
        load_task(write(tmp_path, text))
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_a_missing_file(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist"):
        load_task(tmp_path / "nope.yaml")


def test_cli_options_override_the_file(tmp_path):
    task = load_task(write(tmp_path, "run: a\nprovider: vast\nlimits: {budget: 10}\nenv: {A: '1', B: '2'}\n"))
    over = with_overrides(task, run="b", provider="local", budget_usd=5.0, max_hours=None, code="other",
                          env={"B": "3", "C": "4"})
    assert (over.run, over.provider, over.budget_usd, over.code) == ("b", "local", 5.0, Path("other"))
    assert over.env_dict == {"A": "1", "B": "3", "C": "4"} and over.source == task.source
    with pytest.raises(UsageError, match="--budget: must be a finite number"):
        with_overrides(task, budget_usd=float("nan"))
    with pytest.raises(UsageError, match="--hours: must be positive"):
        with_overrides(task, max_hours=-1.0)
    with pytest.raises(UsageError, match="unknown provider"):
        with_overrides(task, provider="gcp")


def test_parse_task_is_the_same_without_a_file():
    assert parse_task({"run": "x", "code": "c"}, base=Path("/base")).code == Path("/base/c")
