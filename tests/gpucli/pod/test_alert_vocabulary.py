"""One alert vocabulary: the trainer's list (trainer/spec/alerts.py), the copy the pod's job runner keeps
(it is standard library only and cannot import the trainer; its sender is gpucli/pod/jobalerts.py), the
names each of them sends, and the CLI's listing are the same words."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from gpucli.cli.app import app
from gpucli.pod import jobrun
from trainer.spec.alerts import ALERTS, EVENTS
from trainer.spec.load import load_config

ROOT = Path(__file__).resolve().parents[3]


def test_the_job_runner_keeps_the_same_list():
    assert jobrun.ALERT_EVENTS == EVENTS


def _sent_events(path: Path) -> set[str]:
    """Every event name a file passes as a string: ``send(text, "name")`` / ``event="name"`` /
    ``wants("name")``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "send" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            names.add(node.args[1].value)
        if node.func.attr == "wants" and node.args and isinstance(node.args[0], ast.Constant):
            names.add(node.args[0].value)
        names.update(k.value.value for k in node.keywords
                     if k.arg == "event" and isinstance(k.value, ast.Constant))
    return names


def test_the_job_runner_and_the_trainer_send_only_listed_events():
    for path in (ROOT / "gpucli" / "pod" / "jobalerts.py", ROOT / "trainer" / "watch" / "notify.py"):
        sent = _sent_events(path)
        assert sent, f"no event names found in {path.name}: the check reads nothing"
        assert sent <= set(EVENTS), f"{path.name} sends {sorted(sent - set(EVENTS))}, not in trainer/spec/alerts.py"


def test_every_listed_event_says_what_raises_it():
    assert all(re.fullmatch(r"[a-z_]+", name) and when.strip() for name, when in ALERTS.items())


def test_a_run_alerts_on_every_event_by_default():
    assert load_config(None, ["--training.max_steps=5"]).notifications.events == list(EVENTS)


def test_the_cli_lists_the_vocabulary():
    res = CliRunner().invoke(app, ["notify", "events", "--json"])
    assert res.exit_code == 0, res.output
    assert [row["event"] for row in json.loads(res.stdout)] == list(EVENTS)
