"""User state: GPUCLI_HOME, the catalogue location and keys.json (0600)."""

from __future__ import annotations

import json
import os
import re
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
    try:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(20, "it is not a folder")
        path.mkdir(parents=True, exist_ok=True)
        usable = path.is_dir() and os.access(path, os.W_OK | os.X_OK)
        problem = "it is not a writable folder"
    except OSError as exc:
        usable, problem = False, exc.strerror or str(exc)
    if not usable:
        where = "GPUCLI_HOME" if env else "gpucli's data folder"
        raise UsageError(f"{where} {path} cannot be used: {problem}",
                         hint="point GPUCLI_HOME at a folder you can write to")
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


def config_home() -> Path:
    """Where the user's settings live (keys.json, config.yaml): ``$XDG_CONFIG_HOME/gpucli`` (default
    ``~/.config/gpucli``) on Linux; with ``GPUCLI_HOME`` set, and on macOS and Windows, gpucli's home."""
    if os.environ.get("GPUCLI_HOME") or sys.platform == "darwin" or os.name == "nt":
        return home()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    path = Path(base).expanduser() / "gpucli"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def keys_path() -> Path:
    return config_home() / "keys.json"


def legacy_keys_path() -> Path:
    """Where keys.json was before it moved to :func:`config_home` (gpucli's data home)."""
    return home() / "keys.json"


def _read_keys(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read keys: {exc}") from exc
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _move_legacy_keys() -> None:
    """Move keys.json from the data home to the config home, once (0600 from the first byte). A move
    that fails leaves the old file, which :func:`load_keys` still reads."""
    old, new = legacy_keys_path(), keys_path()
    if old == new or not old.is_file() or new.exists():
        return
    try:
        write_private(new, old.read_text())
        old.unlink()
    except OSError:
        pass


def load_keys() -> dict[str, str]:
    """keys.json (the config home's; the old data-home file still read for what it alone holds)."""
    _move_legacy_keys()
    keys = _read_keys(keys_path())
    old = legacy_keys_path()
    if old != keys_path() and old.is_file():
        keys = {**_read_keys(old), **keys}
    return keys


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
    KeySpec("hf", "HF_TOKEN", "Hugging Face token (hf:// data, --env HF_TOKEN)"),
    KeySpec("wandb", "WANDB_API_KEY", "Weights & Biases API key (--env WANDB_API_KEY)"),
    KeySpec("webhook", "GPUCLI_WEBHOOK_URL", "alert webhook URL (Slack, Discord or ntfy)"),
)}
_KEY_ALIASES = {"vastai": "vast", "vast.ai": "vast", "telegram-token": "telegram", "telegram-chat-id": "telegram-chat"}


def key_spec(name: str) -> KeySpec:
    """The key called ``name`` (case, ``_`` for ``-`` and the usual aliases accepted)."""
    for spec in KEYS.values():
        if name.strip() == spec.env_var:
            return spec
    key = name.strip().lower().replace("_", "-")
    key = _KEY_ALIASES.get(key, key)
    if key in KEYS:
        return KEYS[key]
    if re.fullmatch(r"[A-Z_][A-Z0-9_]*", name.strip()) and not name.startswith("GPUCLI_"):
        # any other secret a run asks for by name (--env NAME): stored under that very name
        return KeySpec(name.strip(), name.strip(), f"{name.strip()} (for --env {name.strip()})")
    raise UnknownNameError("key", name, KEYS)


def lookup_key(name: str) -> tuple[str, str] | None:
    """``(value, source)`` of a key from its environment variable, else keys.json; None when neither has it.
    Provider keys have more places (the official tools' files): see gpucli.providers.credentials."""
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


def watchdog_launch_minutes() -> float | None:
    """Minutes without a sign of the launch (before the trainer starts) after which the early watchdog
    ends the pod (``GPUCLI_WATCHDOG_LAUNCH_MIN``; None: the watchdog's own default, 60)."""
    return _seconds_from_env("GPUCLI_WATCHDOG_LAUNCH_MIN", None, max_value=24 * 60)


def debug_from_env() -> bool:
    """``GPUCLI_DEBUG=1``: tracebacks on errors, as ``--debug`` gives."""
    return os.environ.get("GPUCLI_DEBUG", "").strip() == "1"


def pod_ssh_user() -> str | None:
    """The login user on cloud pods when it is not the provider's (``GPUCLI_POD_SSH_USER``; tests)."""
    return os.environ.get("GPUCLI_POD_SSH_USER", "").strip() or None


def volume_mount() -> str:
    """Where a RunPod network volume is mounted in the pod (RunPod's ``volumeMountPath`` default);
    ``GPUCLI_VOLUME_MOUNT`` names another place (the emulator's volume store in tests)."""
    return (os.environ.get("GPUCLI_VOLUME_MOUNT") or "/workspace").rstrip("/") or "/"


def cluster_ssh_port() -> int:
    """The port a RunPod cluster member's sshd listens on inside the cluster (22, the image's; reached through
    the primary); ``GPUCLI_CLUSTER_SSH_PORT`` names another (an emulator's)."""
    value = os.environ.get("GPUCLI_CLUSTER_SSH_PORT", "")
    return int(value) if value.isdigit() and 0 < int(value) < 65536 else 22


def link_probe_port() -> int:
    """The port rank 0 listens on while the nodes' link is measured at launch (``GPUCLI_LINK_PROBE_PORT``;
    default 0: a free one), for machines whose firewall opens only some ports between them."""
    raw = os.environ.get("GPUCLI_LINK_PROBE_PORT", "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise UsageError(f"GPUCLI_LINK_PROBE_PORT={raw!r} must be a port number (1-65535)")
    return int(raw)
