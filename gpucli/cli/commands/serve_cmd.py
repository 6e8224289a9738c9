"""gpucli serve: an OpenAI-compatible API on this machine for a checkpoint or a run's best one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def serve(
    source: str = typer.Argument(None, metavar="[RUN | CHECKPOINT]",
                                 help="A checkpoint folder, or a run name (default: the newest run)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Local port (default 8000)."),
    dest: Path = typer.Option(None, "--dest",
                              help="Where a run's best checkpoint is downloaded (default: a cache in "
                                   "gpucli's data folder, GPUCLI_HOME/serve/checkpoints)."),
    on_pod: bool = typer.Option(False, "--on-pod", help="Serve on the run's host, tunnelled over its SSH."),
    engine: str = typer.Option("own", "--engine", metavar="own|vllm",
                               help="With --on-pod: the trainer's engine (default) or vLLM on the export."),
    json_: bool = typer.Option(False, "--json", help="Print the URL as one JSON line once the API answers."),
) -> None:
    """Serve a checkpoint (or a run's best) as an OpenAI-compatible API on localhost."""
    from gpucli.cli import render_serve as render
    from gpucli.run.files import tensorboard as core
    from gpucli.settings import home

    if on_pod:
        _serve_on_pod(source, port, engine, json_)
        return
    if engine != "own":
        from gpucli.errors import UsageError

        raise UsageError("--engine vllm serves on the run's host: add --on-pod")

    if source is not None and core.is_checkpoint(Path(source).expanduser()):
        checkpoint = Path(source).expanduser().resolve()
    else:
        from gpucli.cli import render_runs
        from gpucli.providers.registry import open_host
        from gpucli.run.starting.jobs import fetch_best
        from gpucli.runs import records as runs

        record = runs.resolve(source)
        # Not ./checkpoints of wherever the user stands (a git checkout would get untracked files):
        # gpucli's own folder, one cache for every run served.
        if dest is None:
            dest = home() / "serve" / "checkpoints"
        with open_host(record) as host, render_runs.transfer_progress("downloading") as progress:
            fetched = fetch_best(host, record, dest, progress=progress, on_event=render.info)
        checkpoint = fetched.dest.resolve()
    log_path = home() / "serve" / f"{checkpoint.name}.log"
    render.info(f"loading {checkpoint} ...")
    served = core.start_server(checkpoint, port=port, log_path=log_path)
    try:
        if json_:
            from gpucli.cli import render_json

            render_json.serving(served.url, checkpoint=checkpoint, engine="own", log=log_path)
        else:
            render.serving(served.url, checkpoint, log_path)
        served.process.wait()
    finally:
        core.stop_server(served.process)


def _serve_on_pod(run: str | None, port: int, engine: str, json_: bool = False) -> None:
    from gpucli.cli import render_serve as render
    from gpucli.providers.registry import get_target, open_host
    from gpucli.run.files import podserve
    from gpucli.run.files import tensorboard as core
    from gpucli.runs import records as runs

    record = runs.resolve(run)
    with open_host(record) as host:
        server = podserve.start_remote_server(host, record, engine=engine, on_event=render.info)
        try:
            if get_target(record.provider).caps.this_machine:  # nothing to tunnel
                _ready_then_wait(host, server, f"http://127.0.0.1:{server.port}/v1", record.name, None, json_)
            else:
                with core.PortForward(core.transport_of(host), server.port, local_port=port) as fwd:
                    _ready_then_wait(host, server, f"http://127.0.0.1:{fwd.port}/v1", record.name, fwd, json_)
        finally:
            podserve.stop_remote_server(host, server)


def _ready_then_wait(host: Any, server: Any, url: str, run: str, fwd: Any, json_: bool = False) -> None:
    import time

    from gpucli.cli import render_serve as render
    from gpucli.run.files import podserve
    from gpucli.run.files import tensorboard as core

    try:
        core.url_ready(f"{url}/models", podserve.READY_TIMEOUT_S, what=f"the {server.engine} server on the host",
                       alive=lambda: host.is_running(server.pid))
    except Exception as e:  # noqa: BLE001 - re-raised with the server's own last words
        raise podserve.server_failed(host, server, e) from None
    if json_:
        from gpucli.cli import render_json

        render_json.serving(url, run=run, engine=server.engine, on="host")
    else:
        render.serving_remote(url, run, server.engine)
    if fwd is not None:
        fwd.wait()
        return
    while host.is_running(server.pid):
        time.sleep(1)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
