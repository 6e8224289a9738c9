"""Reading a vast.ai node's overlay address (gpucli.providers.vast.cluster): with iproute2's `ip`, and with
Python's ioctl where the image has no `ip` (the docs say to apt-install it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from gpucli.providers.vast.cluster import address_command, overlay_name, parse_address


def run(command: str, path: str) -> str:
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": path}).stdout


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 is not installed here")
def test_the_address_comes_from_ip():
    assert parse_address(run(address_command("lo"), os.environ["PATH"])) == "127.0.0.1"


def test_without_ip_python_reads_it_and_a_missing_interface_has_none(tmp_path):
    (tmp_path / "python3").symlink_to(sys.executable)  # a PATH with python3 and no `ip`
    assert parse_address(run(address_command("lo"), str(tmp_path))) == "127.0.0.1"
    assert parse_address(run(address_command("nosuch0"), str(tmp_path))) is None


def test_the_documented_output_and_network_names():
    # vast-ai/docs multi-node-training-using-torch-nccl.mdx: `ip a` on a member shows the overlay on eth0
    assert parse_address("2: eth0    inet 10.0.0.1/24 scope global eth0\\       valid_lft forever") == "10.0.0.1"
    assert overlay_name("gpucli-My_Run.2") == "gpucli-my-run-2"  # vast.py parse_env: [a-z0-9-] only
