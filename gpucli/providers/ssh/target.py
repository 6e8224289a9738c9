"""``--provider ssh --host user@host[:port]``: a machine the user already has, reached over SSH.

Nothing is rented, so nothing is ended: ``gpucli down`` stops the trainer and leaves the machine.
The host key is pinned at first contact and kept in the run record.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from gpucli.errors import UsageError
from gpucli.providers.target import Capabilities, NoPod
from gpucli.runs.sshconfig import target_from_config
from gpucli.settings import home
from gpucli.ssh import Remote, parse_target

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord
    from gpucli.ssh import Remote, SshTarget


def open_remote(record: RunRecord, *, connect_timeout_s: float = 20.0, known_hosts: Path | None = None) -> Remote:
    """A connected ``Remote`` for a run with an SSH endpoint (ssh hosts and cloud pods alike).
    ``known_hosts``: where keys are pinned besides the record (default: gpucli's known_hosts)."""
    if record.ssh is None:
        raise UsageError(f"run {record.name} has no SSH endpoint yet (status: {record.status})")
    remote = Remote(record.ssh, connect_timeout_s=connect_timeout_s, known_hosts=known_hosts)
    remote.connect()
    return remote


def ssh_shell_argv(record: RunRecord, known_hosts: Path | None = None) -> tuple[list[str], str | None]:
    """``ssh -t`` into the run's folder with gpucli's pinned known_hosts (or ``known_hosts``) and the
    run's key."""
    if record.ssh is None:
        raise UsageError(f"run {record.name} has no SSH endpoint")
    exe = shutil.which("ssh")
    if exe is None:
        raise UsageError("the ssh client is not installed")
    args = [exe, "-p", str(record.ssh.port), "-o", f"UserKnownHostsFile={known_hosts or home() / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-t"]
    if record.ssh.identity_file:
        args += ["-i", record.ssh.identity_file]
    if record.ssh.proxy_jump:
        args += ["-J", record.ssh.proxy_jump]
    # The remote side runs this line in a shell: the folder is one quoted word there, so a `--workdir`
    # holding `$(...)`, `;` or spaces is a folder name, never a command.
    return [*args, f"{record.ssh.user}@{record.ssh.host}", f"cd {shlex.quote(record.workdir)} && exec $SHELL -l"], None


class SshServerTarget(NoPod):
    name = "ssh"
    describe = "an SSH host"
    bootstrap = True
    #: The user's own machines: named by --host, their link measured at launch (gpucli/run/host/linkprobe.py)
    #: unless --link-gbps gives it; nothing is rented, so nothing bills per byte or per month here.
    caps = Capabilities(endpoint_given=True,
                        link_source="your machines' link: measured at launch, 64 MB from each node to rank 0 over "
                                    "the rendezvous address (--link-gbps gives it instead)")

    def default_workdir(self, run: str) -> str:
        return f"gpucli-runs/{run}"  # relative to the login directory

    def default_python(self) -> str:
        return "python3"

    def open(self, record: RunRecord, *, connect_timeout_s: float = 20.0) -> Remote:
        return open_remote(record, connect_timeout_s=connect_timeout_s)

    def endpoint(self, host: str | None, identity_file: str | None) -> SshTarget:
        """The endpoint of ``--host user@host[:port]`` (and ``--identity``)."""
        if not host:
            raise UsageError("--provider ssh needs --host user@host[:port] (or a Host name of ~/.ssh/config)")

        return target_from_config(host.strip(), identity_file) or parse_target(host, identity_file=identity_file)

    def interactive_shell(self, record: RunRecord) -> tuple[list[str], str | None]:
        return ssh_shell_argv(record)
