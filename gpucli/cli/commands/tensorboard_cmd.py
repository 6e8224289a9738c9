"""gpucli tensorboard: a run's TensorBoard on a local port (over the run's SSH connection for a pod)."""

from __future__ import annotations

import typer

from gpucli.cli.complete import run_names


def tensorboard(
    run: str = typer.Argument(None, metavar="[RUN]", help="Run name (default: the newest run).",
                         autocompletion=run_names),
    port: int = typer.Option(6006, "--port", min=0, max=65535, help="Local port (default 6006; 0: any free one)."),
    json_: bool = typer.Option(False, "--json", help="Print the URL as one JSON line once TensorBoard answers."),
    logdir: str = typer.Option(None, "--logdir", help="For your own code: the folder inside the code folder "
                               "with the event files (default: the whole code folder)."),
) -> None:
    """TensorBoard for a run on localhost: started on the pod and tunnelled over its SSH, or local."""
    import subprocess
    import sys
    from pathlib import Path

    from gpucli.cli import render_json
    from gpucli.cli import render_serve as render
    from gpucli.errors import NotFoundError
    from gpucli.providers.registry import get_target, open_host
    from gpucli.run.files import tensorboard as core
    from gpucli.run.files.harvest import mirror_root
    from gpucli.runs import records as runs

    record = runs.resolve(run)
    here = get_target(record.provider).caps.this_machine  # its folder is on this machine: no tunnel
    sub = core.run_logdir(record, logdir)  # "tb", or the code folder (or --logdir in it) for your own code
    local_dirs = [mirror_root(record.name) / "tb"] if sub == "tb" else []
    if here:
        local_dirs.insert(0, Path(record.workdir).expanduser() / sub)
    over = record.status in ("finished", "failed", "stopped")
    if not here and not (over and local_dirs and local_dirs[0].is_dir()):
        with open_host(record) as host:
            remote_port = core.ensure_remote_tensorboard(host, record, logdir=sub, on_event=render.info)
            with core.PortForward(core.transport_of(host), remote_port, local_port=port) as fwd:
                url = f"http://127.0.0.1:{fwd.port}/"
                core.url_ready(url, what="TensorBoard on the host")
                shown = render_json if json_ else render
                shown.tensorboard_ready(url, f"run {record.name} (on the host, tunnelled over SSH)")
                fwd.wait()
        return
    found = next((d for d in local_dirs if d.is_dir() and (sub == "tb" or any(d.rglob(core.EVENTS_PATTERN)))), None)
    if found is None:
        raise NotFoundError(f"no TensorBoard events for run {record.name} on this machine",
                            hint="the run writes them to its tb/ folder from the first logged step" if sub == "tb"
                            else "your code writes them (SummaryWriter, a TensorBoard logger) under its folder")
    port = port or core.free_local_port()
    proc = subprocess.Popen(core.tensorboard_argv(sys.executable, str(found), port),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/"
        core.url_ready(url, what="TensorBoard", alive=lambda: proc.poll() is None)
        (render_json if json_ else render).tensorboard_ready(url, f"run {record.name} ({found})")
        proc.wait()
    finally:
        core.stop_server(proc)  # type: ignore[arg-type]


def register(app: typer.Typer) -> None:
    app.command("tensorboard")(tensorboard)
