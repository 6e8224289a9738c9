"""``--json`` of the commands that report an outcome (down, sync, mirror, watch, tensorboard, ssh-config,
serve, export):
one JSON document, or one JSON object a line for what streams (sync's paths, watch's notices)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from gpucli.cli.render import json_out, to_jsonable


def json_line(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj)) + "\n")
    sys.stdout.flush()


def downed(result: Any) -> None:
    r = result.record
    json_out({"run": r.name, "status": r.status, "was_running": result.was_running, "ended_pod": result.ended_pod,
              "instance_id": r.instance_id, "provider": r.provider, "ended_at": r.ended_at,
              "end_reason": r.end_reason, "cost_usd": r.cost_usd})


def strays(found: list[Any], ended: bool) -> None:
    json_out({"strays": [to_jsonable(s) for s in found], "ended": ended})


def synced(path: Any, stats: Any) -> None:
    json_line({"path": str(path), **to_jsonable(stats)})


def mirrored(record: Any, result: Any, root: Any) -> None:
    json_out({"run": record.name, "mirror": str(root), "checkpoint": result.checkpoint, "step": result.step,
              "metrics_rows": result.metrics_rows})


def notice(n: Any) -> None:
    json_line({"time": time.time(), "level": n.level, "text": n.text})


def watch_ended(run: str, how: str) -> None:
    json_line({"time": time.time(), "run": run, "ended": how})


def tensorboard_ready(url: str, where: str) -> None:
    json_line({"url": url, "where": where})


def serving(url: str, **where: Any) -> None:
    """``serve --json``: the API's address once it answers, one line (the checkpoint or the run, the engine)."""
    json_line({"url": url, **{k: (str(v) if v is not None else None) for k, v in where.items()}})


def exported(r: Any) -> None:
    json_out({"folder": None if r.local_dir is None else str(r.local_dir), "remote_folder": r.remote_dir,
              "architecture": r.architecture, "files": list(r.files), "bytes": r.bytes, "pushed_url": r.pushed_url})
