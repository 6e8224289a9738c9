"""Shell completion of run names (``gpucli --install-completion``; bash, zsh, fish). Called by the
shell on every Tab: quick, silent, and never an error (a broken record is left out)."""

from __future__ import annotations


def run_names(incomplete: str) -> list[str]:
    """The names of the runs on this machine that start with ``incomplete``, newest first."""
    try:
        from gpucli.runs.records import runs_dir

        paths = sorted(runs_dir().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except Exception:  # noqa: BLE001 - completion must never fail the shell
        return []
    return [p.stem for p in paths if p.stem.startswith(incomplete) and not p.stem.startswith(".")]
