"""`gpucli calibrate RUN`: add a finished run's measured speed to the planner's calibration."""

from __future__ import annotations

import typer

from gpucli.cli.complete import run_names


def calibrate(run: str = typer.Argument(None, metavar="[RUN]", help="Run name (default: the newest run).",
                         autocompletion=run_names),
              json_: bool = typer.Option(False, "--json", help="Print the entry as JSON.")) -> None:
    """Measure a run's tokens/s and MFU from its metrics and add them to GPUCLI_HOME/calibration.yaml."""
    import json

    import yaml

    from gpucli.cli import render
    from gpucli.errors import TransferError
    from gpucli.providers.registry import open_host
    from gpucli.run.files.checkpoints import list_checkpoints
    from gpucli.run.host.calibrate import append_entry, entry_from_run
    from gpucli.run.watch.monitor import read_all_rows
    from gpucli.runs import records as runs
    from gpucli.settings import home

    record = runs.resolve(run)
    with open_host(record) as host:
        rows = read_all_rows(host, record.workdir)
        cks = list_checkpoints(host, record.workdir)
        try:
            config = yaml.safe_load(host.read_file(f"{record.workdir}/run.yaml")) or {}
        except TransferError:
            config = {}
    entry = entry_from_run(record, rows, cks[-1].meta if cks else None, config)
    path = home() / "calibration.yaml"
    append_entry(path, entry)
    if json_:
        render.json_out(entry)
    else:
        render.info(f"added to {path}: {json.dumps(entry)}")


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
