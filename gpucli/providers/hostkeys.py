"""Host keys of cloud pods: pinned per pod, never per host:port for good.

Cloud endpoints are reused: vast.ai's SSH proxies hand the same ``host:port`` to the next instance and
RunPod reuses public ports, so a key pinned for ``[host]:port`` in gpucli's known_hosts would refuse
the next, legitimate pod on that address. A pod's key is therefore pinned at first contact in the run
record (``ssh.host_key``, written by the launch) and in a known_hosts file of that pod alone
(``GPUCLI_HOME/pod_keys/<provider>-<pod id>``, which ``gpucli ssh`` also uses); the global file is
never written for a pod. A changed key is refused within one pod's life; ``gpucli down`` forgets the
pod's file, and a new pod (resume, recover) starts with no pin.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from gpucli.settings import home
from gpucli.ssh.target import append_known_host, read_known_hosts, split_key

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def pod_keys_dir() -> Path:
    return home() / "pod_keys"


def _pod_file(provider: str, pod: str) -> Path:
    return pod_keys_dir() / f"{_UNSAFE.sub('_', provider)}-{_UNSAFE.sub('_', pod)}.known_hosts"


def pod_known_hosts(record: RunRecord) -> Path:
    """The known_hosts file of the run's current pod (by pod id; by run name before the id is known)."""
    return _pod_file(record.provider, record.instance_id or f"run-{record.name}")


def pod_known_hosts_for_ssh(record: RunRecord) -> Path:
    """The pod's known_hosts, holding the record's pinned key, for OpenSSH (StrictHostKeyChecking=yes)."""
    path = pod_known_hosts(record)
    if record.ssh is not None and record.ssh.host_key:
        key_type, key_b64 = split_key(record.ssh.host_key)
        name = record.ssh.known_hosts_name
        if not any((k.key_type, k.key_b64) == (key_type, key_b64) for k in read_known_hosts(path, name)):
            append_known_host(path, name, key_type, key_b64)
    return path


def forget_pod_keys(record: RunRecord) -> None:
    """Forget the host keys of every pod the run had (its current one and those before a resume)."""
    pods = [p for p in (record.instance_id, *record.previous_instances) if p]
    for path in [_pod_file(record.provider, p) for p in pods] + [_pod_file(record.provider, f"run-{record.name}")]:
        path.unlink(missing_ok=True)
