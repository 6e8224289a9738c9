"""The root Typer app. ``main()`` is the one place where errors become exit codes.

Command modules are imported here so Typer can build the help, but each of them imports only typer
and the standard library at module level: the core (catalogue, planner, providers, paramiko, torch)
loads inside the command that needs it, which keeps ``gpucli --help`` and ``gpucli plan`` fast.
"""

from __future__ import annotations

import os
import sys

import typer

from gpucli import __version__
from gpucli.commands import catalog_cmds, plan_cmd

app = typer.Typer(
    name="gpucli",
    help="Plan, rent, train and harvest language-model runs on rented GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpucli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    catalog: str = typer.Option(None, "--catalog", metavar="DIR", envvar="GPUCLI_CATALOG",
                                help="Use the catalogue *.yaml files in DIR instead of the built-in one."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    if catalog:
        os.environ["GPUCLI_CATALOG"] = catalog


catalog_cmds.register(app)
plan_cmd.register(app)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map every error to an exit code and a one-line message on stderr."""
    import click

    from gpucli.errors import ExitCode, GpucliError

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("GPUCLI_DEBUG") == "1"
    try:
        app(args=args, prog_name="gpucli", standalone_mode=False)
        return ExitCode.OK
    except GpucliError as err:
        from gpucli import render

        if debug:
            render.traceback()
        render.error(str(err))
        return int(err.exit_code)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except (KeyboardInterrupt, click.exceptions.Abort):
        from gpucli import render

        render.error("interrupted")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # `gpucli plan --json | head`: not an error of ours.
        sys.stderr.close()
        return ExitCode.OK
    except Exception as exc:  # a bug: one line unless --debug
        from gpucli import render

        if debug:
            render.traceback()
        render.error(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
        return ExitCode.ERROR


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
