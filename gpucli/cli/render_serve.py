"""The presentation of ``gpucli serve`` and ``gpucli tensorboard``: part of render."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucli.cli.render import info, line, out

if TYPE_CHECKING:
    from pathlib import Path

    from gpucli.run.files.export import ExportResult

__all__ = ["exported", "info", "serving", "serving_remote", "tensorboard_ready"]


def serving(url: str, checkpoint: Path, log_path: Path) -> None:
    """The API's address on stdout (one plain line), then how to use it."""
    line(url)
    model = checkpoint.name
    out().print(
        f"serving {checkpoint} (model '{model}'), log {log_path}\n"
        f"  try it:      curl {url}/completions -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{model}\", \"prompt\": \"def \", \"max_tokens\": 40}}'\n"
        f"  openai:      OpenAI(base_url=\"{url}\", api_key=\"none\")\n"
        f"  eval prompts: python -m trainer.sample --checkpoint {checkpoint} --prompts-file PROMPTS.txt\n"
        "Ctrl-C stops the server.", highlight=False, soft_wrap=True)


def serving_remote(url: str, run: str, engine: str) -> None:
    """The tunnelled API's address on stdout (one plain line), then how to use it."""
    line(url)
    out().print(f"serving run {run} on its host ({engine} engine), tunnelled over SSH\n"
                f"  openai:      OpenAI(base_url=\"{url}\", api_key=\"none\"), model \"{run}\"\n"
                "Ctrl-C stops the server on the host.", highlight=False, soft_wrap=True)


def tensorboard_ready(url: str, where: str) -> None:
    line(url)
    out().print(f"TensorBoard for {where}; Ctrl-C stops it.", highlight=False, soft_wrap=True)


def exported(r: ExportResult) -> None:
    """Where the export is: the Hub URL (pushed) or the local folder, on stdout's first line."""
    line(r.pushed_url or str(r.local_dir or r.remote_dir))
    where = "pushed from the host" if r.pushed_url else (f"downloaded ({r.bytes / 1e6:,.1f} MB)" if r.local_dir
                                                         else f"on the host at {r.remote_dir}")
    out().print(f"{r.summary}; {where}: {', '.join(r.files)}\n"
                "  load it:  transformers.AutoModelForCausalLM.from_pretrained(...), AutoTokenizer.from_pretrained(...)",
                highlight=False, soft_wrap=True)
