"""Where a run's data comes from (``launch --data SPEC``), parsed once into a typed :class:`DataSource`.

- a local folder: synced to ``<run>/data/src`` (raw text, or a folder ``trainer.prepare`` already wrote);
- ``pod:/path``: already on the pod or on a mounted volume; nothing is uploaded, the path is checked
  before the trainer starts;
- ``https://host/file`` (optionally ``#sha256=HEX``), or a local text file listing URLs, one per line
  with an optional sha256 after it: downloaded on the pod (``gpucli/pod/fetch.py``), in parallel,
  resumable, verified;
- ``hf://datasets/ORG/NAME[/GLOB]``: downloaded on the pod with ``huggingface_hub``; ``HF_TOKEN`` (``gpucli
  keys set hf``) reaches the pod only through its 0600 env file.

Whatever the source, preparation (``python -m trainer.prepare``) runs on the pod with every core
before training, under the run's watchdog, so its time counts against ``--hours``/``--budget``.
:func:`pod_plan` is the JSON that fetch.py reads there.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gpucli.errors import GpucliError, UsageError
from gpucli.runs import podfiles
from gpucli.settings import lookup_key

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

KINDS = ("local", "pod", "url", "hf")
RAW_DIR = "data/src"  # in the run folder: synced or downloaded inputs
PREPARED_DIR = "data/prepared"  # in the run folder: what the trainer reads (a link into the volume's cache)
PROGRESS_FILE = "prepare.jsonl"  # in the run folder: download and preparation progress, JSON lines
PLAN_FILE = "datasource.json"  # in the run folder: what fetch.py does
CACHE_DIR = "gpucli-data"  # on a network volume: prepared data keyed by a content hash

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_HF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


@dataclass(frozen=True)
class Download:
    url: str
    sha256: str | None = None  # lower-case hex; None: not verified


@dataclass(frozen=True)
class DataSource:
    """One ``--data`` value, checked."""

    kind: str  # local | pod | url | hf
    spec: str  # as given (kept in the run record)
    local: Path | None = None  # kind local: the folder synced
    pod_path: str | None = None  # kind pod: the path on the pod
    downloads: tuple[Download, ...] = ()  # kind url
    repo: str | None = None  # kind hf: ORG/NAME of a dataset
    pattern: str | None = None  # kind hf: the files of the repo to fetch (a glob); None = all

    @property
    def uploads(self) -> bool:
        return self.kind == "local"

    @property
    def pod_input(self) -> str:
        """The raw inputs as the trainer and prepare see them from ``<run>/code``."""
        return self.pod_path if self.kind == "pod" and self.pod_path else f"../{RAW_DIR}"

    def describe(self) -> str:
        if self.kind == "local":
            return f"local folder {self.local}"
        if self.kind == "pod":
            return f"{self.pod_path} on the pod"
        if self.kind == "url":
            return f"{len(self.downloads)} URL(s), downloaded on the pod"
        return f"Hugging Face dataset {self.repo}" + (f" ({self.pattern})" if self.pattern else "")


def _download(url: str, sha: str | None, where: str) -> Download:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{where}: '{url}' is not an http(s) URL")
    if any(c.isspace() for c in url):
        raise UsageError(f"{where}: a URL cannot contain spaces")
    if sha is not None and not _SHA256.fullmatch(sha):
        raise UsageError(f"{where}: '{sha}' is not a sha256 (64 hex digits)")
    return Download(url, sha.lower() if sha else None)


def url_list(text: str, name: str) -> tuple[Download, ...]:
    """A URL list: one ``URL [SHA256]`` a line; blank lines and ``#`` comments are skipped."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) > 2:
            raise UsageError(f"--data {name} line {n}: expected 'URL [SHA256]', got {len(fields)} fields")
        out.append(_download(fields[0], fields[1] if len(fields) == 2 else None, f"--data {name} line {n}"))
    if not out:
        raise UsageError(f"--data {name}: no URLs in the file", hint="one 'URL [SHA256]' a line")
    if len({d.url for d in out}) != len(out):
        raise UsageError(f"--data {name}: a URL is listed twice")
    return tuple(out)


def parse_data(spec: str) -> DataSource:
    """``--data``'s value -> a DataSource, or a one-line UsageError."""
    text = spec.strip()
    if not text or "\0" in text or "\n" in text:
        raise UsageError("--data needs a folder, pod:/path, an https:// URL or hf://datasets/ORG/NAME")
    if text.startswith("pod:"):
        path = text[4:]
        if not path or not (path.startswith("/") or path.startswith("~")):
            raise UsageError(f"--data {text}: give the pod's absolute path, e.g. pod:/workspace/corpus")
        return DataSource("pod", text, pod_path=path.rstrip("/") or "/")
    if text.startswith(("http://", "https://")):
        url, _, fragment = text.partition("#")
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        if fragment and sha is None:
            raise UsageError(f"--data {text}: the only fragment understood is #sha256=HEX")
        return DataSource("url", text, downloads=(_download(url, sha, "--data"),))
    if text.startswith("hf://"):
        rest = text[len("hf://"):].strip("/").split("/", 3)
        if len(rest) < 3 or rest[0] != "datasets":
            raise UsageError(f"--data {text}: expected hf://datasets/ORG/NAME[/GLOB]",
                             hint="only dataset repositories are fetched")
        org, name = rest[1], rest[2]
        if not (_HF_NAME.fullmatch(org) and _HF_NAME.fullmatch(name)):
            raise UsageError(f"--data {text}: '{org}/{name}' is not a Hugging Face repository name")
        pattern = rest[3] if len(rest) == 4 and rest[3] else None
        return DataSource("hf", text, repo=f"{org}/{name}", pattern=pattern)
    if "://" in text:
        raise UsageError(f"--data {text}: unknown scheme", hint="use a folder, pod:/path, https:// or hf://")
    local = Path(text).expanduser()
    if local.is_dir():
        return DataSource("local", text, local=local)
    if local.is_file():
        try:
            listing = local.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--data {text}: not a folder, and not a readable list of URLs ({exc})") from None
        return DataSource("url", text, downloads=url_list(listing, text))
    raise UsageError(f"--data {text}: not a folder, and no such file")


# Options of trainer.prepare that run.yaml's data section carries (DataConfig field -> flag).
_PREPARE_FLAGS = (("tokenizer", "--tokenizer"), ("tokenizer_file", "--tokenizer-file"),
                  ("bpe_vocab_size", "--vocab-size"), ("val_split", "--val-split"), ("max_bytes", "--max-bytes"),
                  ("text_field", "--text-field"), ("shard_tokens", "--shard-tokens"),
                  ("min_val_tokens", "--min-val-tokens"), ("workers", "--workers"))


def prepare_args(data: Mapping[str, Any]) -> list[str]:
    """``python -m trainer.prepare`` options from run.yaml's (checked) ``data`` mapping."""
    args: list[str] = []
    for key, flag in _PREPARE_FLAGS:
        value = data.get(key)
        if value is not None and value != "":
            args += [flag, str(value)]
    for key, flag in (("include", "--include"), ("exclude", "--exclude")):
        for glob in data.get(key) or ():
            args += [flag, str(glob)]
    return args


def pod_plan(source: DataSource, data: Mapping[str, Any], *, python: str, cache_root: str | None) -> dict[str, Any]:
    """What fetch.py does on the pod, as JSON (paths relative to the run folder unless absolute).

    ``cache_root`` (a network volume) keeps prepared data under a content hash of the raw inputs and
    the preparation options, so a later run with the same inputs and tokenizer reuses it."""
    return {
        "kind": source.kind,
        "pod_path": source.pod_path,
        "downloads": [{"url": d.url, "sha256": d.sha256} for d in source.downloads],
        "repo": source.repo, "pattern": source.pattern,
        "raw_dir": RAW_DIR, "prepared_dir": PREPARED_DIR, "progress_file": PROGRESS_FILE,
        "cache_root": f"{cache_root.rstrip('/')}/{CACHE_DIR}" if cache_root else None,
        "python": python, "prepare_args": prepare_args(data),
    }


POD_FETCH = podfiles.DATA.file("fetch.py").path


def hf_env() -> dict[str, str]:
    """HF_TOKEN for the pod's 0600 env file (``gpucli keys set hf`` or $HF_TOKEN), never a command line."""
    found = lookup_key("hf")
    return {"HF_TOKEN": found[0]} if found else {}


def stage_data(host: Host, source: DataSource, plan: Mapping[str, Any], *, workdir: str, python: str,
               install: bool, on_event: Callable[[str], None]) -> dict[str, str]:
    """Put what the pod's data step needs in the run folder before the trainer starts: the synced
    folder (local), a check that the path is there (pod:), huggingface_hub (hf://, installed with pip
    where the target is bootstrapped, else refused), fetch.py and datasource.json. Returns the
    variables the env file must carry (HF_TOKEN for hf://)."""
    py = shlex.quote(python)
    if source.kind == "local" and source.local is not None:
        on_event(f"syncing data from {source.local}")
        stats = host.sync_up(source.local, f"{workdir}/{RAW_DIR}")
        on_event(f"data: {stats.files_sent} files sent, {stats.files_skipped} unchanged")
        if stats.links_left_out:
            on_event(links_line(stats.links_left_out, "data"))
    elif source.kind == "pod":
        probe = "import os, sys; sys.exit(0 if os.path.exists(os.path.expanduser(sys.argv[1])) else 1)"
        if host.run(f"{py} -c {shlex.quote(probe)} {shlex.quote(source.pod_path or '')}", timeout_s=60,
                    check=False).exit_code != 0:
            raise GpucliError(f"--data {source.spec}: {source.pod_path} does not exist on the pod",
                              hint="check the path, or the volume it lives on (--volume)")
        on_event(f"data: {source.pod_path} is on the pod, nothing to upload")
    env: dict[str, str] = {}
    if source.kind == "hf":
        check = f"{py} -c 'import huggingface_hub'"
        have = host.run(check, timeout_s=120, check=False).exit_code == 0
        detail = "it is not installed"
        if not have and install:
            on_event("installing huggingface_hub on the pod for hf:// data")
            res = host.run(f"{py} -m pip install --quiet huggingface_hub", timeout_s=600, check=False)
            have = res.exit_code == 0 and host.run(check, timeout_s=120, check=False).exit_code == 0
            detail = "pip could not install it: " + ((res.stderr or res.stdout).strip().splitlines() or ["?"])[-1][:200]
        if not have:
            raise GpucliError(f"--data {source.spec}: hf:// data needs the huggingface_hub package on the pod, "
                              f"and {detail}", hint="install it there (pip install huggingface_hub), or download "
                              "the data yourself and pass --data pod:/path")
        env = hf_env()
    podfiles.DATA.write(host, workdir)
    host.write_file(f"{workdir}/{PLAN_FILE}", json.dumps(dict(plan), indent=1).encode(), mode=0o644)
    return env


def links_line(links: Sequence[str], what: str) -> str:
    """One line naming the symlinks a sync left out because they point outside its folder."""
    shown = ", ".join(links[:5]) + (f" and {len(links) - 5} more" if len(links) > 5 else "")
    return (f"leaving {len(links)} symlink(s) pointing outside the folder out of the {what} sync "
            f"(never followed): {shown}")
