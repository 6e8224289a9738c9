"""A RunPod cluster's rendezvous address is the PRIMARY_ADDR (else MASTER_ADDR) that each node's own
environment gives (instant-clusters/configuration.mdx), read on the node by a real shell; a node whose
NODE_RANK is not its API rank, or nodes that name different primaries, are refused before anything starts."""

from __future__ import annotations

import pytest

from gpucli.errors import ProviderError
from gpucli.providers.local.target import LocalHost
from gpucli.providers.runpod.clusterrent import cluster_addresses
from gpucli.runs.nodespec import NodeSpec


class NodeShell(LocalHost):
    """This machine's shell with one node's container environment file (as an emulated pod has it)."""

    def __init__(self, environ: str) -> None:
        self.environ = environ

    def run(self, cmd, **kw):
        return super().run(f"GPUCLI_POD_ENVIRON={self.environ} && export GPUCLI_POD_ENVIRON && {cmd}", **kw)


def nodes(tmp_path, *envs: dict[str, str]) -> tuple[list[NodeShell], list[NodeSpec]]:
    hosts, specs = [], []
    for rank, env in enumerate(envs):
        path = tmp_path / f"environ{rank}"
        path.write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
        hosts.append(NodeShell(str(path)))
        specs.append(NodeSpec(rank, f"w{rank}", None, f"10.65.0.{rank + 1}"))  # the API's overlay ip
    return hosts, specs


def test_the_primary_addr_and_node_addr_replace_the_api_overlay_ip(tmp_path):
    hosts, specs = nodes(tmp_path, {"PRIMARY_ADDR": "10.1.0.5", "NODE_ADDR": "10.1.0.5", "NODE_RANK": "0"},
                         {"PRIMARY_ADDR": "10.1.0.5", "NODE_ADDR": "10.1.0.6", "NODE_RANK": "1"},
                         {"MASTER_ADDR": "10.1.0.5", "NODE_RANK": "2"})  # MASTER_ADDR alone; no NODE_ADDR
    out = cluster_addresses(hosts, specs)
    assert [s.address for s in out] == ["10.1.0.5", "10.1.0.6", "10.65.0.3"]


@pytest.mark.parametrize("second,needle", [
    ({"PRIMARY_ADDR": "10.1.0.5", "NODE_RANK": "0"}, "NODE_RANK=0"),
    ({"PRIMARY_ADDR": "10.1.0.9", "NODE_RANK": "1"}, "different primaries"),
    ({"NODE_RANK": "1"}, "neither PRIMARY_ADDR nor MASTER_ADDR"),
])
def test_a_node_that_disagrees_is_refused_in_one_line(tmp_path, second, needle):
    hosts, specs = nodes(tmp_path, {"PRIMARY_ADDR": "10.1.0.5", "NODE_RANK": "0"}, second)
    with pytest.raises(ProviderError, match=needle):
        cluster_addresses(hosts, specs)
