"""Fixtures for the SSH layer tests: a connected Remote against the real sshd fixture."""

from __future__ import annotations

import pytest

from gpucli.ssh.remote import Remote, SshTarget


@pytest.fixture
def target(sshd, client_key) -> SshTarget:
    return SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))


@pytest.fixture
def remote(target):
    with Remote(target) as r:
        yield r
