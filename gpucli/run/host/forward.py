"""``gpucli forward RUN PORT[:LOCAL]``: any port of the run's host (Jupyter, a dashboard, an inference
server) on this machine, through the run's already-open, host-key-pinned SSH connection: the
:class:`gpucli.run.files.tensorboard.PortForward` tunnel (``ssh -L``'s direct-tcpip channels), nothing
opened on the pod."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from gpucli.errors import UsageError

_SPEC = re.compile(r"^(\d{1,5})(?::(\d{1,5}))?$")


@dataclass(frozen=True)
class ForwardSpec:
    remote_port: int
    local_port: int  # 0: any free one


def parse_spec(text: str) -> ForwardSpec:
    """``PORT`` (the same port here) or ``PORT:LOCAL`` (``LOCAL`` 0: any free port)."""
    m = _SPEC.match(text.strip())
    if not m:
        raise UsageError(f"cannot read port {text!r}", hint="give PORT or PORT:LOCAL, e.g. 8888 or 8888:9999")
    remote = int(m[1])
    local = int(m[2]) if m[2] is not None else remote
    if not 0 < remote < 65536 or not 0 <= local < 65536:
        raise UsageError(f"port out of range in {text!r} (1-65535; LOCAL may be 0 for any free port)")
    return ForwardSpec(remote, local)


def open_local_port(local_port: int) -> None:
    """A busy local port is one line, before anything connects."""
    if local_port == 0:
        return
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", local_port))
        except OSError as exc:
            raise UsageError(f"local port {local_port} is in use ({exc.strerror})",
                             hint="give another: PORT:LOCAL, or PORT:0 for any free one") from exc
