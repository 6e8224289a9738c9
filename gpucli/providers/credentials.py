"""Where provider API keys and base URLs come from.

Keys are looked up in this order, first hit wins:

1. the environment (``RUNPOD_API_KEY`` / ``VAST_API_KEY``) - lets CI and one-off shells override;
2. gpucli's ``keys.json`` (``gpucli keys set runpod|vast``);
3. the files the official tools write, so a user who already set up ``runpod``/``vastai`` needs
   nothing more: ``~/.runpod/config.toml`` ``[default] api_key``; ``$XDG_CONFIG_HOME/vastai/vast_api_key``
   then ``~/.vast_api_key``.

Base URLs come from the variables the official SDKs honour (``RUNPOD_API_BASE_URL``, ``VAST_URL``),
read on every call like the RunPod SDK does, so tests can point a client at an emulator.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

from gpucli import settings
from gpucli.errors import ProviderError

#: RunPod's REST API v2 (paths under ``/v2``) and, until early 2027, its GraphQL (``/graphql``) share
#: this host (runpod/docs api-reference-v2/openapi.json ``servers``). REST v1 (rest.runpod.io/v1) was
#: retired on 2026-11-15 and is never called.
RUNPOD_DEFAULT_BASE_URL = "https://api.runpod.io"
VAST_DEFAULT_BASE_URL = "https://console.vast.ai"


class MissingKeyError(ProviderError):
    """No API key for a provider; the message says the two ways to add one."""


@dataclass(frozen=True)
class ApiKey:
    """A key and where it came from. ``repr``/``str`` never show the value."""

    provider: str
    source: str  # "env RUNPOD_API_KEY", "keys.json", "~/.runpod/config.toml", ...
    value: str = field(repr=False)

    def __str__(self) -> str:
        return f"<{self.provider} key from {self.source}>"

    def __repr__(self) -> str:
        return f"ApiKey(provider={self.provider!r}, source={self.source!r}, value='***')"


def runpod_base_url() -> str:
    return (os.environ.get("RUNPOD_API_BASE_URL") or RUNPOD_DEFAULT_BASE_URL).rstrip("/")


def vast_base_url() -> str:
    return (os.environ.get("VAST_URL") or VAST_DEFAULT_BASE_URL).rstrip("/")


def _read_runpod_toml(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        data = tomllib.loads(text)
    except Exception:  # noqa: BLE001 - a broken file is the same as no file
        match = re.search(r'^\s*api_key\s*=\s*["\']([^"\']+)["\']', text, re.MULTILINE)
        return match.group(1) if match else None
    section = data.get("default")
    value = section.get("api_key") if isinstance(section, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def _read_key_file(path: Path) -> str | None:
    try:
        value = path.read_text().strip()
    except OSError:
        return None
    return value or None


def resolve_key(provider: str) -> ApiKey:
    """The API key for ``provider`` ("runpod" or "vast"); raises :class:`MissingKeyError` if none."""
    if provider not in ("runpod", "vast"):
        raise ValueError(f"no key lookup for provider {provider!r}")
    spec = settings.KEYS[provider]
    found = settings.lookup_key(provider)
    if found:
        return ApiKey(provider, found[1], found[0])
    home = Path.home()
    if provider == "runpod":
        path = home / ".runpod" / "config.toml"
        in_toml = _read_runpod_toml(path)
        if in_toml:
            return ApiKey(provider, "~/.runpod/config.toml", in_toml)
    else:
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
        for path, shown in ((Path(xdg) / "vastai" / "vast_api_key", "$XDG_CONFIG_HOME/vastai/vast_api_key"),
                            (home / ".vast_api_key", "~/.vast_api_key")):
            in_file = _read_key_file(path)
            if in_file:
                return ApiKey(provider, shown, in_file)
    pretty = spec.what.removesuffix(" API key")
    raise MissingKeyError(f"No {pretty} key: run `gpucli keys set {provider}` or set {spec.env_var}")


@dataclass(frozen=True)
class KeyInfo:
    """Where one key comes from. ``masked`` shows at most the last 4 characters of a long value."""

    name: str
    env_var: str
    source: str | None  # the source gpucli uses: "env RUNPOD_API_KEY", "keys.json", "~/.runpod/config.toml"
    masked: str | None
    shadowed: tuple[str, ...] = ()  # other places that also hold it but lose to ``source``


def describe_keys() -> list[KeyInfo]:
    """Every known key with its winning source. Provider keys use the clients' own lookup
    (:func:`resolve_key`), so this table always agrees with what `gpucli offers` and `launch` use."""
    stored = settings.load_keys()
    rows = []
    for name, spec in settings.KEYS.items():
        in_env = os.environ.get(spec.env_var, "").strip()
        in_file = stored.get(name, "").strip()
        found: tuple[str, str] | None
        if name in ("runpod", "vast"):
            try:
                key = resolve_key(name)
                found = (key.value, key.source)
            except MissingKeyError:
                found = None
        else:
            found = settings.lookup_key(name)
        source = found[1] if found else None
        shadowed = tuple(s for s, present in ((f"env {spec.env_var}", in_env), ("keys.json", in_file))
                         if present and s != source)
        rows.append(KeyInfo(name=name, env_var=spec.env_var, source=source,
                            masked=settings.mask(found[0]) if found else None, shadowed=shadowed))
    return rows
