"""gpucli serve: an OpenAI-compatible API on this machine for a checkpoint or a run's best one."""

from __future__ import annotations

from pathlib import Path

import typer


def serve(
    source: str = typer.Argument(None, metavar="[RUN | CHECKPOINT]",
                                 help="A checkpoint folder, or a run name (default: the newest run)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Local port (default 8000)."),
    dest: Path = typer.Option(Path("checkpoints"), "--dest", help="Where a run's best checkpoint is downloaded."),
) -> None:
    """Serve a checkpoint (or a run's best) as an OpenAI-compatible API on localhost."""
    from gpucli.cli import render_serve as render
    from gpucli.run import tensorboard as core
    from gpucli.settings import home

    if source is not None and core.is_checkpoint(Path(source).expanduser()):
        checkpoint = Path(source).expanduser().resolve()
    else:
        from gpucli.cli import render_runs
        from gpucli.run import records as runs
        from gpucli.run.jobs import fetch_best
        from gpucli.run.targets import open_host

        record = runs.resolve(source)
        with open_host(record) as host, render_runs.transfer_progress("downloading") as progress:
            fetched = fetch_best(host, record, dest, progress=progress, on_event=render.info)
        checkpoint = fetched.dest.resolve()
    log_path = home() / "serve" / f"{checkpoint.name}.log"
    render.info(f"loading {checkpoint} ...")
    served = core.start_server(checkpoint, port=port, log_path=log_path)
    try:
        render.serving(served.url, checkpoint, log_path)
        served.process.wait()
    finally:
        core.stop_server(served.process)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
