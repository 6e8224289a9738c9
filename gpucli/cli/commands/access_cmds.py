"""Reaching a run's machine from your own tools: ssh (a shell there), sync (more data), ssh-config (ssh, scp, VS Code by name), forward (any
port), logs (the job's raw console output)."""

from __future__ import annotations

from pathlib import Path

import typer

from gpucli.cli.complete import run_names

RUN_ARG = typer.Argument(None, metavar="[RUN]", help="Run name (default: the newest run).",
                         autocompletion=run_names)


def ssh_config(
    run: str = RUN_ARG,
    remove: bool = typer.Option(False, "--remove", help="Remove the run's entry instead."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write a `Host gpucli-RUN` entry (host key pinned) into a file ~/.ssh/config includes, so `ssh
    gpucli-RUN`, scp and VS Code Remote-SSH reach the pod by name. `gpucli down` removes it."""
    from gpucli.cli import render
    from gpucli.providers.registry import get_target
    from gpucli.runs import records as runs
    from gpucli.runs import sshconfig

    record = runs.resolve(run, on_bad=render.warn)
    if remove:
        gone = sshconfig.remove_entry(record.name)
        if json_:
            render.json_out({"run": record.name, "host": sshconfig.alias(record.name), "removed": gone})
        else:
            render.info(f"removed {sshconfig.alias(record.name)}" if gone else f"no entry for {record.name}")
        return
    entry = sshconfig.write_entry(record, here=get_target(record.provider).caps.this_machine)
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
    run: str = typer.Argument(..., help="Run name.", autocompletion=run_names),
    ports: str = typer.Argument(..., metavar="PORT[:LOCAL]", help="The port on the run's host, and the local "
                                "one (default: the same; 0: any free one)."),
    json_: bool = typer.Option(False, "--json", help="Print the local URL as JSON when the tunnel is up."),
) -> None:
    """Forward a port of the run's host to this machine over the run's SSH (Ctrl-C ends it)."""
    from gpucli.cli import render
    from gpucli.errors import UsageError
    from gpucli.providers.registry import get_target, open_host
    from gpucli.run.files.tensorboard import PortForward, transport_of
    from gpucli.run.host.forward import open_local_port, parse_spec
    from gpucli.runs import records as runs

    spec = parse_spec(ports)
    record = runs.resolve(run, on_bad=render.warn)
    if record.ssh is None:
        raise UsageError(f"run {record.name} has no SSH endpoint" + (": it runs on this machine, where port "
                         f"{spec.remote_port} is already local" if get_target(record.provider).caps.this_machine else ""))
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


def logs(
    run: str = RUN_ARG,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends "
                                "(resumes at the same byte after a dropped connection)."),
    since: str = typer.Option(None, "--since", metavar="T", help="Only lines from T on: a duration (30s, 10m, "
                              "2h, 1d, by the pod's clock) or a time (2026-01-31T14:00, UTC), by the lines' "
                              "own timestamps."),
    node: int = typer.Option(0, "--node", min=0, metavar="R", help="Node R of a run over several machines "
                             "(default 0)."),
    timestamps: bool = typer.Option(False, "--timestamps", "-t", help="Prefix each line with the pod's clock "
                                    "when it was read."),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between reads when following."),
    exec_id: str = typer.Option(None, "--exec", metavar="ID", help="The output of `gpucli exec --detach` ID "
                                "instead of the job's."),
) -> None:
    """The job's raw console output (console.log): everything it printed, with the pod's clock."""
    from gpucli.cli import render
    from gpucli.cli import render_logs as show
    from gpucli.providers.registry import open_host
    from gpucli.run.watch import logs as core
    from gpucli.runs import records as runs

    record = core.for_node(runs.resolve(run, on_bad=render.warn), node)
    path = f"{record.workdir}/{core.FILE}"
    if exec_id is not None:
        from gpucli.run.host import execjob

        path = execjob.exec_log(record, exec_id)
    where = f"{record.ssh.host}" if record.ssh else "this machine"
    with open_host(record) as host:
        first = core.read_chunk(host, path, 0, max_bytes=1)
        show.header(record.name, where, first.pod_time, first.size)
        since_filter = core.SinceFilter(core.parse_since(since, first.pod_time)) if since else None
        offset = 0 if since_filter else (core.start_offset(host, path) if first.size > 0 else 0)
        while not follow and first.size >= 0:  # what is there now, in bounded chunks
            chunk = core.read_chunk(host, path, offset)
            batch = since_filter.feed(chunk.lines) if since_filter else list(chunk.lines)
            show.lines(batch, pod_time=chunk.pod_time if timestamps else None)
            if chunk.offset == offset or chunk.offset >= chunk.size:
                break
            offset = chunk.offset
    if not follow and since_filter is not None and not since_filter.stamped:
        show.lines(since_filter.flush())
        render.warn("no line of this log carries a timestamp: --since could not filter it")
    if not follow:
        return
    for chunk in core.follow(lambda: open_host(record), record, offset, poll_s=poll, on_reconnect=render.warn,
                             path=path):
        if chunk.restarted:
            show.restarted(record.name)
        batch = since_filter.feed(chunk.lines) if since_filter else list(chunk.lines)
        show.lines(batch, pod_time=chunk.pod_time if timestamps else None)
    if since_filter is not None:
        show.lines(since_filter.flush())


def sync(run: str = typer.Argument(..., help="Run name.", autocompletion=run_names),
         paths: list[Path] = typer.Argument(..., help="Files or folders to push into the run's data/."),
         json_: bool = typer.Option(False, "--json", help="One JSON line per path sent.")) -> None:
    """Push more data to a running pod (incremental; resumable)."""
    from gpucli.cli import render_runs as render
    from gpucli.run.oversee.control import sync_paths

    if json_:
        from gpucli.cli import render_json

        sync_paths(run, paths, on_synced=render_json.synced)
        return
    sync_paths(run, paths, on_synced=render.synced)


def ssh(run: str = RUN_ARG) -> None:
    """An interactive shell on the run's pod (in its folder)."""
    import os

    from gpucli.cli import render_runs as render
    from gpucli.providers.registry import get_target
    from gpucli.runs import records as runs

    record = runs.resolve(run, on_bad=render.warn)
    argv, cwd = get_target(record.provider).interactive_shell(record)
    if cwd is not None:
        os.chdir(cwd)
    os.execvp(argv[0], argv)


def register(app: typer.Typer) -> None:
    app.command("logs")(logs)
    app.command("ssh-config")(ssh_config)
    app.command("forward")(forward)
