"""A run's checkpoint store: an S3-compatible bucket (``s3://bucket/prefix``) or a Hugging Face Hub
repository (``hf://owner/name[/prefix]``, ``hf://datasets/owner/name[/prefix]``).

This file runs in two places: imported by gpucli on the user's machine (resume, fetch-best, export from
the store) and copied next to the pod's uploader (``storesync.py``), which loads it by path. So it imports
nothing of gpucli, and its third-party clients only inside the functions that need them: ``boto3`` for
S3 (the ``store`` extra; on a pod it is installed only when a run asks for a store) and
``huggingface_hub`` for the Hub (the ``hub`` extra).

Credentials are never arguments: each client reads them from its own environment, as every tool of
that service does. S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``),
``AWS_ENDPOINT_URL`` for a service other than AWS (R2, B2, MinIO, Wasabi), ``AWS_REGION``
(boto3's "Configuring credentials" and "Service-specific endpoints" guides). The Hub: ``HF_TOKEN``,
``HF_ENDPOINT``. On the pod they come from the run's 0600 env file.

A run's checkpoints sit under ``<prefix>/<run>/checkpoints/<name>/`` with a ``manifest.json`` written
after every other file of that checkpoint: a checkpoint is whole in the store exactly when its manifest
is there and every file it lists has the size it gives.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
#: What the Hub's repos look like in a URL (huggingface_hub's ``REPO_TYPES``, and ``datasets/`` as the Hub
#: spells its dataset URLs).
_HF_TYPES = {"datasets": "dataset", "models": "model"}
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")  # S3's bucket naming rules (3-63, lower case)
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")


class StoreError(Exception):
    """A store call that failed. ``refused``: the service said no (credentials, permissions, a bucket
    that does not exist): trying again soon will not help, the user must act."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass(frozen=True)
class StoreUrl:
    scheme: str  # "s3" | "hf"
    bucket: str  # the bucket, or the Hub repository id (owner/name)
    prefix: str  # "" or a path without leading or trailing slash
    repo_type: str = "model"  # the Hub's repository type

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        kind = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        return f"hf://{kind}{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p and p.strip("/"))


def parse_url(text: str) -> StoreUrl:
    """``s3://bucket[/prefix]`` or ``hf://[datasets/]owner/name[/prefix]``; StoreError (one line) else."""
    raw = str(text).strip()
    scheme, sep, rest = raw.partition("://")
    parts = [p for p in rest.split("/") if p] if sep else []
    bad = [p for p in parts if p in (".", "..") or not _PART.fullmatch(p)]
    if scheme == "s3" and parts and not bad:
        if not _BUCKET.fullmatch(parts[0]):
            raise StoreError(f"--store {raw}: {parts[0]!r} is not an S3 bucket name (3-63 characters: a-z 0-9 . -)")
        return StoreUrl("s3", parts[0], "/".join(parts[1:]))
    if scheme == "hf" and not bad:
        repo_type = "model"
        if parts and parts[0] in _HF_TYPES:
            repo_type = _HF_TYPES[parts.pop(0)]
        if len(parts) >= 2:
            return StoreUrl("hf", f"{parts[0]}/{parts[1]}", "/".join(parts[2:]), repo_type)
    raise StoreError(f"--store {raw!r}: expected s3://BUCKET[/PREFIX] or hf://[datasets/]OWNER/NAME[/PREFIX]")


# ---- the two services ----------------------------------------------------------------------------


def _s3_error(exc: BaseException, what: str) -> StoreError:
    """One line for a botocore error: the service's code and words, never the request's headers."""
    resp = getattr(exc, "response", None) or {}
    err = resp.get("Error") or {}
    code = str(err.get("Code") or type(exc).__name__)
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    refused = code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket",
                       "AllAccessDisabled", "AccountProblem", "NoCredentialsError", "InvalidBucketName") \
        or status in (401, 403)
    message = str(err.get("Message") or exc).splitlines()[0][:200]
    return StoreError(f"{what}: {code}" + (f" (HTTP {status})" if status else "") + f": {message}", refused=refused)


class S3Store:
    """Any S3-compatible service through boto3."""

    def __init__(self, url: StoreUrl, *, max_concurrency: int = 2) -> None:
        try:
            import boto3  # lazy: the `store` extra
            from boto3.s3.transfer import TransferConfig  # lazy: the `store` extra
            from botocore.config import Config  # lazy: the `store` extra
        except ImportError as exc:
            raise StoreError("an s3:// store needs boto3: pip install 'gpucli[store]'", refused=True) from exc
        self.url = url
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        # botocore's own retries (standard mode: throttling, 5xx, connection errors) under ours.
        self.client = boto3.client("s3", region_name=region, endpoint_url=endpoint,
                                   config=Config(retries={"max_attempts": 3, "mode": "standard"},
                                                 connect_timeout=20, read_timeout=120))
        # Few threads and 64 MiB parts: the upload shares the pod's CPUs with the training loop, and a
        # part is read from the file as it is sent (no copy on disk).
        self.transfer = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20,
                                       max_concurrency=max_concurrency, use_threads=max_concurrency > 1)
        self._errors = self._error_types()

    @staticmethod
    def _error_types() -> tuple[type[BaseException], ...]:
        from boto3.exceptions import S3UploadFailedError  # lazy: the `store` extra
        from botocore.exceptions import BotoCoreError, ClientError  # lazy: the `store` extra
        return (ClientError, BotoCoreError, S3UploadFailedError)

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except self._errors as exc:
            raise _s3_error(exc, what) from None

    def ensure(self) -> None:
        """The bucket is the user's: never created here (its region, policy and billing are theirs)."""

    def put_file(self, key: str, path: Path) -> None:
        self._call(f"upload {key}", self.client.upload_file, str(path), self.url.bucket, key, Config=self.transfer)

    def put_files(self, items: list[tuple[str, Path]]) -> None:
        for key, path in items:
            self.put_file(key, path)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(f"upload {key}", self.client.put_object, Bucket=self.url.bucket, Key=key, Body=data)

    def get_file(self, key: str, dest: Path) -> None:
        self._call(f"download {key}", self.client.download_file, self.url.bucket, key, str(dest),
                   Config=self.transfer)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.url.bucket, Key=key)["Body"].read()
        except self._errors as exc:
            if (getattr(exc, "response", None) or {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise _s3_error(exc, f"read {key}") from None

    def ls(self, prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        pages = self._call("list", self.client.get_paginator("list_objects_v2").paginate,
                           Bucket=self.url.bucket, Prefix=prefix.rstrip("/") + "/")
        try:
            for page in pages:
                for obj in page.get("Contents") or ():
                    out[obj["Key"]] = int(obj["Size"])
        except self._errors as exc:
            raise _s3_error(exc, f"list {prefix}") from None
        return out

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            batch = [{"Key": k} for k in keys[i:i + 1000]]
            self._call("delete", self.client.delete_objects, Bucket=self.url.bucket,
                       Delete={"Objects": batch, "Quiet": True})


class HubStore:
    """A Hugging Face Hub repository through huggingface_hub: each upload is a commit."""

    def __init__(self, url: StoreUrl) -> None:
        try:
            from huggingface_hub import HfApi  # lazy: the `hub` extra
        except ImportError as exc:
            raise StoreError("an hf:// store needs huggingface_hub: pip install 'gpucli[hub]'", refused=True) from exc
        self.url = url
        self.api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN") or None)

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        from huggingface_hub.errors import HfHubHTTPError  # lazy: the `hub` extra
        try:
            return fn(*args, repo_id=self.url.bucket, repo_type=self.url.repo_type, **kw)
        except HfHubHTTPError as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            line = str(exc).splitlines()[0][:200]
            raise StoreError(f"{what}: {line}", refused=status in (401, 403, 404)) from None
        except (OSError, ValueError) as exc:
            raise StoreError(f"{what}: {type(exc).__name__}: {str(exc)[:200]}") from None

    def ensure(self) -> None:
        """A private repository of that name, when there is none yet (the token must be allowed to write)."""
        self._call("create the repository", self.api.create_repo, private=True, exist_ok=True)

    def put_file(self, key: str, path: Path) -> None:
        self._call(f"upload {key}", self.api.upload_file, path_or_fileobj=str(path), path_in_repo=key,
                   commit_message=f"gpucli: {key}")

    def put_files(self, items: list[tuple[str, Path]]) -> None:
        """One commit for a checkpoint's files (the Hub limits commits per hour, not files per commit)."""
        from huggingface_hub import CommitOperationAdd  # lazy: the `hub` extra

        if items:
            self._call(f"upload {items[0][0].rsplit('/', 1)[0]}", self.api.create_commit,
                       operations=[CommitOperationAdd(path_in_repo=k, path_or_fileobj=str(p)) for k, p in items],
                       commit_message=f"gpucli: {items[0][0].rsplit('/', 1)[0]}")

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(f"upload {key}", self.api.upload_file, path_or_fileobj=data, path_in_repo=key,
                   commit_message=f"gpucli: {key}")

    def get_file(self, key: str, dest: Path) -> None:
        from huggingface_hub import hf_hub_download  # lazy: the `hub` extra
        folder = dest.parent / f".hf_{dest.name}"
        got = self._call(f"download {key}", _hub_download, hf_hub_download, self.api, key, folder)
        Path(got).replace(dest)

    def get_bytes(self, key: str) -> bytes | None:
        if key not in self.ls(key.rpartition("/")[0]):
            return None
        import tempfile  # only for the Hub's reads, which go through a file
        with tempfile.TemporaryDirectory() as tmp:
            dest = Path(tmp) / "f"
            self.get_file(key, dest)
            return dest.read_bytes()

    def ls(self, prefix: str) -> dict[str, int]:
        from huggingface_hub.hf_api import RepoFile  # lazy: the `hub` extra
        try:
            # a generator: its requests run as it is read, so it is read inside the call
            items = self._call("list", lambda **kw: list(self.api.list_repo_tree(**kw)),
                               path_in_repo=prefix.rstrip("/"), recursive=True)
            return {i.path: int(i.size) for i in items if isinstance(i, RepoFile)}
        except StoreError as exc:
            if "404" in str(exc) or "not found" in str(exc).lower():
                return {}
            raise

    def delete(self, keys: list[str]) -> None:
        from huggingface_hub import CommitOperationDelete  # lazy: the `hub` extra
        if keys:
            self._call("delete", self.api.create_commit, operations=[CommitOperationDelete(k) for k in keys],
                       commit_message=f"gpucli: prune {len(keys)} files")


def _hub_download(download: Any, api: Any, key: str, folder: Path, *, repo_id: str, repo_type: str) -> str:
    return download(repo_id=repo_id, repo_type=repo_type, filename=key, local_dir=str(folder),
                    endpoint=api.endpoint, token=api.token)


def open_store(url: StoreUrl | str, **kw: Any) -> S3Store | HubStore:
    u = parse_url(url) if isinstance(url, str) else url
    return S3Store(u, **kw) if u.scheme == "s3" else HubStore(u)


# ---- manifests -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredCheckpoint:
    """A whole checkpoint in the store: its manifest, and every file the manifest lists is there."""

    name: str  # step_000500, best_step_000500, or an own-code checkpoint's name
    kind: str  # "regular" | "best" | "own"
    step: int | None
    loss: float | None
    val_loss: float | None
    files: dict[str, tuple[str, int]]  # name -> (sha256, bytes)
    prefix: str  # the key its files sit under

    @property
    def size_bytes(self) -> int:
        return sum(b for _, b in self.files.values())


def run_prefix(url: StoreUrl, run: str) -> str:
    return url.key(run, "checkpoints")


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def parse_manifest(data: bytes, prefix: str) -> StoredCheckpoint | None:
    """The manifest's checkpoint, or None when it is not one this format writes (never trusted further
    than its shape: names are single path parts, sizes and hashes well formed)."""
    try:
        m = json.loads(data[: 1 << 20])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(m, dict) or m.get("format") != MANIFEST_FORMAT or not isinstance(m.get("files"), dict):
        return None
    files: dict[str, tuple[str, int]] = {}
    for name, f in m["files"].items():
        if not isinstance(f, dict) or not isinstance(name, str) or any(p in ("", ".", "..") for p in name.split("/")) \
                or not re.fullmatch(r"[0-9a-f]{64}", str(f.get("sha256"))) or not isinstance(f.get("bytes"), int):
            return None
        files[name] = (f["sha256"], f["bytes"])
    name, step = m.get("name"), m.get("step")
    if not isinstance(name, str) or not _PART.fullmatch(name):
        return None
    return StoredCheckpoint(name=name, kind=str(m.get("kind") or "regular"),
                            step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                            loss=_number(m.get("loss")), val_loss=_number(m.get("val_loss")), files=files, prefix=prefix)


def whole_checkpoints(store: Any, url: StoreUrl, run: str) -> list[StoredCheckpoint]:
    """Every whole checkpoint of ``run`` in the store, oldest step first: a manifest, and each file it
    lists present with its size (a checkpoint cut mid-upload, or mid-prune, is not listed)."""
    root = run_prefix(url, run)
    listing = store.ls(root)
    out = []
    for key in sorted(listing):
        if not key.endswith("/" + MANIFEST):
            continue
        prefix = key[: -len(MANIFEST) - 1]
        data = store.get_bytes(key)
        ck = parse_manifest(data, prefix) if data is not None else None
        if ck is None or prefix.rsplit("/", 1)[-1] != ck.name:
            continue
        if all(listing.get(f"{prefix}/{n}") == size for n, (_, size) in ck.files.items()):
            out.append(ck)
    return sorted(out, key=lambda c: (c.step if c.step is not None else -1, c.name))


def best_of(cks: list[StoredCheckpoint]) -> StoredCheckpoint | None:
    """The lowest validation loss (the later step on a tie); with none measured, the newest step."""
    scored = [c for c in cks if c.val_loss is not None]
    if scored:
        return min(scored, key=lambda c: (c.val_loss, -(c.step or 0)))
    return max(cks, key=lambda c: (c.step if c.step is not None else -1), default=None)


def newest_resumable(cks: list[StoredCheckpoint]) -> StoredCheckpoint | None:
    """The newest whole checkpoint a trainer can resume from (a regular one: ``best`` holds weights only)."""
    return max((c for c in cks if c.kind != "best"), key=lambda c: (c.step if c.step is not None else -1), default=None)
