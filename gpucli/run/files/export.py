"""``gpucli export``: a run's best checkpoint in the Hugging Face layout, made where the checkpoint is
(``python -m trainer.export`` on the pod, so gigabytes of weights never cross the link twice) and then
downloaded, or uploaded from there to the Hub with ``--push``.

The Hub token (``gpucli keys set hf``, ``$HF_TOKEN``, or the file ``hf auth login`` writes) reaches the
pod only inside a 0600 env file that the export command sources, never on a command line; the file is
removed when the command ends. ``$HF_ENDPOINT`` (a Hub mirror) travels with it.

Nothing here prints: the command layer renders the events and the result.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, NotFoundError, UsageError
from gpucli.settings import lookup_key

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

EXPORT_DIR = "export"  # in the run's folder on the host
HUB_ENV = ".hub.env"
TIMEOUT_S = 3 * 3600.0  # a 7B export and upload; the deadline every remote wait needs


class ExportError(GpucliError):
    """The trainer refused or failed the export; its one-line reason."""


@dataclass(frozen=True)
class ExportResult:
    remote_dir: str
    local_dir: Path | None  # None when pushed (nothing downloaded)
    files: tuple[str, ...]
    bytes: int
    summary: str  # the trainer's line: architecture, parameters, time
    pushed_url: str | None

    @property
    def architecture(self) -> str | None:
        """The transformers class of the export (``GPT2LMHeadModel``...), from the trainer's line."""
        words = self.summary.split()
        return words[1] if len(words) > 1 and words[0] == "exported" else None


def hub_token() -> tuple[str, str] | None:
    """``(token, where from)``: gpucli keys / $HF_TOKEN, else huggingface_hub's login file."""
    found = lookup_key("hf")
    if found:
        return found
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    path = Path(os.environ.get("HF_TOKEN_PATH") or home / "token")
    try:
        token = path.read_text().strip()
    except OSError:
        return None
    return (token, str(path)) if token else None


def check_repo(repo: str) -> None:
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(c.isspace() for c in repo):
        raise UsageError(f"--push {repo}: the Hub repository is ORG/NAME")


def export_command(record: RunRecord, *, push: str | None, private: bool, env_file: str | None) -> str:
    """The host command: into the run's code folder, the env file sourced (push), the trainer's export."""
    wd = record.workdir
    argv = [record.python, "-m", "trainer.export", f"{wd}/checkpoints", f"{wd}/{EXPORT_DIR}"]
    if push:
        argv += ["--push", push] + (["--private"] if private else [])
    source = f"set -a && . {shlex.quote(env_file)} && set +a && " if env_file else ""
    return f"cd {shlex.quote(wd + '/code')} && {source}{shlex.join(argv)}"


def export_run(host: Host, record: RunRecord, *, dest: Path | None, push: str | None = None,
               private: bool = False, on_event: Callable[[str], None] = lambda m: None,
               progress: Any = None) -> ExportResult:
    """Export on the host; then download the folder to ``dest / RUN-hf`` or, with ``push``, upload it."""
    wd = record.workdir
    env_file = None
    if push:
        check_repo(push)
        token = hub_token()
        if token is None:
            raise NotFoundError("no Hugging Face token to push with",
                                hint="gpucli keys set hf, $HF_TOKEN, or `hf auth login`")
        env = {"HF_TOKEN": token[0]}
        if os.environ.get("HF_ENDPOINT"):
            env["HF_ENDPOINT"] = os.environ["HF_ENDPOINT"]
        env_file = f"{wd}/{HUB_ENV}"
        host.write_env_file(env_file, env)
        on_event(f"Hub token from {token[1]} (in a 0600 file on the host for this command only)")
    on_event("exporting on the host" + (f" and pushing to {push}" if push else ""))
    try:
        res = host.run(export_command(record, push=push, private=private, env_file=env_file), timeout_s=TIMEOUT_S,
                       check=False)
    finally:
        if env_file:
            host.run(f"rm -f {shlex.quote(env_file)}", timeout_s=60, check=False)
    lines = res.stdout.strip().splitlines()
    if res.exit_code != 0:
        why = (res.stderr.strip() or res.stdout.strip() or f"exit code {res.exit_code}").splitlines()[-1]
        raise ExportError(f"export of run {record.name} failed: {why.removeprefix('error: ')}")
    pushed = next((ln.split(" ", 2)[-1] for ln in lines if ln.startswith("pushed to ")), None)
    summary = next((ln for ln in lines if ln.startswith("exported ")), "")
    remote = f"{wd}/{EXPORT_DIR}"
    listing = host.list_files(remote)
    files = tuple(sorted(n for n in listing if "/" not in n))
    if push or dest is None:
        return ExportResult(remote, None, files, sum(listing[n].size for n in files), summary, pushed)
    target = Path(dest) / f"{record.name}-hf"
    tmp = target.with_name(f".tmp_{target.name}")
    tmp.mkdir(parents=True, exist_ok=True)
    got = host.download_files([(posixpath.join(remote, n), tmp / n, None) for n in files], progress=progress)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return ExportResult(remote, target, files, sum(g.bytes_total for g in got), summary, None)
