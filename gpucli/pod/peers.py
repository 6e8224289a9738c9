"""The watchdogs of one run over several machines watch each other (standard library only; loaded by
path by watchdog.py, as procid.py is).

Rank 0's watchdog listens on ``--peer-addr``'s port; every other node's watchdog keeps one TCP
connection to it, opens it with ``hello TOKEN`` (the run's shared secret, from a 0600 file on every
node; a connection without it is closed unheard) and sends a line each poll: ``hb RANK`` while its trainer runs, ``over RANK REASON``
once it has ended. Rank 0 answers each line with ``ok`` or, once the run is over for it, ``end
REASON``. So:

- a node whose trainer ends (crash, a killed torchrun agent, its machine going away) tells rank 0, or
  goes silent: rank 0 gives its own trainer ``grace_s`` to end by itself (a lost peer fails the
  collectives at once: gloo and NCCL see the connection close), then stops it;
- rank 0 ending, or going silent for ``timeout_s``, ends every other node the same way;
- every watchdog then ends its own machine's billing as on a one-machine run.
A node that never connects within ``startup_s`` counts as lost.
"""

from __future__ import annotations

import socket
import threading
import time

_MAX_LINE = 512


class PeerWatch:
    """One node's side; :meth:`verdict` is polled by the watchdog's loop, :meth:`finish` called once
    its own run is over."""

    def __init__(self, nodes: int, rank: int, addr: str, *, poll_s: float, timeout_s: float, startup_s: float,
                 token: str = "", log=lambda _m: None) -> None:  # noqa: ANN001
        host, _, port = addr.rpartition(":")
        self.token = token  # the run's shared secret (a 0600 file on every node): others are not heard
        self.nodes, self.rank, self.addr = nodes, rank, (host, int(port))
        self.poll_s, self.timeout_s, self.startup_s, self.log = poll_s, timeout_s, startup_s, log
        self.started = time.time()
        self.lock = threading.Lock()
        self.seen: dict[int, float] = {}  # rank -> last line from it (rank 0's view)
        self.over: dict[int, str] = {}  # rank -> why it ended (rank 0's view)
        self.end: str | None = None  # rank 0 says the run is over (a member's view), or why rank 0 is gone
        self.mine: str | None = None  # this node's own end, once known
        self.told = False  # a member: rank 0 has heard this node's "over"
        self.server: socket.socket | None = None
        if rank == 0:
            self._listen()
        else:
            threading.Thread(target=self._member, daemon=True).start()

    # -- rank 0 ----------------------------------------------------------------------------------

    def _listen(self) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", self.addr[1]))
        srv.listen(64)
        self.server = srv
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.server is not None
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        rank = None
        with conn, conn.makefile("rwb") as f:
            conn.settimeout(self.timeout_s)
            try:
                hello = f.readline(_MAX_LINE).decode(errors="replace").split()
            except OSError:
                return
            if hello != ["hello", self.token]:
                return
            while True:
                try:
                    line = f.readline(_MAX_LINE)
                except OSError:
                    line = b""
                if not line:
                    if rank is not None:
                        with self.lock:
                            self.over.setdefault(rank, "its watchdog disconnected")
                    return
                parts = line.decode(errors="replace").split(maxsplit=2)
                if len(parts) < 2 or not parts[1].isdigit():
                    return
                rank = int(parts[1])
                with self.lock:
                    self.seen[rank] = time.time()
                    if parts[0] == "over":
                        self.over[rank] = parts[2].strip() if len(parts) > 2 else "ended"
                    reply = f"end {self.mine}\n" if self.mine else "ok\n"
                try:
                    f.write(reply.encode())
                    f.flush()
                except OSError:
                    return

    # -- every other node ------------------------------------------------------------------------

    def _member(self) -> None:
        last_ok = self.started
        while True:
            try:
                with socket.create_connection(self.addr, timeout=min(10.0, self.timeout_s)) as conn, \
                        conn.makefile("rwb") as f:
                    conn.settimeout(self.timeout_s)
                    f.write(f"hello {self.token}\n".encode())
                    while True:
                        with self.lock:
                            mine = self.mine
                        f.write((f"over {self.rank} {mine}\n" if mine else f"hb {self.rank}\n").encode())
                        f.flush()
                        reply = f.readline(_MAX_LINE).decode(errors="replace").strip()
                        if not reply:
                            raise OSError("closed")
                        last_ok = time.time()
                        if reply.startswith("end"):
                            with self.lock:
                                self.end = self.end or f"rank 0 ended ({reply[4:] or 'over'})"
                        if mine:
                            with self.lock:
                                self.told = True
                            return
                        time.sleep(self.poll_s)
            except OSError:
                with self.lock:
                    if self.mine:
                        return
                    if time.time() - last_ok > (self.timeout_s if last_ok > self.started else self.startup_s):
                        self.end = self.end or "rank 0 unreachable"
                time.sleep(min(self.poll_s, 2.0))

    # -- both ------------------------------------------------------------------------------------

    def verdict(self) -> str | None:
        """Why this node's run must end because of another node, or None."""
        now = time.time()
        with self.lock:
            if self.rank != 0:
                return self.end
            for r in range(1, self.nodes):
                if r in self.over:
                    return f"node {r} ended ({self.over[r]})"
                last = self.seen.get(r)
                if last is None and now - self.started > self.startup_s:
                    return f"node {r} never reached rank 0"
                if last is not None and now - last > self.timeout_s:
                    return f"node {r} silent for {now - last:.0f} s"
        return None

    def finish(self, reason: str, wait_s: float) -> None:
        """This node's run is over: tell the others (rank 0 answers ``end`` from now on; a member sends
        ``over``) and give them up to ``wait_s`` to hear it."""
        with self.lock:
            self.mine = reason.replace("\n", " ")[:200]
        deadline = time.time() + wait_s
        while time.time() < deadline:
            with self.lock:
                done = all(r in self.over for r in range(1, self.nodes)) if self.rank == 0 else self.told
            if done:
                return
            time.sleep(0.2)
