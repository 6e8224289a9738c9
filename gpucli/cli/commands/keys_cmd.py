"""`gpucli keys set|list|path`: API keys and tokens in keys.json (0600). Values are never printed."""

from __future__ import annotations

import os
import re
import sys

import typer

_CHAT_ID = re.compile(r"^(-?\d{1,20}|@[A-Za-z][A-Za-z0-9_]{3,})$")


keys_app = typer.Typer(help="API keys and tokens: runpod, vast, telegram (bot token), telegram-chat (chat id), hf, "
                            "wandb, webhook (alert URL), or any NAME a launch passes with --env NAME.",
                       no_args_is_help=True)


# ignore_unknown_options: a group chat id such as -1001234567890 is a value, not an unknown option.
@keys_app.command("set", context_settings={"ignore_unknown_options": True})
def set_key(
    name: str = typer.Argument(..., help="runpod, vast, telegram (bot token), telegram-chat (chat id), hf, wandb, "
                               "webhook, or an UPPER_CASE name for `launch --env NAME`."),
    value: str = typer.Argument(None, help="The value. Omit it to be asked without echo (or pipe it on stdin); "
                                "a value on the command line stays in your shell history."),
) -> None:
    """Store a key in keys.json (mode 0600). The environment variable, when set, still wins."""
    from gpucli.cli import render
    from gpucli.errors import UsageError
    from gpucli.settings import key_spec, mask, save_key

    spec = key_spec(name)
    key, env_var, what = spec.name, spec.env_var, spec.what
    if value is None:
        value = render.ask_secret(what) if sys.stdin.isatty() else sys.stdin.read()
    value = value.strip()
    if not value:
        raise UsageError(f"no value given for {key}",
                         hint=f"run `gpucli keys set {key}` and paste it, or pipe it: `... | gpucli keys set {key}`")
    if any(ch.isspace() for ch in value):
        raise UsageError(f"the {what} cannot contain spaces or line breaks", hint="paste the value alone")
    if value.startswith("-") and not (key == "telegram-chat" and _CHAT_ID.match(value)):
        # unknown options reach us as values (see ignore_unknown_options): never store "--json" as a key
        raise UsageError(f"the value starts with '-': it looks like an option, not a {what}",
                         hint=f"run `gpucli keys set {key}` and paste the value at the prompt")
    if key == "webhook":
        from gpucli.runs.webhook import check_url

        check_url(value)
    if key == "telegram-chat" and not _CHAT_ID.match(value):
        raise UsageError("a Telegram chat id is a number (e.g. 123456789 or -100123...) or @channel_name")
    path = save_key(key, value)
    render.info(f"saved {key} ({mask(value)}) to {path}")
    if os.environ.get(env_var, "").strip():
        render.warn(f"{env_var} is set in this environment and takes precedence over keys.json")


@keys_app.command("list")
def list_keys(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Which keys are set and where each comes from (never the values)."""
    from gpucli.cli import render
    from gpucli.providers.credentials import describe_keys

    rows = describe_keys()
    if json_:
        render.json_out(rows)
    else:
        render.keys_table(rows)


@keys_app.command("path")
def keys_path() -> None:
    """Print the path of keys.json ($XDG_CONFIG_HOME/gpucli/keys.json; GPUCLI_HOME/keys.json when that is set)."""
    from gpucli.cli import render
    from gpucli.settings import keys_path as path

    render.line(str(path()))


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
