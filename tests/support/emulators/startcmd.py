"""A container's start command, run by the emulators every time they start a pod's container (the test
switch ``run_start_commands``; off by default: the emulators' pods run as this machine's user, and most
tests need nothing started in them).

Every start, not the first only, as the services do: vast "/root/onstart.sh runs automatically on
container startup" (vast-ai/docs guides/reference/faq/instances.mdx); RunPod's start command "overrides
the default CMD" (runpod/docs pods/templates/manage-templates.mdx L27), and a container's CMD runs at
each start of the container: the first, a stopped pod started again (``POST /v2/pods/{id}/action``
``start``), a restart (``restart``, or the host's: :meth:`RunPodEmulator.restart_container`).

What runs: RunPod's create ``args`` ("Arguments passed to the container entrypoint", runpod/docs
api-reference-v2/openapi.json ``BaseContainerConfig``), split as a shell would; vast's ``onstart``
(run at container start, vast-ai/docs guides/instances: the instance's on-start script), with ``sh -c``.
The process gets the pod's provider environment (its id and its own scoped key), ``HOME`` in the pod's
folder and the pod's marker, so the pod going down kills it as it kills everything else in the pod.
A vast container started again (outbid, then resumed) goes through ``VastEmulator.resume``, which boots
it here (its older switch ``run_onstart`` runs the onstart at resumes only).
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from typing import Any

from tests.support.emulators.common import EmuPod
from tests.support.sshd import SshServer


def start_command(emu: Any, pod: EmuPod) -> list[str] | None:
    if emu.provider == "vast":
        script = emu.onstart.get(pod.pod_id)
        return ["/bin/sh", "-c", script] if script else None
    with emu.lock:
        bodies = [b for m, p, b in emu.requests if m == "POST" and p == "/v2/pods" and isinstance(b, dict)
                  and b.get("name") == pod.label]
    args = bodies[-1].get("args") if bodies else None
    return shlex.split(args) if isinstance(args, str) and args.strip() else None


def boot_and_start(emu: Any, pod: EmuPod, boot: Callable[[EmuPod], SshServer]) -> SshServer:
    """``boot`` the pod's container; when it was not running, with ``run_start_commands`` on, run its
    start command (every start: see the module docstring)."""
    starting = pod.sshd is None
    sshd = boot(pod)
    if starting and getattr(emu, "run_start_commands", False):
        emu.started_containers.add(pod.pod_id)
        argv = start_command(emu, pod)
        if argv:
            env = {**emu.pod_environment(pod), "GPUCLI_EMU_POD": pod.marker,
                   "GPUCLI_POD_ENVIRON": str(pod.environ_path), "HOME": str(sshd.root)}
            subprocess.Popen(argv, env=env, cwd=str(sshd.root), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return sshd
