"""Measure the link between two machines of one run (standard library only: uploaded next to the run
folder and started with the host's python by gpucli/run/host/linkprobe.py; no iperf needed).

On rank 0::

    python3 linkprobe.py sink --port P --deadline-s D --tag TAG --state FILE

listens on port ``P`` (0: a free one) of every interface, as torchrun's c10d store does, writes
``{"port": N}`` to ``FILE``, takes one connection that opens with ``TAG``, reads until the sender closes
or the deadline, and writes ``{"port": N, "bytes": B, "seconds": S}`` (timed here, on the receiving
side, from the first byte after the tag to the last) or ``{"port": N, "error": "..."}``. On node r::

    python3 linkprobe.py send --to ADDR:PORT --bytes B --deadline-s D --tag TAG

connects to rank 0's rendezvous address (the path NCCL and gloo take), sends the tag and ``B`` bytes
(fewer when the deadline comes first), closes its side and waits for the sink's ``ok``. Every wait is
bounded by ``D``; exit status 0 when the bytes went, 2 otherwise (the reason on stderr, one line).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

CHUNK = 1 << 20


def _write_state(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _listener(port: int) -> socket.socket:
    try:
        srv = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    except (OSError, ValueError):
        srv = socket.create_server(("", port))
    return srv


def _read_exact(conn: socket.socket, n: int, end: float) -> bytes:
    got = b""
    while len(got) < n:
        conn.settimeout(max(0.05, end - time.monotonic()))
        part = conn.recv(n - len(got))
        if not part:
            break
        got += part
    return got


def sink(port: int, deadline_s: float, tag: str, state: str) -> int:
    end = time.monotonic() + deadline_s
    try:
        srv = _listener(port)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        _write_state(state, {"port": port, "error": f"cannot listen on port {port}: {why}"})
        return 2
    port = srv.getsockname()[1]
    _write_state(state, {"port": port})
    buf = bytearray(CHUNK)
    with srv:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                _write_state(state, {"port": port, "error": f"no node connected within {deadline_s:g} s"})
                return 2
            srv.settimeout(left)
            try:
                conn, _ = srv.accept()
            except OSError:
                continue  # the loop's deadline says when to give up
            with conn:
                try:
                    if _read_exact(conn, len(tag), end).decode(errors="replace") != tag:
                        continue  # not the probe's sender: heard no further
                    got, t0 = 0, time.perf_counter()
                    t1 = t0
                    while True:
                        conn.settimeout(max(0.05, end - time.monotonic()))
                        try:
                            n = conn.recv_into(buf)
                        except TimeoutError:
                            break  # the deadline: what arrived is the measure
                        if not n:
                            break
                        got += n
                        t1 = time.perf_counter()
                    _write_state(state, {"port": port, "bytes": got, "seconds": t1 - t0})
                    conn.settimeout(5)
                    conn.sendall(b"ok\n")
                except OSError as exc:
                    _write_state(state, {"port": port, "error": f"the transfer broke: {exc}"})
                    return 2
            return 0


def send(to: str, nbytes: int, deadline_s: float, tag: str) -> int:
    end = time.monotonic() + deadline_s
    host, _, port = to.rpartition(":")
    host = host.strip("[]")
    try:
        conn = socket.create_connection((host, int(port)), timeout=max(0.1, min(15.0, deadline_s)))
    except OSError as exc:
        print(f"cannot connect to {to}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    payload = memoryview(os.urandom(CHUNK))  # incompressible, as gradients are
    with conn:
        try:
            conn.settimeout(max(0.1, end - time.monotonic()))
            conn.sendall(tag.encode())
            sent = 0
            while sent < nbytes and time.monotonic() < end:
                conn.settimeout(max(0.1, end - time.monotonic()))
                part = payload[:min(CHUNK, nbytes - sent)]
                try:
                    conn.sendall(part)
                except TimeoutError:
                    break  # the deadline: rank 0 times what arrived
                sent += len(part)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(max(5.0, end - time.monotonic()))
            answer = conn.recv(16)
        except OSError as exc:
            print(f"sending to {to} broke off: {exc or 'timed out'}", file=sys.stderr)
            return 2
    if not answer.startswith(b"ok"):
        print(f"{to} did not confirm the bytes", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="linkprobe.py")
    sub = ap.add_subparsers(dest="role", required=True)
    s = sub.add_parser("sink")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--deadline-s", type=float, required=True)
    s.add_argument("--tag", required=True)
    s.add_argument("--state", required=True)
    c = sub.add_parser("send")
    c.add_argument("--to", required=True)
    c.add_argument("--bytes", type=int, required=True)
    c.add_argument("--deadline-s", type=float, required=True)
    c.add_argument("--tag", required=True)
    args = ap.parse_args(argv)
    if args.role == "sink":
        return sink(args.port, args.deadline_s, args.tag, args.state)
    return send(args.to, args.bytes, args.deadline_s, args.tag)


if __name__ == "__main__":
    sys.exit(main())
