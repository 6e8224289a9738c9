"""``gpucli serve RUN --on-pod``: the OpenAI-compatible server started on the run's host, next to the
checkpoint, bound to 127.0.0.1 there and reached through the run's SSH connection
(:class:`gpucli.run.files.tensorboard.PortForward`), as ``gpucli tensorboard`` does.

Engines: ``own`` (``python -m trainer.serve`` on the run's best checkpoint: every architecture the
trainer builds) or ``vllm`` (vLLM's OpenAI server on the Hugging Face export that ``trainer.export``
makes first; only where vLLM is installed on the host, and only for an exportable architecture).

Nothing here prints: the command layer renders the events.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucli.errors import NotFoundError, RemoteCommandError
from gpucli.run.files.export import export_run
from gpucli.run.files.tensorboard import _bind_probe

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

ENGINES = ("own", "vllm")
REMOTE_PORT = 8000
READY_TIMEOUT_S = 900.0  # vLLM loads and compiles for minutes; the own engine answers in seconds


@dataclass(frozen=True)
class RemoteServer:
    pid: int
    port: int  # on the host, 127.0.0.1
    engine: str
    log_path: str


def server_argv(record: RunRecord, engine: str, port: int) -> list[str]:
    wd = record.workdir
    if engine == "vllm":
        return [record.python, "-m", "vllm.entrypoints.openai.api_server", "--model", f"{wd}/export",
                "--served-model-name", record.name, "--host", "127.0.0.1", "--port", str(port)]
    return [record.python, "-m", "trainer.serve", "--checkpoint", f"{wd}/checkpoints", "--host", "127.0.0.1",
            "--port", str(port), "--model-name", record.name]


def start_remote_server(host: Host, record: RunRecord, *, engine: str = "own",
                        on_event: Callable[[str], None] = lambda m: None) -> RemoteServer:
    """Start the server on the host (detached, its output in ``serve.log`` of the run's folder) on
    port 8000 when free there, else any free one. vLLM: checked for, then the export made first."""
    if engine not in ENGINES:
        raise NotFoundError(f"no serving engine '{engine}'", hint=f"one of {', '.join(ENGINES)}")
    py = shlex.quote(record.python)
    if engine == "vllm":
        if host.run(f"{py} -c 'import vllm'", timeout_s=120, check=False).exit_code != 0:
            raise NotFoundError("vLLM is not installed on the run's host",
                                hint=f"install it there ({record.python} -m pip install vllm) or use the own engine")

        on_event("exporting the best checkpoint for vLLM (Hugging Face layout)")
        export_run(host, record, dest=None, on_event=on_event)
    if host.run(_bind_probe(record.python, REMOTE_PORT), timeout_s=30, check=False).exit_code == 0:
        port = REMOTE_PORT
    else:
        port = int(host.run(_bind_probe(record.python, 0), timeout_s=30).stdout)
    log_path = f"{record.workdir}/serve.log"
    pid = host.start_detached(shlex.join(server_argv(record, engine, port)), cwd=f"{record.workdir}/code",
                              log_path=log_path)
    on_event(f"started the {engine} server on the host (pid {pid}, port {port}, log {log_path})")
    return RemoteServer(pid, port, engine, log_path)


def server_failed(host: Host, server: RemoteServer, why: Exception) -> RemoteCommandError:
    """The error to raise when the server never answered: its log's last line."""
    try:
        tail = host.read_file(server.log_path).decode(errors="replace").strip().splitlines()[-1:]
    except Exception:  # noqa: BLE001 - the log is a hint; the error stands without it
        tail = []
    return RemoteCommandError(f"{why}: {tail[0] if tail else 'no output'} (log on the host: {server.log_path})")


def stop_remote_server(host: Host, server: RemoteServer) -> None:
    """End the server's process group (it holds the model in GPU memory)."""
    host.run(f"kill -TERM -- -{int(server.pid)} 2>/dev/null || true", timeout_s=30, check=False)
