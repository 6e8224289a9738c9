"""Printing for `gpucli doctor`: one table per provider (and one for notifications)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpucli.cli.render import out, table

if TYPE_CHECKING:
    from gpucli.providers.doctor import DoctorReport

_MARK = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]", "info": "[dim]info[/]"}


def doctor_reports(reports: Sequence[DoctorReport]) -> None:
    """Each report as a table of check / status / detail; the details never hold a key."""
    from rich.markup import escape

    for report in reports:
        t = table(report.subject)
        for col in ("check", "status", "detail"):
            t.add_column(col)
        for c in report.checks:
            t.add_row(c.subject, _MARK.get(c.status, c.status), escape(c.detail))
        out().print(t)
