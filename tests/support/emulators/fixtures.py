"""pytest fixtures for the emulators. Use them with ``pytest_plugins = ["tests.support.emulators.fixtures"]``.

Each fixture starts its emulator, points the client at it through the variables the official SDKs
honour (``RUNPOD_API_BASE_URL``, ``VAST_URL``), sets a test API key, makes pods log in as the current
user (the emulator's sshd cannot log in as root), shrinks HTTP backoff to milliseconds, and on
teardown stops the server and every pod's sshd.
"""

from __future__ import annotations

import getpass

import pytest

from tests.support.emulators.runpod import RunPodEmulator
from tests.support.emulators.vast import VastEmulator


def _common_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLI_POD_SSH_USER", getpass.getuser())
    monkeypatch.setenv("GPUCLI_HTTP_BACKOFF_S", "0.001")


@pytest.fixture
def runpod_emulator(tmp_path_factory, monkeypatch):
    emu = RunPodEmulator(tmp_path_factory.mktemp("runpod_emu"))
    emu.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", emu.url)
    monkeypatch.setenv("RUNPOD_API_V2_URL", emu.url)  # cluster routes: none here (cluster_emulator has them)
    monkeypatch.setenv("RUNPOD_API_KEY", emu.api_key)
    _common_env(monkeypatch)
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def vast_emulator(tmp_path_factory, monkeypatch):
    emu = VastEmulator(tmp_path_factory.mktemp("vast_emu"))
    emu.start()
    monkeypatch.setenv("VAST_URL", emu.url)
    monkeypatch.setenv("VAST_API_KEY", emu.api_key)
    _common_env(monkeypatch)
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture
def cluster_emulator(request, tmp_path_factory, monkeypatch):
    """RunPod Instant Clusters (API v2), tests/support/emulators/clusters.py; with ``runpod_emulator`` in
    the same test, its network volumes are the ones a cluster mounts."""
    from tests.support.emulators.clusters import ClusterEmulator

    emu = ClusterEmulator(tmp_path_factory.mktemp("clusters_emu"))
    if "runpod_emulator" in request.fixturenames:
        emu.volumes_of = request.getfixturevalue("runpod_emulator")
    emu.start()
    monkeypatch.setenv("RUNPOD_API_V2_URL", emu.url)
    monkeypatch.setenv("RUNPOD_API_KEY", emu.api_key)
    _common_env(monkeypatch)
    try:
        yield emu
    finally:
        emu.stop()
