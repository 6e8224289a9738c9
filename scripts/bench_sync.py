#!/usr/bin/env python3
"""Sync benchmark: gpucli's sync and download against ``rsync -a`` over ssh and ``scp``, on loopback
or through a delay and bandwidth proxy standing in for an internet path.

Every measurement is a whole command in its own process (Python start-up, imports, connect and
auth included), timed from spawn to exit, against a private OpenSSH sshd on 127.0.0.1 started
here with the test suite's helper. Each case runs ``--runs`` times (interleaved, so drift hits
every tool alike) and the table shows the median wall time, MB/s (10^6 bytes/s), the throughput
ratio against rsync, and gpucli's peak RSS.

    python scripts/bench_sync.py            # 1 GiB file up/down, 10,000 files of 1-16 KiB, no-op
    python scripts/bench_sync.py --small    # 64 MiB, 1,000 files: a smoke run for the tests
    python scripts/bench_sync.py --rtt-ms 20,100,200 --rate-mbs 40 --big-mib 256   # WAN table

With ``--rtt-ms``, every tool connects through ``tests/gpucli/ssh/wan_proxy.py`` (a userspace proxy on
127.0.0.1: that RTT added, each direction capped at ``--rate-mbs``, both shared by all connections of
a tool), one proxy per RTT, and the table adds the share of the link each tool used (the link floor
is size / rate; the whole command's time, connect included, is what is compared with it).

The sshd uses Debian's default sftp subsystem (``/usr/lib/openssh/sftp-server``, started through the
login shell like any command), as on rented pods, so SFTP pays the same shell start-up as an exec.
``--scratch /dev/shm/x`` keeps data and targets in memory, which takes the disk's noise (reclaimed
pages, ext4 inode reuse) out of the comparison.

Why the setup looks the way it does (see shared/reference/ssh-transfer.md): outputs of a previous
run are deleted right before each run, and tree targets are fresh folders never deleted during the
run, because ext4 makes creating files slow right after deleting many (recently-deleted inodes).
On a 2-core machine client and server share the CPU, so these are CPU ceilings, not network ones.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _worker(argv: list[str]) -> int:
    """The gpucli side of one measurement, run as its own process: ``up SRC DST`` or ``down SRC DST``."""
    sys.path.insert(0, str(REPO))
    from gpucli.ssh import Remote, SshTarget, tune_heap_for_downloads

    mode, port, key, src, dst = argv[:5]
    channels = int(argv[5]) if len(argv) > 5 and argv[5] != "auto" else None
    if mode == "down":
        tune_heap_for_downloads()  # as the commands that download do (fetch-best, the mirror)
    target = SshTarget(host="127.0.0.1", port=int(port), user=os.environ["BENCH_USER"], identity_file=key)
    with Remote(target) as r:
        if mode == "up":
            r.sync_up(src, dst, excludes=(), channels=channels)
        else:
            r.download(src, dst, channels=channels)
    # VmHWM is this process's own peak; wait4's ru_maxrss would also count the parent's memory,
    # which a vfork'ed child shares until exec.
    with open("/proc/self/status") as fh:
        peak = next((line.split()[1] for line in fh if line.startswith("VmHWM:")), "0")
    print(f"BENCH_PEAK_RSS_KIB={peak}", file=sys.stderr)
    return 0


def _run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds of one command, and the peak RSS (KiB) our worker reports (0 for others)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    peak = [int(line.split("=")[1]) for line in err.splitlines() if line.startswith("BENCH_PEAK_RSS_KIB=")]
    return elapsed, peak[0] if peak else 0


def _make_data(data: Path, big_bytes: int, n_files: int) -> None:
    import random

    data.mkdir(parents=True, exist_ok=True)
    big = data / "big" / "big.bin"
    if not big.exists() or big.stat().st_size != big_bytes:
        big.parent.mkdir(parents=True, exist_ok=True)
        with open(big, "wb") as fh:
            left = big_bytes
            while left:
                n = min(left, 16 << 20)
                fh.write(os.urandom(n))
                left -= n
    tree = data / f"tree{n_files}"
    if not tree.exists():
        rng = random.Random(1)
        tmp = data / f"tree{n_files}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        for i in range(n_files):
            d = tmp / f"d{i % 100:03d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:05d}.bin").write_bytes(os.urandom(rng.randint(1024, 16 * 1024)))
        tmp.rename(tree)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return _worker(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="64 MiB file and 1,000 files (smoke run)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scratch", type=Path, default=None, help="work folder (default: a temp dir)")
    ap.add_argument("--only", default="", help="comma list of cases: up,down,tree,noop")
    ap.add_argument("--rtt-ms", default="", help="comma list of RTTs: run through the WAN proxy")
    ap.add_argument("--rate-mbs", type=float, default=40.0, help="proxy rate each way, MB/s (10^6)")
    ap.add_argument("--big-mib", type=int, default=0, help="size of the big file (default 1024, 64 small)")
    ap.add_argument("--files", type=int, default=0, help="number of small files (default 10000, 1000 small)")
    ap.add_argument("--channels", default="auto", help="gpucli's channels (default: sized by gpucli)")
    args = ap.parse_args()
    rtts = [float(x) for x in args.rtt_ms.split(",") if x]
    if any(not (r >= 0 and r < 10_000) for r in rtts) or not (0 < args.rate_mbs < 100_000):
        raise SystemExit("--rtt-ms must be 0..10000 and --rate-mbs > 0")

    sys.path.insert(0, str(REPO))
    from tests.gpucli.ssh.wan_proxy import WanProxy
    from tests.support.sshd import SshServer, make_keypair

    big_bytes = (args.big_mib << 20) if args.big_mib else (64 << 20) if args.small else (1 << 30)
    n_files = args.files or (1000 if args.small else 10_000)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="gpucli-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    data, out = scratch / "data", scratch / "out"
    _make_data(data, big_bytes, n_files)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    key, pub = make_keypair(scratch / "client" / "id_ed25519")
    # Debian's default sftp subsystem, as on rented pods: sshd starts it through the login shell.
    sftp_server = "/usr/lib/openssh/sftp-server"
    server = SshServer.start(scratch / "sshd", authorized_keys=[pub],
                             sftp_server=sftp_server if os.path.exists(sftp_server) else "internal-sftp")
    ssh_opts = ["-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    port = server.port  # the proxy's, per RTT, in WAN mode
    host = f"{server.user}@127.0.0.1"
    env = {**os.environ, "GPUCLI_HOME": str(scratch / "home"), "BENCH_USER": server.user}
    me = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    big = data / "big" / "big.bin"
    tree = data / f"tree{n_files}"
    tree_mb = _tree_bytes(tree) / 1e6
    only = set(filter(None, args.only.split(","))) or {"up", "down", "tree", "noop"}
    results: dict[tuple[float, str, str], list[tuple[float, int]]] = {}
    counter = iter(range(10**6))

    def fresh(name: str) -> Path:
        return out / f"{name}{next(counter)}"

    def case_cmds(case: str) -> dict[str, tuple[list[str], Path | None]]:
        """Commands for one run of a case; the Path is the output to delete before the next run."""
        ssh_e = " ".join(["ssh", "-p", str(port), *ssh_opts])
        ch = [args.channels]
        if case == "up":
            d = out / "up"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            return {
                "gpucli": ([*me, "up", str(port), str(key), str(big.parent), str(d / "g"), *ch], d),
                "rsync": (["rsync", "-a", "-e", ssh_e, str(big), f"{host}:{d}/r.bin"], d),
                "scp": (["scp", "-q", "-P", str(port), *ssh_opts, str(big), f"{host}:{d}/s.bin"], d),
            }
        if case == "down":
            d = out / "down"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            return {
                "gpucli": ([*me, "down", str(port), str(key), str(big), str(d / "g.bin"), *ch], d),
                "rsync": (["rsync", "-a", "-e", ssh_e, f"{host}:{big}", str(d / "r.bin")], d),
                "scp": (["scp", "-q", "-P", str(port), *ssh_opts, f"{host}:{big}", str(d / "s.bin")], d),
            }
        if case == "tree":
            cmds: dict[str, tuple[list[str], Path | None]] = {
                "gpucli": ([*me, "up", str(port), str(key), str(tree), str(fresh("tg")), *ch], None),
                "rsync": (["rsync", "-a", "-e", ssh_e, f"{tree}/", f"{host}:{fresh('tr')}/"], None),
            }
            if not rtts:  # scp -r costs round trips per file: 10k files at 100 ms take the best part of an hour
                cmds["scp"] = (["scp", "-q", "-r", "-P", str(port), *ssh_opts, str(tree), f"{host}:{fresh('ts')}"], None)
            return cmds
        # noop: targets synced once beforehand by the same tool
        return {
            "gpucli": ([*me, "up", str(port), str(key), str(tree), str(out / f"noop_g{port}"), *ch], None),
            "rsync": (["rsync", "-a", "-e", ssh_e, f"{tree}/", f"{host}:{out / f'noop_r{port}'}/"], None),
        }

    sizes = {"up": big_bytes / 1e6, "down": big_bytes / 1e6, "tree": tree_mb, "noop": 0.0}
    def measure(rtt: float) -> None:
        if "noop" in only:
            for cmd, _ in case_cmds("noop").values():
                _run(cmd, env)
        if "tree" in only and not args.small:
            print("waiting 20 s so ext4's recently-deleted inode slots cool off ...", file=sys.stderr)
            time.sleep(20)
        for case in ("up", "down", "tree", "noop"):
            if case not in only:
                continue
            for run in range(args.runs):
                cmds = case_cmds(case)
                # rotate the order each run so no tool always goes first
                names = list(cmds)[run % len(cmds):] + list(cmds)[:run % len(cmds)]
                for name in names:
                    cmd, _ = cmds[name]
                    if case in ("up", "down"):
                        for p in (out / case).iterdir():
                            shutil.rmtree(p) if p.is_dir() else p.unlink()
                        # Let the kernel finish with the deleted GiB (ext4 frees its blocks at the
                        # next journal commit) before the clock starts, not during the next tool's run.
                        os.sync()
                        time.sleep(0.5)
                    results.setdefault((rtt, case, name), []).append(_run(cmd, env))
                print(f"  {f'{rtt:g} ms ' if rtts else ''}{case} run {run + 1}/{args.runs}: " + ", ".join(
                    f"{n} {results[(rtt, case, n)][-1][0]:.2f}s" for n in cmds), file=sys.stderr)

    try:
        if not rtts:
            measure(0.0)
        for rtt in rtts:
            with WanProxy(server.port, rtt_s=rtt / 1000, rate_bytes_s=args.rate_mbs * 1e6,
                          lifetime_s=7200) as proxy:
                port = proxy.port
                measure(rtt)
    finally:
        server.stop()

    label = {"up": f"{big_bytes >> 20} MiB file up", "down": f"{big_bytes >> 20} MiB file down",
             "tree": f"{n_files} files up ({tree_mb:.1f} MB)", "noop": f"no-op re-sync of {n_files} files"}
    where = (f"through a {args.rate_mbs:g} MB/s proxy (each way), RTT as given" if rtts else "loopback")
    print(f"\n{where}, median of {args.runs}, wall time of the whole command "
          f"(MB = 10^6 bytes; ratio = rsync time / this time; link = size / rate over the time; "
          f"peak RSS of gpucli's process)\n")
    print("| RTT | case | tool | median s | MB/s | vs rsync | % of link | peak RSS MiB |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for rtt in rtts or [0.0]:
        for case in ("up", "down", "tree", "noop"):
            if (rtt, case, "rsync") not in results:
                continue
            base = statistics.median(t for t, _ in results[(rtt, case, "rsync")])
            for tool in ("gpucli", "rsync", "scp"):
                runs = results.get((rtt, case, tool))
                if not runs:
                    continue
                med = statistics.median(t for t, _ in runs)
                peak = max(r for _, r in runs)
                rss = f"{peak / 1024:.0f}" if peak else "-"
                mbs = f"{sizes[case] / med:.0f}" if sizes[case] else "-"
                link = f"{100 * sizes[case] / med / args.rate_mbs:.0f} %" if rtts and sizes[case] else "-"
                print(f"| {f'{rtt:g} ms' if rtts else '-'} | {label[case]} | {tool} | {med:.2f} | {mbs} | "
                      f"{base / med:.2f}x | {link} | {rss} |")
    if args.scratch is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
