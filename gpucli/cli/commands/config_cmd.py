"""`gpucli config set|unset|get|list|path`: your launch defaults (config.yaml in gpucli's config home)."""

from __future__ import annotations

import typer

config_app = typer.Typer(help="Your launch defaults: provider, profile, and per provider disk, image, "
                              "ready_timeout, python, on_end, spot, reliability (e.g. gpucli config set vast.reliability 0.98).",
                         no_args_is_help=True)


@config_app.command("set", context_settings={"ignore_unknown_options": True})  # a value may be -5
def set_(key: str = typer.Argument(..., help="provider, profile, phase, model, on_end, or PROVIDER.SETTING "
                                             "(runpod.disk, vast.ready_timeout, ...)."),
         value: str = typer.Argument(..., help="The value.")) -> None:
    """Set a default (the command line and task.yaml still win over it)."""
    from gpucli.cli import render
    from gpucli.runs import userconfig

    k, v = userconfig.set_value(key, value)
    render.info(f"{k} = {v} (in {userconfig.path()})")


@config_app.command("unset")
def unset(key: str = typer.Argument(..., help="The setting to remove.")) -> None:
    """Remove a default."""
    from gpucli.cli import render
    from gpucli.runs import userconfig

    k, _ = userconfig.set_value(key, None)
    render.info(f"{k} unset")


@config_app.command("get")
def get(key: str = typer.Argument(..., help="The setting.")) -> None:
    """Print a default (nothing when it is not set)."""
    from gpucli.cli import render
    from gpucli.runs import userconfig

    k = userconfig.parse_key(key)
    value = userconfig.get(userconfig.load(), k.name, k.provider) if k.provider else userconfig.load().get(k.name)
    if value is not None:
        render.line(str(value))


@config_app.command("list")
def list_(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Every default that is set."""
    from gpucli.cli import render
    from gpucli.runs import userconfig

    data = userconfig.load()
    if json_:
        render.json_out(data)
        return
    for name, value in sorted(data.items()):
        if isinstance(value, dict):
            for sub, v in sorted(value.items()):
                render.line(f"{name}.{sub} = {v}")
        else:
            render.line(f"{name} = {value}")


@config_app.command("path")
def path() -> None:
    """Print the path of config.yaml."""
    from gpucli.cli import render
    from gpucli.runs import userconfig

    render.line(str(userconfig.path()))


def schema(kind: str = typer.Argument(..., metavar="task|run", help="task (task.yaml) or run (run.yaml).")) -> None:
    """The JSON Schema of task.yaml or run.yaml, for your editor's YAML support."""
    from gpucli.cli import render
    from gpucli.errors import UsageError
    from gpucli.runs import schemas

    if kind not in schemas.SCHEMAS:
        raise UsageError(f"no schema {kind!r}: task or run")
    render.line(schemas.render(kind).rstrip("\n"))


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
    app.command("schema")(schema)
