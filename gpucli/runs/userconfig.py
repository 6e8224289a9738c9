"""Your defaults for ``gpucli launch``: ``config.yaml`` in gpucli's config home
(``$XDG_CONFIG_HOME/gpucli``), written by ``gpucli config set``::

    provider: runpod          # gpucli config set provider runpod
    profile: h100
    store: s3://my-bucket/runs  # every run's checkpoints also go there (gpucli config set store ...)
    runpod:                   # per provider: gpucli config set runpod.disk 100
      disk: 100
      image: runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404
    vast:
      ready_timeout: 900
      reliability: 0.98       # only offers at least this reliable (as the provider reports it)

What wins, first found: the command line, then task.yaml, then this file, then the built-in defaults
(:mod:`gpucli.runs.defaults`). Every value is checked when it is set and again when it is read (one
line naming the file and key, never a traceback).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpucli.errors import UsageError
from gpucli.runs.storeurl import store_url
from gpucli.settings import config_home, write_private

PROVIDERS = ("local", "ssh", "runpod", "vast")


def provider_problem(value: str) -> str | None:
    """Why ``value`` is no ``--provider`` (None when it is one): a provider, ``any`` (every cloud whose key
    is set), or a list of them (``runpod,vast``; gpucli/run/life/failover.py tries them in order of cost)."""
    names = [n.strip() for n in value.split(",")] if "," in value else [value]
    if value == "any" or (names and all(n in PROVIDERS for n in names)):
        return None
    bad = next((n for n in names if n not in PROVIDERS), value)
    return f"unknown provider {bad!r} (valid: {', '.join(PROVIDERS)}, any, or a list such as runpod,vast)"
TOP = {"provider": "provider", "profile": "str", "phase": "phase", "model": "str", "on_end": "on_end",
       "mcp_max_usd": "usd", "store": "store"}  # what `gpucli mcp` may let an agent launch, per call and per day (cli/mcp_server.py)
PER_PROVIDER = {"disk": "gb", "image": "str", "ready_timeout": "seconds", "python": "str", "on_end": "on_end",
                "spot": "bool", "reliability": "fraction"}


@dataclass(frozen=True)
class Key:
    provider: str | None  # None: a top-level key
    name: str

    def __str__(self) -> str:
        return f"{self.provider}.{self.name}" if self.provider else self.name


def path() -> Path:
    return config_home() / "config.yaml"


def parse_key(text: str) -> Key:
    parts = text.strip().lower().split(".")
    if len(parts) == 1 and parts[0] in TOP:
        return Key(None, parts[0])
    if len(parts) == 2 and parts[0] in PROVIDERS and parts[1] in PER_PROVIDER:
        return Key(parts[0], parts[1])
    valid = ", ".join([*TOP, *(f"PROVIDER.{k}" for k in PER_PROVIDER)])
    raise UsageError(f"unknown setting {text!r}", hint=f"settings: {valid}; PROVIDER is {', '.join(PROVIDERS)}")


def check_value(key: Key, value: Any, *, where: str = "") -> Any:
    """The value, typed, for ``key`` (a string from the command line or a YAML value)."""
    kind = TOP[key.name] if key.provider is None else PER_PROVIDER[key.name]
    label = f"{where}{key}"
    if kind == "provider":
        v = str(value).strip().lower()
        if (problem := provider_problem(v)) is not None:
            raise UsageError(f"{label}: {problem}")
        return v
    if kind == "store":  # a checkpoint store for every run: s3://BUCKET/PREFIX or hf://OWNER/NAME
        try:
            return store_url(str(value))
        except UsageError as exc:
            raise UsageError(f"{label}: {exc.message}") from None
    if kind == "on_end":
        v = str(value).strip().lower()
        if v not in ("stop", "terminate"):
            raise UsageError(f"{label}: must be stop or terminate, got {value!r}")
        return v
    if kind == "phase":
        v = str(value).strip().lower()
        if v not in ("fast", "extreme"):
            raise UsageError(f"{label}: must be fast or extreme, got {value!r}")
        return v
    if kind == "bool":
        if isinstance(value, bool):
            return value
        v = str(value).strip().lower()
        if v in ("true", "yes", "on", "1"):
            return True
        if v in ("false", "no", "off", "0"):
            return False
        raise UsageError(f"{label}: expected true or false, got {value!r}")
    if kind == "fraction":
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and 0 < number <= 1):
            raise UsageError(f"{label}: expected a fraction in (0, 1], e.g. 0.98, got {value!r}")
        return number
    if kind in ("gb", "seconds", "usd"):
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number > 0) or (kind == "gb" and number != int(number)):
            raise UsageError(f"{label}: expected a positive {'whole number of GB' if kind == 'gb' else 'number'}, "
                             f"got {value!r}")
        return int(number) if kind == "gb" else number
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
        raise UsageError(f"{label}: expected a non-empty string, got {value!r}")
    return str(value).strip()


def load() -> dict[str, Any]:
    """The file's settings, checked (an empty dict when there is no file)."""
    p = path()
    try:
        text = p.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {p}: {exc}") from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{p}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{p}: expected a mapping of settings, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, dict) and str(name) in PROVIDERS:
            section = out.setdefault(str(name), {})
            for sub, v in value.items():
                key = parse_key(f"{name}.{sub}")
                section[key.name] = check_value(key, v, where=f"{p.name}: ")
        else:
            key = parse_key(str(name))
            out[key.name] = check_value(key, value, where=f"{p.name}: ")
    return out


def get(settings: dict[str, Any], name: str, provider: str | None = None) -> Any:
    """A setting for ``provider`` (its section first), else the top-level one; None when unset."""
    if provider and isinstance(settings.get(provider), dict) and name in settings[provider]:
        return settings[provider][name]
    value = settings.get(name)
    return None if isinstance(value, dict) else value


def set_value(text_key: str, value: str | None) -> tuple[Key, Any]:
    """Set (or with ``value`` None, unset) one setting; the file is rewritten (0600)."""
    key = parse_key(text_key)
    data = load()
    typed = None if value is None else check_value(key, value)
    if key.provider is None:
        if typed is None:
            data.pop(key.name, None)
        else:
            data[key.name] = typed
    else:
        section = data.setdefault(key.provider, {})
        if typed is None:
            section.pop(key.name, None)
            if not section:
                data.pop(key.provider)
        else:
            section[key.name] = typed
    write_private(path(), "# gpucli launch defaults (gpucli config set KEY VALUE)\n"
                  + yaml.safe_dump(data, sort_keys=True))
    return key, typed
