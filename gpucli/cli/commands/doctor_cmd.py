"""`gpucli doctor [--provider P]`: read-only checks before the first real launch. Spends nothing."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    provider: list[str] = typer.Option(None, "--provider", "-p",
                                       help="Check only this provider (repeatable); default: all."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which API key is used and from where, whether the API answers (no network / key refused /
    provider down), the balance, gpucli's SSH key and whether the account has it, and the Telegram
    token. Creates, rents and registers nothing."""
    import os

    from gpucli.cli import render, render_doctor
    from gpucli.errors import ExitCode, UnknownNameError
    from gpucli.providers.clients import ALIASES, REGISTRY, provider_names
    from gpucli.providers.doctor import DoctorReport, check_provider, check_telegram
    from gpucli.settings import home, load_keys

    names = []
    for name in provider or provider_names():
        key = ALIASES.get(name.lower(), name.lower())
        if key not in REGISTRY:
            raise UnknownNameError("provider", name, REGISTRY)
        names.append(key)
    key_path = home() / "id_ed25519.pub"  # where gpucli's own key lives (never created here)
    try:
        public_key = key_path.read_text().strip() or None
    except OSError:
        public_key = None
    reports = [check_provider(n, public_key=public_key, key_path=str(key_path)) for n in names]
    token, source = os.environ.get("TELEGRAM_BOT_TOKEN", "").strip(), "env TELEGRAM_BOT_TOKEN"
    if not token:
        token, source = load_keys().get("telegram", "").strip(), "keys.json"
    base = (os.environ.get("TELEGRAM_API_BASE") or "https://api.telegram.org").strip().rstrip("/")
    reports.append(DoctorReport("notifications", (check_telegram(token or None, source, base),)))
    if json_:
        render.json_out(reports)
    else:
        render_doctor.doctor_reports(reports)
    if any(r.failed for r in reports):
        raise typer.Exit(int(ExitCode.PROVIDER))
