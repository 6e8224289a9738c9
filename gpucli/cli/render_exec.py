"""``gpucli exec``: the remote command's bytes as they come (its stdout on stdout, its stderr on stderr,
unchanged: a pipe gets exactly what the command printed), and gpucli's own lines on stderr."""

from __future__ import annotations

import sys

from gpucli.cli.render import info, json_out


def out_bytes(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def err_bytes(data: bytes) -> None:
    sys.stderr.buffer.write(data)
    sys.stderr.flush()


def note(text: str) -> None:
    info(text)


def detached(run: str, exec_id: str, pid: int, log: str, *, json_: bool) -> None:
    if json_:
        json_out({"run": run, "exec_id": exec_id, "pid": pid, "log": log})
        return
    info(f"{run}: started exec {exec_id} (pid {pid}); its output: `gpucli logs {run} --exec {exec_id} -f`")
