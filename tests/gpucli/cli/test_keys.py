"""`gpucli keys set|list|path`: 0600 file, values never printed, the environment wins."""

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from gpucli import settings
from gpucli.cli import render
from gpucli.providers.credentials import resolve_key

ROOT = Path(__file__).resolve().parents[3]
SECRET = "placeholder-runpod-key-for-tests-abcd"  # not a real key; the last 4 are what masking shows


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_set_with_value_writes_0600_and_never_prints_it(run, isolated_home):
    code, out, err = run("keys", "set", "runpod", SECRET)
    assert code == 0, err
    path = isolated_home / "keys.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(path.read_text()) == {"runpod": SECRET}
    assert SECRET not in out + err and "****abcd" in err
    assert resolve_key("runpod").value == SECRET and resolve_key("runpod").source == "keys.json"


def test_set_reads_stdin_when_not_a_tty(run, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("vast-key-from-a-pipe-5678\n"))
    code, out, err = run("keys", "set", "vast")
    assert code == 0, err
    assert settings.load_keys()["vast"] == "vast-key-from-a-pipe-5678"
    assert "vast-key-from-a-pipe" not in out + err


def test_set_prompts_hidden_on_a_tty(run, monkeypatch):
    asked = []
    monkeypatch.setattr(sys, "stdin", _Tty(""))
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or "123456:tg-bot-token-xyz9")
    code, _, err = run("keys", "set", "telegram")
    assert code == 0, err
    assert asked == ["Telegram bot token: "]
    assert settings.load_keys()["telegram"] == "123456:tg-bot-token-xyz9"


def test_telegram_chat_and_bad_values(run, monkeypatch):
    assert run("keys", "set", "telegram-chat", "-1001234567890")[0] == 0
    assert run("keys", "set", "TELEGRAM_CHAT", "@my_channel")[0] == 0
    assert settings.load_keys()["telegram-chat"] == "@my_channel"
    code, _, err = run("keys", "set", "telegram-chat", "not a chat")
    assert code == 2 and "chat id" in err
    code, _, err = run("keys", "set", "runpod", "--json")
    assert code == 2 and "looks like an option" in err
    code, _, err = run("keys", "set", "aws", "x")
    assert code == 2 and "unknown key 'aws'" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO("   \n"))
    code, _, err = run("keys", "set", "runpod")
    assert code == 2 and "no value given" in err
    assert "runpod" not in settings.load_keys()


def test_list_shows_sources_never_values(run, monkeypatch, fresh_state):
    home = fresh_state
    (home / ".runpod").mkdir()
    (home / ".runpod" / "config.toml").write_text(f'[default]\napi_key = "{SECRET}"\n')
    settings.save_key("vast", "vast-stored-value-0000")
    settings.save_key("telegram", "tg-stored-token-value-1111")
    monkeypatch.setenv("VAST_API_KEY", "vast-env-value-2222")
    monkeypatch.setenv("TELEGRAM_CHAT_ID", "42")
    code, out, err = run("keys", "list")
    assert code == 0, err
    for value in (SECRET, "vast-stored-value", "vast-env-value", "tg-stored-token-value"):
        assert value not in out + err
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip() and ln.split()[0] in
             ("runpod", "vast", "telegram", "telegram-chat")}
    assert "~/.runpod/config.toml" in lines["runpod"] and "****abcd" in lines["runpod"]
    assert "env VAST_API_KEY" in lines["vast"] and "keys.json" in lines["vast"] and "****2222" in lines["vast"]
    assert "keys.json" in lines["telegram"] and "****1111" in lines["telegram"]
    assert "env TELEGRAM_CHAT_ID" in lines["telegram-chat"]

    render.reset_consoles()
    code, out, _ = run("keys", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["vast"]["source"] == "env VAST_API_KEY" and rows["vast"]["shadowed"] == ["keys.json"]
    assert rows["runpod"]["source"] == "~/.runpod/config.toml"
    assert rows["telegram-chat"]["masked"] == "****"  # short values show nothing of themselves
    assert SECRET not in out


def test_env_var_wins_and_set_says_so(run, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-env-value-9999")
    code, _, err = run("keys", "set", "runpod", SECRET)
    assert code == 0 and "RUNPOD_API_KEY is set" in err and "takes precedence" in err
    assert resolve_key("runpod").value == "rp-env-value-9999"
    monkeypatch.delenv("RUNPOD_API_KEY")
    assert resolve_key("runpod").value == SECRET


def test_path(run, isolated_home):
    code, out, err = run("keys", "path")
    assert code == 0 and out == f"{isolated_home / 'keys.json'}\n" and err == ""


def test_stored_key_is_used_by_offers(run, vast_emulator, monkeypatch):
    monkeypatch.delenv("VAST_API_KEY")
    assert run("offers", "--provider", "vast")[0] == 4
    assert run("keys", "set", "vast", vast_emulator.api_key)[0] == 0
    code, out, err = run("offers", "--provider", "vast", "--json")
    assert code == 0, err and json.loads(out)["offers"]


def test_real_process_pipe(isolated_home):
    proc = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "keys", "set", "vast"], input=SECRET + "\n",
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert stat.S_IMODE(os.stat(isolated_home / "keys.json").st_mode) == 0o600
    proc = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "keys", "list"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "****abcd" in proc.stdout and SECRET not in proc.stdout
