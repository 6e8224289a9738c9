"""`gpucli notify test`: send a test message with the Telegram token and chat id runs would use;
`gpucli notify events`: the alert vocabulary (trainer/spec/alerts.py) runs send."""

from __future__ import annotations

import typer

notify_app = typer.Typer(help="Telegram alerts: a test message, and the events runs send.",
                         no_args_is_help=True)


@notify_app.command("test")
def notify_test(
    message: str = typer.Option("gpucli test message: Telegram alerts work.", "--message", "-m",
                                help="Text to send."),
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, help="Seconds to wait for Telegram."),
    webhook: bool = typer.Option(False, "--webhook", help="Send it to your webhook (Slack, Discord, ntfy: "
                                 "`gpucli keys set webhook URL`) instead of Telegram."),
) -> None:
    """Send a test message to your Telegram chat (token: `gpucli keys set telegram` or TELEGRAM_BOT_TOKEN;
    chat: `gpucli keys set telegram-chat` or TELEGRAM_CHAT_ID)."""
    from gpucli.cli import render

    if webhook:
        from gpucli.runs import webhook as hook

        where = hook.resolve_target()
        status = hook.send(where, message.replace("Telegram alerts work", "webhook alerts work"), timeout_s=timeout)
        render.info(f"sent to the {where.kind} webhook from {where.source} (HTTP {status})")
        return
    from gpucli.runs.notify import resolve_target, send_message

    target = resolve_target()
    sent = send_message(target, message, timeout_s=timeout)
    render.notify_sent(sent, target.token_source)


@notify_app.command("events")
def notify_events(json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """The events a run can alert on (the trainer's and your own code's alike), with what raises each."""
    from gpucli.cli import render
    from trainer.spec.alerts import ALERTS

    render.alert_events(ALERTS, json_=json_)


def register(app: typer.Typer) -> None:
    app.add_typer(notify_app, name="notify")
