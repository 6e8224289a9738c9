"""What comes from a pod is checked before it becomes a local path, a manifest or a number.

A pod runs code gpucli does not control (the user's own, a compromised image): the names in a
checkpoint's ``meta.json``, the listing of a ``--checkpoints`` folder and the files themselves are
whatever the pod says. Here:

- :func:`local_path` resolves a remote relative name under a local destination, and refuses an empty
  name, an absolute one, ``..`` or ``.`` parts, NUL or control characters, and a destination part that
  is a symlink or not a folder (so nothing is written outside the destination, whatever the name);
- :func:`read_json` reads a pod's small JSON file with a size bound, and turns malformed or deeply
  nested JSON into a one-line error;
- :func:`checkpoint_manifest` is the bundled trainer's checkpoint manifest, valid only when complete:
  a non-empty ``files`` map of safe names to sha256 digests that includes the weights.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import TransferError
from trainer.spec.metricsrow import finite_number, whole_number  # the same checks as a metrics row

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

#: The files a bundled-trainer checkpoint cannot be used without (trainer/loop/checkpoint.py writes them).
WEIGHT_FILES = ("model.pt", "model.safetensors")  # a checkpoint holds its weights as one of these (best: safetensors)
#: The most bytes of a pod's meta.json (or other small JSON file) read: a real one is a few KB.
MAX_JSON_BYTES = 4 << 20
MAX_NAME_CHARS = 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class UnsafeRemoteName(TransferError):
    """A name from the pod that would land outside its destination (or is not a plain file name)."""


def name_problem(rel: Any) -> str | None:
    """Why ``rel`` (a relative path from the pod, '/'-separated) cannot name a local file, or None."""
    if not isinstance(rel, str) or not rel:
        return "not a file name"
    if len(rel) > MAX_NAME_CHARS:
        return "longer than 1024 characters"
    if _CONTROL.search(rel):
        return "has control characters"
    if rel.startswith("/") or "\\" in rel or re.match(r"^[A-Za-z]:", rel):
        return "is absolute"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' part"
    return None


def shown(rel: Any) -> str:
    """A pod's name as it can be shown in one line (control characters escaped, length bounded)."""
    text = rel if isinstance(rel, str) else repr(rel)
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= 120 else text[:117] + "..."


def local_path(root: Path, rel: Any, *, folder: bool = False) -> Path:
    """``root/rel``, checked: ``rel`` is a safe relative name and no existing part between ``root``
    and the file is a symlink, or anything but a folder (the file itself: absent or a regular file;
    with ``folder``, absent or a real folder: an earlier copy that a new download replaces).
    An :class:`UnsafeRemoteName` otherwise."""
    problem = name_problem(rel)
    if problem:
        raise UnsafeRemoteName(f"refused a file name from the pod: {shown(rel)!r} {problem}",
                               hint="the pod's checkpoint files name only files inside their folder")
    assert isinstance(rel, str)
    here = root
    parts = rel.split("/")
    for i, part in enumerate(parts):
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            break  # nothing below a missing part exists yet: it is created as a folder or the file
        except OSError as exc:
            raise UnsafeRemoteName(f"refused {shown(rel)!r}: {here} cannot be checked ({exc.strerror})") from None
        last = i == len(parts) - 1
        want_file = last and not folder
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) if want_file else stat.S_ISDIR(st.st_mode)):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a plain file or folder"
            raise UnsafeRemoteName(f"refused {shown(rel)!r}: {here} is {kind}",
                                   hint="nothing from the pod is written through a link")
    return root / rel


def check_names(names: Any) -> None:
    """Every name safe (see :func:`name_problem`), or an :class:`UnsafeRemoteName` for the first."""
    for name in names:
        problem = name_problem(name)
        if problem:
            raise UnsafeRemoteName(f"refused a file name from the pod: {shown(name)!r} {problem}")


def parse_json(data: bytes, what: str) -> Any:
    """``data`` as JSON, or a one-line TransferError (malformed, not UTF-8, nested too deep)."""
    if len(data) > MAX_JSON_BYTES:
        raise TransferError(f"{what} is larger than {MAX_JSON_BYTES >> 20} MB: not read")
    try:
        return json.loads(data)
    except RecursionError:
        raise TransferError(f"{what} is nested too deep to be read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TransferError(f"{what} is not JSON ({shown(str(exc))[:80]})") from None


def read_json(host: Host, remote_path: str, what: str, size: int | None = None) -> Any:
    """A small JSON file of the pod, at most :data:`MAX_JSON_BYTES` read (``size``, when the listing
    gave it, refuses a larger one before any byte is read)."""
    if size is not None and size > MAX_JSON_BYTES:
        raise TransferError(f"{what} is {size} bytes: larger than {MAX_JSON_BYTES >> 20} MB, not read")
    data, _ = host.read_from(remote_path, 0, MAX_JSON_BYTES + 1)
    return parse_json(data, what)


def checkpoint_manifest(meta: Any) -> dict[str, str] | None:
    """The files of a bundled-trainer checkpoint (name -> sha256) when its meta.json describes a
    complete one, else None: a JSON object with a ``files`` map (or the older single ``sha256`` of
    the weights) of safe names to sha256 digests, the required files among them."""
    if not isinstance(meta, Mapping):
        return None
    files = meta.get("files")
    if files is None and isinstance(meta.get("sha256"), str):
        files = {"model.pt": meta["sha256"]}
    if not isinstance(files, Mapping) or not files:
        return None
    out: dict[str, str] = {}
    for name, digest in files.items():
        # a '/' is a sharded checkpoint's folder (dcp/__0_0.distcp, trainer/loop/sharded.py): each part is
        # checked here, and local_path() refuses a symlink or anything but a folder on the way
        if name_problem(name) or not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            return None
        out[name] = digest
    if not any(w in out for w in WEIGHT_FILES):
        return None
    return out


#: Fields of a metrics or progress row that are numbers; a row from the pod with anything else in one
#: of them loses that field (a string step, an infinite loss, a list), and a row without a usable step
#: where one is required is dropped.
NUMBER_FIELDS = ("loss", "val_loss", "val_bpb", "ppl", "lr", "mfu", "tok_per_s", "eta_s", "dt_ms", "cost_usd",
                 "elapsed_s", "time", "mem_gib", "bytes_total", "bytes_read", "total_bytes", "tokens", "mb_s",
                 "grad_norm", "max_steps", "usd_per_hour")
_STEPPED = ("train", "val")


def clean_row(row: Any) -> dict[str, Any] | None:
    """A metrics row of the pod as gpucli reads it: an object whose ``kind`` and ``event`` are
    strings, ``step`` a whole number >= 0, the :data:`NUMBER_FIELDS` finite numbers; None when it
    cannot be one (not an object, no kind, a train or val row without a step)."""
    if not isinstance(row, dict) or not isinstance(row.get("kind", ""), str):
        return None
    out = dict(row)
    if "event" in out and not isinstance(out["event"], str):
        out["event"] = json.dumps(out["event"], default=str)[:80]
    if "step" in out:
        step = whole_number(out["step"])
        if step is None or step < 0:
            del out["step"]
        else:
            out["step"] = step
    if out.get("kind") in _STEPPED and "step" not in out:
        return None
    for key in NUMBER_FIELDS:
        if key in out and out[key] is not None:
            value = finite_number(out[key])
            if value is None:
                del out[key]
            elif not isinstance(out[key], int) or isinstance(out[key], bool):
                out[key] = value
    return out
