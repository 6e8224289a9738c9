"""Reaching a run's machine from your own tools: ssh-config (ssh, scp, VS Code by name), forward (any
port), logs (the job's raw console output)."""

from __future__ import annotations

import typer

RUN_ARG = typer.Argument(None, metavar="[RUN]", help="Run name (default: the newest run).")


def ssh_config(
    run: str = RUN_ARG,
    remove: bool = typer.Option(False, "--remove", help="Remove the run's entry instead."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write a `Host gpucli-RUN` entry (host key pinned) into a file ~/.ssh/config includes, so `ssh
    gpucli-RUN`, scp and VS Code Remote-SSH reach the pod by name. `gpucli down` removes it."""
    from gpucli.cli import render
    from gpucli.run import records as runs
    from gpucli.run import sshconfig

    record = runs.resolve(run, on_bad=render.warn)
    if remove:
        gone = sshconfig.remove_entry(record.name)
        if json_:
            render.json_out({"run": record.name, "host": sshconfig.alias(record.name), "removed": gone})
        else:
            render.info(f"removed {sshconfig.alias(record.name)}" if gone else f"no entry for {record.name}")
        return
    entry = sshconfig.write_entry(record)
    if json_:
        render.json_out({"run": record.name, "host": entry.alias, "file": str(entry.path),
                         "known_hosts": str(entry.known_hosts), "include_added": entry.include_added})
        return
    if entry.include_added:
        render.info(f"added `{sshconfig.include_line()}` at the top of {sshconfig.user_ssh_config()}")
    render.info(f"wrote {entry.path}: `ssh {entry.alias}`, `scp FILE {entry.alias}:`, or VS Code Remote-SSH "
                f"host {entry.alias}")
    render.line(entry.alias)


def forward(
    run: str = typer.Argument(..., help="Run name."),
    ports: str = typer.Argument(..., metavar="PORT[:LOCAL]", help="The port on the run's host, and the local "
                                "one (default: the same; 0: any free one)."),
    json_: bool = typer.Option(False, "--json", help="Print the local URL as JSON when the tunnel is up."),
) -> None:
    """Forward a port of the run's host to this machine over the run's SSH (Ctrl-C ends it)."""
    from gpucli.cli import render
    from gpucli.errors import UsageError
    from gpucli.run import records as runs
    from gpucli.run.forward import open_local_port, parse_spec
    from gpucli.run.targets import open_host
    from gpucli.run.tensorboard import PortForward, transport_of

    spec = parse_spec(ports)
    record = runs.resolve(run, on_bad=render.warn)
    if record.ssh is None:
        raise UsageError(f"run {record.name} has no SSH endpoint" + (": it runs on this machine, where port "
                         f"{spec.remote_port} is already local" if record.provider == "local" else ""))
    open_local_port(spec.local_port)
    with open_host(record) as host, PortForward(transport_of(host), spec.remote_port,
                                                local_port=spec.local_port) as fwd:
        url = f"http://127.0.0.1:{fwd.port}/"
        if json_:  # one line, as soon as the tunnel is up (a script reads it and goes on)
            import json

            render.line(json.dumps({"run": record.name, "remote_port": spec.remote_port, "local_port": fwd.port,
                                    "url": url}))
        else:
            render.info(f"{record.name}: port {spec.remote_port} on the host is 127.0.0.1:{fwd.port} here "
                        f"({url}); Ctrl-C ends it")
        fwd.wait()
    raise UsageError(f"the SSH connection to {record.name} dropped; the forward ended",
                     hint="run the command again")


def register(app: typer.Typer) -> None:
    app.command("ssh-config")(ssh_config)
    app.command("forward")(forward)
