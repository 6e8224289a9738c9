"""Reading a run config: the YAML file, the ``--section.key=value`` overrides, then the schema
(:mod:`trainer.spec.config`) and the range and cross-field checks (:mod:`trainer.spec.validate`).
gpucli checks its run.yaml with :func:`validated_config` before it rents anything, with the very
code the trainer runs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from trainer.spec.config import Config, ConfigError, _build
from trainer.spec.validate import validate


class NumberLoader(yaml.SafeLoader):
    """YAML's safe loader reading ``3e-4`` and ``1e5`` as numbers, as YAML 1.2 and every person writing a
    learning rate do: PyYAML follows YAML 1.1, whose floats need a dot (``3.0e-4``), and took ``3e-4`` for
    text ("expected a number")."""


NumberLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """``text`` as YAML, numbers with an exponent and no dot included (:class:`NumberLoader`)."""
    return yaml.load(text, Loader=NumberLoader)  # noqa: S506 - a SafeLoader subclass


def parse_override(arg: str) -> tuple[str, Any]:
    """'--training.max_steps=20' -> ('training.max_steps', 20); values are YAML scalars."""
    body = arg[2:] if arg.startswith("--") else arg
    if "=" not in body:
        raise ConfigError(f"override '{arg}' must look like --section.key=value")
    key, _, text = body.partition("=")
    try:
        value = load_yaml(text) if text != "" else ""
    except yaml.YAMLError:
        value = text
    return key.strip(), value


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override '{key}': '{p}' is not a section")
        node = child
    node[parts[-1]] = value


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> Config:
    """Read YAML (optional), apply ``--a.b=c`` overrides, validate, and return a :class:`Config`."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
        try:
            loaded = load_yaml(text)
        except yaml.YAMLError as e:
            line = getattr(getattr(e, "problem_mark", None), "line", None)
            where = f" line {line + 1}" if line is not None else ""
            raise ConfigError(f"config {p}{where} is not valid YAML") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {p} must be a mapping of sections")
        raw = loaded
    for arg in overrides or []:
        key, value = parse_override(arg)
        apply_override(raw, key, value)
    return validated_config(raw)


def validated_config(raw: dict[str, Any]) -> Config:
    """A validated :class:`Config` from the YAML's mapping (gpucli checks its run.yaml with this
    before it rents anything)."""
    cfg: Config = _build(Config, raw, "")
    validate(cfg)
    return cfg
