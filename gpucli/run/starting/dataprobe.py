"""The preflight's download check: the rate at which the rented machine reads the run's data from its source.

For a run whose ``--data`` is downloaded on the machine (``https://`` files, ``hf://`` datasets), the host
reads the start of the first file (an HTTP ``Range`` of at most :data:`PROBE_BYTES`, for at most
:data:`PROBE_S` seconds: never the whole file) with python3's own ``urllib``, over the host's ``run``. The
rate, the data's size (as :mod:`gpucli.run.files.transfer` found it) and the time the data takes at that rate go in
the run record; ``health.yaml``'s ``min_download_mb_s`` and ``max_download_share`` (of ``--hours``) are the
bars. A private Hub dataset's token is read from the run's 0600 env file on the host, never a command line.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from gpucli.errors import GpucliError
from gpucli.run.files.transfer import data_leg, hf_files
from gpucli.runs.health import Thresholds

if TYPE_CHECKING:
    from gpucli.providers.target import Host
    from gpucli.run.inputs.datasources import DataSource

PROBE_BYTES = 16 << 20  # a few MB: long enough past the TCP slow start to be a rate
PROBE_S = 5.0  # the read stops here, however far it got

# Run on the host: argv = url, bytes, seconds, "hf" or "url". One JSON line, even for a failure.
_SCRIPT = r"""
import json, os, sys, time, urllib.request
url, limit, secs, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
headers = {"Range": "bytes=0-%d" % (limit - 1), "User-Agent": "gpucli-preflight"}
if kind == "hf" and os.environ.get("HF_TOKEN"):
    headers["Authorization"] = "Bearer " + os.environ["HF_TOKEN"]
t0 = time.monotonic(); got = 0; first = None; first_bytes = 0
try:
    resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=secs)
except Exception as exc:
    print(json.dumps({"error": ("%s: %s" % (type(exc).__name__, exc))[:300]}))
    sys.exit(0)
status = resp.status
try:
    while got < limit and time.monotonic() - t0 < secs:
        chunk = resp.read1(min(1 << 16, limit - got))
        if not chunk:
            break
        if first is None:
            first, first_bytes = time.monotonic(), len(chunk)
        got += len(chunk)
except OSError:
    pass  # the source stalled past the deadline (a socket timeout): the rate is what came until then
finally:
    resp.close()
end = time.monotonic()
# the rate from the first byte on: the connection's set-up is latency, not bandwidth
span, moved = (end - first, got - first_bytes) if first is not None and end - first > 0.05 else (end - t0, got)
print(json.dumps({"bytes": got, "seconds": round(end - t0, 3), "rate_mb_s": moved / max(span, 1e-3) / 1e6,
                  "status": status}))
"""


@dataclass(frozen=True)
class DownloadProbe:
    """What the host's read of the data's first file measured, against the bars."""

    ok: bool
    mb_s: float | None = None
    data_gb: float | None = None  # the whole data, as sized before the launch (None: not known)
    eta_s: float | None = None  # the data at that rate
    error: str | None = None


def first_url(source: DataSource) -> tuple[str, str] | None:
    """(the URL of the data's first file, its kind), or None when the data is not downloaded on the host
    or its files could not be listed."""
    if source.kind == "url" and source.downloads:
        return source.downloads[0].url, "url"
    if source.kind == "hf" and source.repo:
        files, _ = hf_files(source.repo, source.pattern)
        if not files:
            return None
        biggest = max(files, key=lambda f: f[1])[0]  # the longest read: the best rate estimate
        endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        # huggingface_hub's file URL (hf_hub_url): {endpoint}/datasets/{repo}/resolve/{revision}/{path}
        return f"{endpoint}/datasets/{source.repo}/resolve/main/{quote(biggest)}", "hf"
    return None


def measure(host: Host, source: DataSource, *, python: str, env_file: str | None, bars: Thresholds,
            max_hours: float | None) -> DownloadProbe | None:
    """The host's download rate from the data's source, held to the bars; None when the data is not
    downloaded on the host (a local folder, ``pod:``) or its first file is not known."""
    target = first_url(source)
    if target is None:
        return None
    url, kind = target
    prefix = f"set -a && . {shlex.quote(env_file)} && set +a && " if env_file else ""
    cmd = (f"{prefix}{shlex.quote(python)} -c {shlex.quote(_SCRIPT)} {shlex.quote(url)} {PROBE_BYTES} "
           f"{PROBE_S:g} {kind}")
    try:
        res = host.run(cmd, timeout_s=PROBE_S + 60, check=False)
    except GpucliError as exc:  # no answer within the deadline: as good as no download
        return DownloadProbe(ok=False, error=f"the host's download check gave no answer ({exc})")
    try:
        data = json.loads((res.stdout.strip().splitlines() or ["{}"])[-1])
    except ValueError:
        data = {}
    if not isinstance(data, dict) or res.exit_code != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()
        return DownloadProbe(ok=False, error=f"the host's download check failed: {(tail or ['no output'])[-1][:200]}")
    leg = data_leg(source)
    gb = leg.gb if leg is not None else None
    if "error" in data or not isinstance(data.get("rate_mb_s"), (int, float)):
        return DownloadProbe(ok=False, data_gb=gb,
                             error=f"the host could not read {url.split('?')[0]}: {str(data.get('error'))[:200]}")
    return judge(float(data["rate_mb_s"]), gb, bars, max_hours)


def judge(mb_s: float, data_gb: float | None, bars: Thresholds, max_hours: float | None) -> DownloadProbe:
    """A measured rate held to ``min_download_mb_s``, and the data's time at it to ``max_download_share``
    of ``--hours`` (when both are known)."""
    mb_s = round(mb_s, 2)
    eta = round(data_gb * 1e3 / mb_s, 1) if data_gb is not None and mb_s > 0 else None
    error = None
    if mb_s < bars.min_download_mb_s:
        error = f"the data downloads at {mb_s:g} MB/s here (the bar: {bars.min_download_mb_s:g} MB/s)"
    elif eta is not None and max_hours and eta > bars.max_download_share * max_hours * 3600:
        error = (f"the data ({data_gb:.2f} GB) takes {eta / 60:.0f} min at {mb_s:g} MB/s, over "
                 f"{bars.max_download_share:.0%} of --hours {max_hours:g}")
    return DownloadProbe(ok=error is None, mb_s=mb_s, data_gb=data_gb, eta_s=eta, error=error)
