"""gpucli export: a run's best checkpoint in the Hugging Face layout, made on its host; downloaded
here, or pushed from the host to the Hub."""

from __future__ import annotations

from pathlib import Path

import typer


def export(
    run: str = typer.Argument(None, metavar="[RUN]", help="Run name (default: the newest run)."),
    dest: Path = typer.Option(Path("exports"), "--dest", help="Where the export is downloaded (DEST/RUN-hf)."),
    push: str = typer.Option(None, "--push", metavar="ORG/NAME", help="Upload to this Hub repository from the host."),
    private: bool = typer.Option(False, "--private", help="Create the Hub repository private."),
    from_store: bool = typer.Option(False, "--from-store", help="Take the best checkpoint from the run's checkpoint "
                                    "store and export it here (the default once the pod cannot be reached)."),
    json_: bool = typer.Option(False, "--json", help="Print the export's folder, architecture, files (or the "
                               "pushed URL) as JSON."),
) -> None:
    """Export a run's best weights as model.safetensors + config.json + tokenizer (transformers loads it)."""
    from gpucli.cli import render_json, render_runs
    from gpucli.cli import render_serve as render
    from gpucli.providers.registry import open_host
    from gpucli.run.files import export as core
    from gpucli.runs import records as runs

    if push:
        core.check_repo(push)
    from gpucli.errors import GpucliError
    from gpucli.run.files import store

    record = runs.resolve(run)
    if not from_store:
        try:
            with open_host(record) as host, render_runs.transfer_progress("downloading") as progress:
                result = core.export_run(host, record, dest=dest, push=push, private=private, on_event=render.info,
                                         progress=progress)
            (render_json if json_ else render).exported(result)
            return
        except GpucliError as exc:
            if store.run_store(record) is None:
                raise
            render_runs.warn(f"the pod cannot be reached ({exc.message}): exporting the store's best checkpoint here")
    result = store.export_from_store(record, dest, push=push, private=private, on_event=render.info)
    (render_json if json_ else render).exported(result)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
