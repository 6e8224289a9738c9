"""The one precedence rule for a launch's inputs (gpucli/run/inputs/precedence.py): the command line beats
task.yaml, task.yaml beats your config (its provider's section before its top level), your config beats
the built-in defaults; a resume keeps the run's launch inputs unless its own command line overrides them.
Real files throughout: a task.yaml on disk, your config written by `gpucli config set`'s own code."""

from __future__ import annotations

import json

import pytest

from gpucli.run.inputs import precedence
from gpucli.run.inputs.precedence import CLI, CONFIG, DEFAULT, RECORDED, TASK, launch_choices, resume_choices
from gpucli.runs import userconfig
from tests.support.cli import cli


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text("run: python train.py\ncode: .\nprofile: h100\nprovider: runpod\nname: from-task\n"
                    "limits: {budget: 40, hours: 6, stall_minutes: 20}\n")
    return path


def _config(**settings: str) -> dict:
    for key, value in settings.items():
        userconfig.set_value(key.replace("__", "."), value)
    return userconfig.load()


def test_the_command_line_beats_task_yaml(task_file):
    chosen = launch_choices({"profile": "a100-80", "budget": 10.0, "run": None}, task_file=task_file, config={})
    assert (chosen["profile"], chosen.sources["profile"]) == ("a100-80", CLI)
    assert (chosen["budget"], chosen.sources["budget"]) == (10.0, CLI)
    assert chosen.task is not None and chosen.task.profile == "a100-80" and chosen.task.budget_usd == 10.0
    # what the command line left alone comes from the file
    assert (chosen["hours"], chosen.sources["hours"]) == (6, TASK)
    assert (chosen["provider"], chosen.sources["provider"]) == ("runpod", TASK)
    assert (chosen["name"], chosen.sources["name"]) == ("from-task", TASK)


def test_task_yaml_beats_your_config(task_file):
    mine = _config(provider="vast", profile="rtx4090", runpod__disk="120")
    chosen = launch_choices({}, task_file=task_file, config=mine)
    assert (chosen["provider"], chosen.sources["provider"]) == ("runpod", TASK)
    assert (chosen["profile"], chosen.sources["profile"]) == ("h100", TASK)
    # the provider task.yaml chose picks the section of your config that is read
    assert (chosen["disk"], chosen.sources["disk"]) == (120, CONFIG)


def test_your_config_beats_the_defaults_and_its_provider_section_its_top_level():
    mine = _config(phase="extreme", on_end="terminate", runpod__on_end="stop", provider="runpod", profile="h100")
    chosen = launch_choices({}, config=mine)
    assert (chosen["provider"], chosen.sources["provider"]) == ("runpod", CONFIG)
    assert (chosen["phase"], chosen.sources["phase"]) == ("extreme", CONFIG)
    assert (chosen["on_end"], chosen.sources["on_end"]) == ("stop", CONFIG)
    chosen = launch_choices({"provider": "vast"}, config=mine)
    assert (chosen["on_end"], chosen.sources["on_end"]) == ("terminate", CONFIG)  # no vast section
    # unset everywhere: None, and the built-in default is applied where the launch is resolved
    assert chosen["disk"] is None and chosen.sources.get("disk", DEFAULT) == DEFAULT
    assert chosen["model"] is None


def test_a_flag_left_unset_is_not_given():
    mine = _config(runpod__spot="true")
    assert launch_choices({"provider": "runpod", "spot": False}, config=mine).pick("spot") == (True,)
    assert launch_choices({"provider": "vast", "spot": False}, config=mine)["spot"] is None


def test_your_own_code_on_a_machine_of_yours_names_the_cpu_profile(tmp_path):
    task = tmp_path / "t.yaml"
    task.write_text("run: python train.py\n")
    mine = _config(profile="h100", model="1b")
    chosen = launch_choices({}, task_file=task, config=mine)
    assert (chosen["profile"], chosen.sources["profile"]) == ("cpu", DEFAULT)  # nothing rented: no config profile
    assert chosen["model"] is None  # your own code: no preset from your config


def test_code_without_run_is_refused_before_anything_is_read():
    from gpucli.errors import UsageError

    with pytest.raises(UsageError, match="--code needs --run"):
        launch_choices({"code": "."}, config={})


def test_resume_keeps_the_runs_inputs_unless_its_command_line_says_otherwise():
    recorded = {"provider": "runpod", "nodes": 2}
    kept = resume_choices(recorded)
    assert kept.values == {"provider": "runpod", "nodes": 2}
    assert kept.sources == {"provider": RECORDED, "nodes": RECORDED}
    moved = resume_choices(recorded, provider=" Vast ", nodes=1)
    assert moved.values == {"provider": "vast", "nodes": 1} and moved.sources == {"provider": CLI, "nodes": CLI}


def test_first_given_is_the_rule_every_caller_uses():
    layers = [(CLI, {"a": None, "b": ""}), (TASK, {"a": 0.5, "b": None}), (CONFIG, {"b": "x"})]
    assert precedence.first_given("a", layers) == (0.5, TASK)
    assert precedence.first_given("b", layers) == ("x", CONFIG)
    assert precedence.first_given("c", layers) == (None, DEFAULT)


def test_launch_applies_the_rule_end_to_end(capsys, tmp_path, monkeypatch):
    """`gpucli launch --dry-run`: each level beats the next, as a user sees it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "task.yaml").write_text("run: python train.py\nprofile: cpu\nprovider: local\nlimits: {hours: 3}\n")
    assert cli(capsys, "config", "set", "phase", "extreme")[0] == 0
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["phase"] == "extreme"  # your config over the default (fast)
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--dry-run", "--json")
    assert json.loads(out)["phase"] == "fast"  # the command line over your config
    assert cli(capsys, "config", "set", "provider", "ssh")[0] == 0  # ssh needs --host: it would fail
    code, out, err = cli(capsys, "launch", "task.yaml", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["provider"] == "local" and plan["limits"]["max_hours"] == 3  # task.yaml over your config
    code, out, err = cli(capsys, "launch", "task.yaml", "--hours", "1", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["limits"]["max_hours"] == 1  # the command line over task.yaml
    code, out, err = cli(capsys, "launch", "task.yaml", "--provider", "ssh", "--dry-run")
    assert code != 0 and "--provider ssh needs --host" in err and "Traceback" not in err
