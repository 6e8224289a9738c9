"""The pod's environment for the bundled trainer, on any machine a run starts on (a launch, a resume, a
next run with ``launch --on``, a dev box): ``setup_pod.sh`` with ``envbuild.py`` and the pin file, which
uses the image's Python when it already has the pinned versions and otherwise builds, or reuses, a venv
keyed by the pin file's hash beside the run folders (:mod:`gpucli.runs.trainerenv`). On a machine that has
it, the reuse takes under a second, so a next run on a warm machine pays nothing for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError
from gpucli.runs import podfiles, trainerenv

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

#: A cold build downloads torch with its CUDA libraries (about 3 GB for a cu128 build): generous, with a
#: deadline all the same.
ENV_TIMEOUT_S = 1800


def ensure_environment(host: Host, workdir: str, python: str, on_event: Callable[[str], None]) -> trainerenv.EnvResult:
    """The trainer's pinned environment on ``host``, built or reused; what setup_pod.sh chose (the Python
    the trainer then runs with, and how long it took). A failure is one line."""
    on_event(f"preparing the trainer's environment (torch {trainerenv.pins().torch}; a first build on a "
             "volume takes minutes)")
    podfiles.ENVIRONMENT.write(host, workdir)  # setup_pod.sh, envbuild.py and the pin file
    res = host.run(trainerenv.setup_command(workdir, python), timeout_s=ENV_TIMEOUT_S, check=False)
    env = trainerenv.parse_result(res.stdout)
    if res.exit_code != 0 or env is None:
        detail = [ln for ln in (res.stderr or res.stdout).strip().splitlines() if ln.strip()]
        raise GpucliError(f"pod bootstrap failed: {(detail[-1] if detail else f'exit status {res.exit_code}')[-400:]}")
    on_event(env.describe)
    return env
