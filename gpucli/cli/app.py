"""The root Typer app. ``main()`` is the one place where errors become exit codes.

Command modules are imported here so Typer can build the help, but each of them imports only typer
and the standard library at module level: the core (catalogue, planner, providers, paramiko, torch)
loads inside the command that needs it, which keeps ``gpucli --help`` and ``gpucli plan`` fast.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import signal
import sys
from typing import Any

import typer
import typer.main

from gpucli import __version__
from gpucli.cli.commands import (
    access_cmds,
    box_cmds,
    calibrate_cmd,
    catalog_cmds,
    config_cmd,
    doctor_cmd,
    export_cmd,
    keys_cmd,
    mcp_cmd,
    notify_cmd,
    offers_cmd,
    plan_cmd,
    run_cmds,
    serve_cmd,
    sweep_cmd,
    tensorboard_cmd,
)

app = typer.Typer(
    name="gpucli",
    help="Plan, rent, train and harvest language-model runs on rented GPUs.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish); run names complete
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
    from gpucli.settings import set_catalog_override

    set_catalog_override(catalog)


catalog_cmds.register(app)
plan_cmd.register(app)
offers_cmd.register(app)
run_cmds.register(app)
calibrate_cmd.register(app)
keys_cmd.register(app)
notify_cmd.register(app)
serve_cmd.register(app)
tensorboard_cmd.register(app)
export_cmd.register(app)
doctor_cmd.register(app)
access_cmds.register(app)
config_cmd.register(app)
sweep_cmd.register(app)
mcp_cmd.register(app)
box_cmds.register(app)


def _is_click_error(exc: BaseException) -> bool:
    """Usage errors from the parser: click's, or the copy of click that typer >= 0.26 vendors."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)


_FINITE_TYPES: dict[type, type] = {}


def _finite(param_type: Any) -> Any:
    """``param_type`` (click's float or float range) refusing nan and inf, which click accepts."""
    base = type(param_type)
    cls = _FINITE_TYPES.get(base)
    if cls is None:
        def convert(self: Any, value: Any, param: Any, ctx: Any) -> Any:
            number = base.convert(self, value, param, ctx)
            if isinstance(number, float) and not math.isfinite(number):
                self.fail(f"{value!r} is not a finite number", param, ctx)
            return number

        cls = _FINITE_TYPES[base] = type(f"Finite{base.__name__}", (base,), {"convert": convert})
    finite = copy.copy(param_type)
    finite.__class__ = cls
    return finite


def _command() -> Any:
    """The click command tree, built once, with every float option made finite-only: one place that
    keeps nan and inf out of every number a user types (budgets, hours, prices, timeouts, polls)."""
    global _COMMAND
    if _COMMAND is None:
        command = typer.main.get_command(app)
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.short_help:
                sub.short_help = _short_help(name, sub)
        stack = [command]
        while stack:
            cmd = stack.pop()
            stack.extend(getattr(cmd, "commands", {}).values())
            for param in cmd.params:
                if getattr(param.type, "name", "") in ("float", "float range"):
                    param.type = _finite(param.type)
        _COMMAND = command
    return _COMMAND


_COMMAND: Any = None

# One line per command in `gpucli --help`, each whole at 80 columns: click cuts a command's first
# sentence to the space the widest name leaves (about 60 characters), whatever the terminal's width,
# so a long first sentence ends in "..." everywhere. The command's own -h still shows all of it.
SHORT_HELP = {
    "gpus": "GPU specs and prices, with each price's source and age.",
    "profiles": "Single-GPU and cluster profiles, and the training phases.",
    "models": "Model presets with parameter counts from their shapes.",
    "plan": "Every setup that fits, and the Pareto front of cost vs time.",
    "offers": "Live offers across providers: $/h, reliability, speed.",
    "launch": "Rent a machine, sync code and data, start training.",
    "status": "State, step, loss, tok/s, $ so far and ETA of a run.",
    "ls": "Every run with its state and cost; the day's total.",
    "tail": "Live metrics of a run: loss, tok/s, MFU, ETA, $.",
    "fetch-best": "Download the lowest-val-loss checkpoint, sha256-verified.",
    "down": "Stop the trainer (a last checkpoint), release the machine.",
    "sync": "Push more data to a running pod (incremental, resumable).",
    "ssh": "An interactive shell on the run's pod, in its folder.",
    "resume": "Continue a stopped or preempted run from its newest checkpoint.",
    "mirror": "Copy a run's newest checkpoint and metrics to this machine.",
    "watch": "Stay attached: mirror checkpoints, notice preemption, recover.",
    "calibrate": "Teach the planner a run's measured tokens/s and MFU.",
    "serve": "Serve a checkpoint as an OpenAI-compatible API on localhost.",
    "tensorboard": "TensorBoard for a run on localhost (tunnelled from the pod).",
    "export": "Export the best weights for transformers (safetensors).",
    "doctor": "Check keys, provider APIs, balance, SSH key and alerts.",
    "logs": "The job's raw console output, with the pod's clock.",
    "ssh-config": "Write an SSH config entry so `ssh gpucli-RUN` works.",
    "forward": "Forward a port of the run's host to this machine.",
    "schema": "The JSON Schema of task.yaml or run.yaml, for your editor.",
    "keys": "API keys and tokens (stored 0600, never printed).",
    "notify": "Telegram alerts: a test message, and the events runs send.",
    "config": "Your launch defaults: provider, profile, disk, image.",
    "sweep": "One run per combination of --set values, under one budget.",
    "mcp": "gpucli's commands as MCP tools over stdio, for an agent.",
    "exec": "Run a command on a run's machine, in its folder and env.",
    "up": "A dev box: environment ready, no job, ends itself when idle.",
}


def _short_help(name: str, cmd: Any) -> str | None:
    """The one line `gpucli --help` shows for ``cmd``: its entry above, else its first sentence when
    that fits; None keeps click's own (a command added without an entry still shows something)."""
    if name in SHORT_HELP:
        return SHORT_HELP[name]
    first = (cmd.help or "").strip().split("\n\n")[0].replace("\n", " ")
    sentence = first.split(". ")[0].rstrip(".")
    return sentence if 0 < len(sentence) <= 60 else None


def _usage_line(exc: Any) -> str:
    """A parser error in one line: what is wrong, and where the help is."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
    return f"{exc.format_message()}{where}"


def _ended_by(signum: int) -> int:
    """A command ended by SIGTERM or SIGHUP (after its cleanup ran): one line, and 128 + the signal."""
    from gpucli.cli import render

    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) cannot take the line
        render.error(f"ended by {signal.Signals(signum).name}; what this command had started was cleaned up")
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; map every error to an exit code and a one-line message on stderr."""
    from gpucli.errors import ExitCode, GpucliError
    from gpucli.settings import debug_from_env, set_catalog_override

    set_catalog_override(None)
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        # Plain `gpucli` is a newcomer asking what there is: the help, on stdout, not an error.
        args = ["--help"]
    debug = "--debug" in args or debug_from_env()
    from gpucli.run.host.owner import signals_interrupt

    ended_by: list[int] = []
    try:
        with signals_interrupt() as ended_by:  # SIGTERM and SIGHUP clean up as Ctrl-C does
            result = _command().main(args=args, prog_name="gpucli", standalone_mode=False)
        if ended_by:
            return _ended_by(ended_by[0])
        # With standalone_mode=False, --help and typer.Exit come back as a return value.
        return int(result) if isinstance(result, int) else ExitCode.OK
    except GpucliError as err:
        from gpucli.cli import render

        if debug:
            render.traceback()
        render.error(str(err))
        return int(err.exit_code)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        from gpucli.cli import render

        if ended_by:
            return _ended_by(ended_by[0])
        render.error("interrupted")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # `gpucli plan --json | head`: not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter shutdown quiet
        except OSError:
            pass
        return ExitCode.OK
    except Exception as exc:
        from gpucli.cli import render

        if _is_click_error(exc):
            render.error(_usage_line(exc))
            return int(exc.exit_code)  # type: ignore[attr-defined]

        if debug:
            render.traceback()
        render.error(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)")
        return ExitCode.ERROR
    finally:
        # --catalog holds for one invocation: a library caller (or a test) that calls main() again, or
        # loads the catalogue itself afterwards, must not inherit it.
        set_catalog_override(None)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
