"""User state: GPUCLI_HOME, the catalogue location and keys.json (0600)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from gpucli.errors import UnknownNameError, UsageError

PACKAGE_CATALOG = Path(__file__).resolve().parent / "profiles"


def home() -> Path:
    """The directory holding gpucli's user state (runs, keys, known_hosts, SSH key).

    ``GPUCLI_HOME`` overrides the platform default (``$XDG_DATA_HOME/gpucli``, ``~/.local/share/gpucli``,
    ``~/Library/Application Support/gpucli`` on macOS, ``%APPDATA%\\gpucli`` on Windows).
    """
    env = os.environ.get("GPUCLI_HOME")
    if env:
        path = Path(env).expanduser()
    elif sys.platform == "darwin":
        path = Path.home() / "Library" / "Application Support" / "gpucli"
    elif os.name == "nt":
        path = Path(os.environ.get("APPDATA", Path.home())) / "gpucli"
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        path = Path(base) / "gpucli"
    path.mkdir(parents=True, exist_ok=True)
    return path


_catalog_override: str | None = None


def set_catalog_override(directory: str | None) -> None:
    """``--catalog DIR`` for this invocation (``gpucli.cli.app.main`` resets it on every call)."""
    global _catalog_override
    _catalog_override = directory


def catalog_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The catalogue directory: ``--catalog DIR``, else ``GPUCLI_CATALOG``, else the packaged one."""
    chosen = override or _catalog_override or os.environ.get("GPUCLI_CATALOG")
    if not chosen:
        return PACKAGE_CATALOG
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise UsageError(f"catalogue directory '{chosen}' does not exist",
                         hint="pass --catalog DIR or set GPUCLI_CATALOG to a folder of *.yaml files")
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600 from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def keys_path() -> Path:
    return home() / "keys.json"


def load_keys() -> dict[str, str]:
    path = keys_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read keys: {exc}") from exc
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def save_key(name: str, value: str) -> Path:
    keys = load_keys()
    keys[name] = value
    path = keys_path()
    write_private(path, json.dumps(keys, indent=2) + "\n")
    return path


# --- The keys gpucli knows: one table for `gpucli keys`, the provider clients and the Telegram sender ---


@dataclass(frozen=True)
class KeySpec:
    name: str  # as in `gpucli keys set NAME` and keys.json
    env_var: str  # the variable that, when set, wins over keys.json
    what: str  # for prompts and messages


KEYS: dict[str, KeySpec] = {k.name: k for k in (
    KeySpec("runpod", "RUNPOD_API_KEY", "RunPod API key"),
    KeySpec("vast", "VAST_API_KEY", "vast.ai API key"),
    KeySpec("telegram", "TELEGRAM_BOT_TOKEN", "Telegram bot token"),
    KeySpec("telegram-chat", "TELEGRAM_CHAT_ID", "Telegram chat id"),
    KeySpec("hf", "HF_TOKEN", "Hugging Face token (hf:// data)"),
)}
_KEY_ALIASES = {"vastai": "vast", "vast.ai": "vast", "telegram-token": "telegram", "telegram-chat-id": "telegram-chat"}


def key_spec(name: str) -> KeySpec:
    """The key called ``name`` (case, ``_`` for ``-`` and the usual aliases accepted)."""
    key = name.strip().lower().replace("_", "-")
    key = _KEY_ALIASES.get(key, key)
    if key not in KEYS:
        raise UnknownNameError("key", name, KEYS)
    return KEYS[key]


def lookup_key(name: str) -> tuple[str, str] | None:
    """``(value, source)`` of a key from its environment variable, else keys.json; None when neither has it.
    Provider keys have more places (the official tools' files): see gpucli.cloud.credentials."""
    spec = KEYS[name]
    value = os.environ.get(spec.env_var, "").strip()
    if value:
        return value, f"env {spec.env_var}"
    value = load_keys().get(name, "").strip()
    return (value, "keys.json") if value else None


def mask(value: str) -> str:
    """``****abcd`` for a long value; short values (chat ids, test keys) show nothing of themselves."""
    value = value.strip()
    return "****" + value[-4:] if len(value) >= 12 else "****"


# ---- the run's timing knobs (tests shorten them; users rarely need to) ---------------------------
# Every GPUCLI_* variable the run package reads goes through these functions, so each has one name,
# one check and one default.


def _seconds_from_env(var: str, default: float | None, *, max_value: float) -> float | None:
    raw = os.environ.get(var, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0 < value <= max_value):  # NaN fails this too
        raise UsageError(f"{var}={raw!r} must be a number between 0 and {max_value:g}")
    return value


def provider_poll_s() -> float:
    """Seconds between provider polls while a pod starts (``GPUCLI_PROVIDER_POLL_S``, default 5)."""
    return _seconds_from_env("GPUCLI_PROVIDER_POLL_S", 5.0, max_value=300) or 5.0


def watch_poll_s(default: float) -> float:
    """Seconds between checks of ``gpucli watch`` (``GPUCLI_WATCH_POLL_S`` overrides ``--poll``)."""
    return _seconds_from_env("GPUCLI_WATCH_POLL_S", default, max_value=86_400) or default


def watchdog_poll_s() -> float:
    """Seconds between the pod-side watchdog's checks (``GPUCLI_WATCHDOG_POLL_S``, default 30)."""
    return _seconds_from_env("GPUCLI_WATCHDOG_POLL_S", 30.0, max_value=3600) or 30.0


def watchdog_grace_s() -> float:
    """Seconds the watchdog waits between SIGTERM and SIGKILL (``GPUCLI_WATCHDOG_GRACE_S``, default 120)."""
    return _seconds_from_env("GPUCLI_WATCHDOG_GRACE_S", 120.0, max_value=3600) or 120.0


def watchdog_startup_minutes() -> float | None:
    """Minutes without a first metrics row before a stall verdict (``GPUCLI_WATCHDOG_STARTUP_MIN``;
    None: the watchdog's own default)."""
    return _seconds_from_env("GPUCLI_WATCHDOG_STARTUP_MIN", None, max_value=24 * 60)


def debug_from_env() -> bool:
    """``GPUCLI_DEBUG=1``: tracebacks on errors, as ``--debug`` gives."""
    return os.environ.get("GPUCLI_DEBUG", "").strip() == "1"


def pod_ssh_user() -> str | None:
    """The login user on cloud pods when it is not the provider's (``GPUCLI_POD_SSH_USER``; tests)."""
    return os.environ.get("GPUCLI_POD_SSH_USER", "").strip() or None
