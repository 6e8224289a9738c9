"""A warm machine to iterate on: exec (a command on a run's machine, in its folder and environment), up (a dev
box with the environment ready and no job, ended by itself when idle)."""

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
    from gpucli.providers.registry import open_host
    from gpucli.run.host import execjob
    from gpucli.runs import records as runs

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


def up(
    profile: str = typer.Option(None, "--profile", "-p", help="Profile: h100, 8xA100, cpu, ... (gpucli profiles)."),
    provider: str = typer.Option(None, "--provider", help="runpod, vast, ssh or local."),
    idle_stop: str = typer.Option("30m", "--idle-stop", help="End the box after this long with no job, no SSH "
                                  "session and idle GPUs (30m, 2h, 90s); held on the machine, laptop shut."),
    on_end: str = typer.Option(None, "--on-end", help="What ends the box: stop (default; the disk stays) or terminate."),
    hours: float = typer.Option(None, "--hours", help="End the box after this many hours, busy or not."),
    budget: float = typer.Option(None, "--budget", help="End the box when it has cost this many dollars."),
    price: float = typer.Option(None, "--price", help="$/hour of the machine (default: the offer's or catalogue's)."),
    name: str = typer.Option(None, "--name", help="Box name (default: box-PROFILE)."),
    host: str = typer.Option(None, "--host", help="ssh provider: user@host[:port]."),
    identity: str = typer.Option(None, "--identity", "-i", help="ssh provider: private key file."),
    python: str = typer.Option(None, "--python", help="Python on the machine (default: python3; local: this one)."),
    image: str = typer.Option(None, "--image", help="Container image for cloud pods."),
    disk: int = typer.Option(None, "--disk", help="Disk for cloud pods, GB."),
    workdir: str = typer.Option(None, "--workdir", help="The box's folder on the machine (runs on it go beside it)."),
    ready_timeout: float = typer.Option(None, "--ready-timeout", help="Seconds to wait for a pod's SSH, per offer."),
    env: list[str] = typer.Option([], "--env", metavar="NAME", help="A secret by name for the box's 0600 env file."),
    json_: bool = typer.Option(False, "--json", help="Print the box's record as JSON."),
) -> None:
    """Rent a machine with the environment ready and no job (a dev box): SSH config entry written, `gpucli
    launch --on BOX` runs jobs on it, `gpucli down BOX` ends it; it ends itself when idle."""
    from gpucli.cli import render
    from gpucli.cli import render_runs as show
    from gpucli.errors import UsageError
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.inputs.launch import LaunchRequest
    from gpucli.run.life import box
    from gpucli.runs import sshconfig, userconfig
    from gpucli.runs.limits import Limits

    mine = userconfig.load()
    provider = provider or userconfig.get(mine, "provider")
    profile = profile or userconfig.get(mine, "profile", provider)
    if profile is None:
        raise UsageError("--profile is required", hint="gpucli profiles lists them")
    idle = box.parse_idle(idle_stop)
    from gpucli.runs.defaults import DEFAULTS

    req = LaunchRequest(profile=profile, provider=provider or DEFAULTS.provider, name=name, host=host,
                        identity=identity, python=python or userconfig.get(mine, "python", provider),
                        image=image or userconfig.get(mine, "image", provider),
                        disk_gb=disk or userconfig.get(mine, "disk", provider), workdir=workdir,
                        on_end=on_end or userconfig.get(mine, "on_end", provider), ready_timeout_s=ready_timeout,
                        env_names=tuple(env), limits=Limits(max_hours=hours, budget_usd=budget,
                                                            price_per_hour_usd=price))
    with show.status_line() as step:
        record = box.up(load_catalog(), req, idle_minutes=idle, on_step=step, on_notice=show.notice)
    if record.ssh is not None:
        entry = sshconfig.write_entry(record)
        render.info(f"{record.name}: `ssh {entry.alias}` (VS Code / Cursor Remote-SSH host {entry.alias}); "
                    f"Jupyter: `gpucli forward {record.name} 8888`")
    if json_:
        render.json_out({"box": record.name, "provider": record.provider, "workdir": record.workdir,
                         "instance_id": record.instance_id, "idle_minutes": idle})
        return
    render.info(f"box {record.name} is up: `gpucli launch --on {record.name} ...`, `gpucli exec {record.name} -- CMD`; "
                f"it ends itself after {idle_stop} idle; `gpucli down {record.name}` ends it now")


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_)
    app.command("up")(up)
