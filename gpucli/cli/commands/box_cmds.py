"""A warm machine to iterate on: exec (a command on a run's machine, in its folder and environment)."""

from __future__ import annotations

import typer

from gpucli.cli.complete import run_names


def exec_(
    run: str = typer.Argument(..., help="Run name (its machine, folder and environment).", autocompletion=run_names),
    command: list[str] = typer.Argument(None, metavar="-- CMD...", help="The command: one argument is a shell "
                                        "line as written ('make && ./eval.sh | tee x'); several are quoted each."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start it and return; its output is in "
                                "`gpucli logs RUN --exec ID`."),
    json_: bool = typer.Option(False, "--json", help="With --detach: print the exec id as JSON."),
) -> None:
    """Run a command on the run's machine, in its folder, with its environment and secrets (from the 0600 env
    file, never a command line); its output streams here and its exit status is gpucli's (128+N for a signal;
    Ctrl-C ends it there)."""
    from gpucli.cli import render
    from gpucli.cli import render_exec as show
    from gpucli.run import execjob
    from gpucli.run import records as runs
    from gpucli.run.targets import open_host

    argv = list(command or [])
    if argv[:1] == ["--"]:  # click keeps the separator once the run name has ended the options
        argv = argv[1:]
    line = execjob.command_line(argv)  # a missing command is said before anything connects
    record = runs.resolve(run, on_bad=render.warn)
    with open_host(record) as host:
        started = execjob.start(host, record, [line], detach=detach)
        if detach:
            show.detached(record.name, started.exec_id, started.pid, started.out, json_=json_)
            return
        code = execjob.follow(host, started, on_out=show.out_bytes, on_err=show.err_bytes, on_note=show.note)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_)
