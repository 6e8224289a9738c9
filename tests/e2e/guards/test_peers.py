"""The watchdogs of a run over several machines watch each other (gpucli/pod/peers.py), over real TCP."""

from __future__ import annotations

import socket
import time

from gpucli.pod.peers import PeerWatch
from tests.support.cli import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_member_that_ends_is_heard_and_rank_0_ending_is_told():
    addr = f"127.0.0.1:{free_port()}"
    kw = {"poll_s": 0.1, "timeout_s": 5.0, "startup_s": 5.0}
    lead = PeerWatch(3, 0, addr, token="s3cret", **kw)
    one = PeerWatch(3, 1, addr, token="s3cret", **kw)
    stranger = PeerWatch(3, 2, addr, token="wrong", **kw)  # never heard: its rank stays silent
    wait_for(lambda: 1 in lead.seen, 10, "node 1's heartbeat")
    time.sleep(0.5)
    assert 2 not in lead.seen and lead.verdict() is None
    one.finish("crashed", wait_s=5)
    assert one.told and lead.verdict() == "node 1 ended (crashed)"
    other = PeerWatch(2, 1, addr, token="s3cret", **kw)
    lead.finish("finished (max_steps)", wait_s=0.5)
    wait_for(lambda: other.verdict(), 10, "rank 0's end to reach node 1")
    assert other.verdict() == "rank 0 ended (finished (max_steps))"
    assert stranger.verdict() is None or "unreachable" in stranger.verdict()


def test_silent_rank_0_and_a_silent_node_are_lost():
    addr = f"127.0.0.1:{free_port()}"
    member = PeerWatch(2, 1, addr, poll_s=0.1, timeout_s=0.5, startup_s=0.5)  # nobody listens
    wait_for(lambda: member.verdict(), 10, "rank 0 to be declared unreachable")
    assert member.verdict() == "rank 0 unreachable"
    lead = PeerWatch(2, 0, f"127.0.0.1:{free_port()}", poll_s=0.1, timeout_s=0.5, startup_s=0.5)
    wait_for(lambda: lead.verdict(), 10, "node 1 to be declared lost")
    assert lead.verdict() == "node 1 never reached rank 0"
