"""What goes to a run's machine, in one list: each file, where it lands there and what it is for.

Every module that writes one of gpucli's own files to a host reads it from here (the watchdog at a
launch, a resume and a dev box; the own-code runner; the environment builder; the data step; the store
uploader; the GPU sampler; the link probe), so a file added to ``gpucli/pod`` is added here once and
every sender has it. ``tests/gpucli/run/test_podfiles.py`` reads the pod's scripts for the modules they
load by path and checks that each one travels with its loader.

Names are relative to the folder the sender writes into: the run folder (``wd``) unless a bundle says
otherwise. Files on the pod are plain files run by the pod's Python: nothing here imports them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpucli.errors import GpucliError

GPUCLI_DIR = Path(__file__).resolve().parents[1]


class Writes(Protocol):
    """What a bundle needs of a host (:class:`gpucli.providers.registry.Host` has it)."""

    def write_file(self, remote_path: str, data: bytes, mode: int = 0o600) -> None: ...


def trainer_package_dir() -> Path:
    """The bundled trainer's package folder on this machine (synced to ``wd/code/trainer``)."""
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.origin:
        raise GpucliError("the bundled trainer package is not installed", hint="reinstall gpucli")
    return Path(spec.origin).resolve().parent


@dataclass(frozen=True)
class PodFile:
    """One file sent: ``name`` where it lands, ``source`` where it comes from (``pod/…`` and ``store/…``
    under the gpucli package, ``trainer/…`` in the bundled trainer's package)."""

    name: str
    source: str
    mode: int = 0o644
    optional: bool = False  # sent only when this machine has it (the trainer's alert senders)

    @property
    def path(self) -> Path:
        top, _, rest = self.source.partition("/")
        if top == "trainer":
            return trainer_package_dir() / rest
        return GPUCLI_DIR / top / rest

    def data(self) -> bytes:
        return self.path.read_bytes()


@dataclass(frozen=True)
class Bundle:
    """Files that go together, for one purpose; ``beside``: the loaders (file names) that load this
    bundle's files by path when they are there, for the runs that send them (``--nodes``, ``--store``)."""

    key: str
    purpose: str
    files: tuple[PodFile, ...]
    lands: str = "the run folder"
    beside: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.files)

    def file(self, name: str) -> PodFile:
        return next(f for f in self.files if f.name == name)

    def write(self, host: Writes, folder: str) -> None:
        """Every file of the bundle into ``folder`` on the host (an optional one only when it is here)."""
        for f in self.files:
            if f.optional and not f.path.is_file():
                continue
            host.write_file(f"{folder}/{f.name}", f.data(), mode=f.mode)


@dataclass(frozen=True)
class PodTree:
    """A folder synced whole (``sync_up``): ``name`` where it lands, without ``excludes``."""

    key: str
    purpose: str
    name: str
    excludes: tuple[str, ...]

    def source(self) -> Path:
        return trainer_package_dir()


_PROCID = PodFile("procid.py", "pod/procid.py")
_WATCHDOG = PodFile("watchdog.py", "pod/watchdog.py", 0o755)
# loaded by the watchdog from beside it: how an end is said, the idle-GPU stop, the slow-run check, the
# provider calls that end the pod with its own key
_WATCHDOG_PARTS = (PodFile("endwords.py", "pod/endwords.py"), PodFile("gpuidle.py", "pod/gpuidle.py"),
                   PodFile("slowrun.py", "pod/slowrun.py"), PodFile("podend.py", "pod/podend.py"))

WATCHDOG = Bundle("watchdog", "the run's watchdog (caps, stall, the machine's end) and the process identity it "
                  "loads (gpucli.run.starting.start.start_watchdog, the resume script)", (_WATCHDOG, _PROCID, *_WATCHDOG_PARTS))
PEERS = Bundle("peers", "a run over several machines: the watchdog's watch of the other nodes",
               (PodFile("peers.py", "pod/peers.py"),), beside=("watchdog.py",))
BOX = Bundle("box", "a dev box: its idle watch, which ends the machine through the watchdog's code",
             (PodFile("idlewatch.py", "pod/idlewatch.py", 0o755), _WATCHDOG, _PROCID, *_WATCHDOG_PARTS))
ENVIRONMENT = Bundle("environment", "the bundled trainer's pinned environment, built or reused (setup_pod.sh "
                     "runs envbuild.py with the pin file)",
                     (PodFile("setup_pod.sh", "pod/setup_pod.sh", 0o755), PodFile("envbuild.py", "pod/envbuild.py"),
                      PodFile("requirements.txt", "trainer/requirements.txt")))
DATA = Bundle("data", "the data step before the trainer: --data downloaded, hashed and prepared",
              (PodFile("fetch.py", "pod/fetch.py", 0o755),))
ADOPT = Bundle("adopt", "launch --on: the base run's prepared data kept in the machine's cache under fetch.py's key",
               (PodFile("fetch.py", "pod/fetch.py"),), lands="the base run's folder, under .adopt/")
OWN_CODE = Bundle("own", "your own command's runner: its console turned into metrics rows, alerts from the "
                  "trainer's senders (standard library only)",
                  (PodFile("jobrun.py", "pod/jobrun.py"), PodFile("logparse.py", "pod/logparse.py"),
                   PodFile("terminal.py", "pod/terminal.py"), PodFile("framefiles.py", "pod/framefiles.py"),
                   PodFile("jobalerts.py", "pod/jobalerts.py"), PodFile("jobvenv.py", "pod/jobvenv.py"),
                   PodFile("notify.py", "trainer/watch/notify.py", optional=True),
                   PodFile("webhook.py", "trainer/watch/webhook.py", optional=True),
                   PodFile("webhooks.py", "trainer/spec/webhooks.py", optional=True)))
STORE = Bundle("store", "--store: the checkpoint uploader, and the flush the watchdog's end waits for",
               (PodFile("objstore.py", "store/objstore.py"), PodFile("storelocal.py", "store/storelocal.py"),
                PodFile("storesync.py", "store/storesync.py"),
                PodFile("storeflush.py", "pod/storeflush.py")), beside=("watchdog.py",))
GPU_SAMPLER = Bundle("gpustats", "the GPU use sampler beside the job (gpu.jsonl)",
                     (PodFile("gpustats.py", "pod/gpustats.py"),))
LINK_PROBE = Bundle("linkprobe", "your own machines' link measured at a launch over several",
                    (PodFile("linkprobe.py", "pod/linkprobe.py", 0o600),))
#: Run from standard input (``python -``), never written: the identity check beside each signal.
ON_STDIN = Bundle("stdin", "a process's identity, checked in the same command as its signal",
                  (_PROCID,), lands="nowhere: piped to the host's Python")

TRAINER = PodTree("trainer", "the bundled trainer's code", "code/trainer", ("__pycache__", "*.pyc"))

BUNDLES = (WATCHDOG, PEERS, BOX, ENVIRONMENT, DATA, ADOPT, OWN_CODE, STORE, GPU_SAMPLER, LINK_PROBE, ON_STDIN)
