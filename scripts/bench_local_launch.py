#!/usr/bin/env python3
"""How fast the embedded demo shows it works, as a user runs it (whole commands, a fresh GPUCLI_HOME):

    gpucli launch --provider local --profile cpu --phase fast
    gpucli tail --no-follow --json      (polled)  -> seconds to the first metrics row, to the first val row
    gpucli fetch-best                             -> weights + meta.json, sha256-verified
    gpucli down

Targets on a 2-core machine: first metrics within 30 s, a validation row within 2 minutes.

``--own`` measures your own code instead (a script that prints nanoGPT-style lines when told to):

    gpucli launch --provider local --code DIR --run "python job.py"
    gpucli tail --no-follow --json  (polled)  -> seconds from the launch to the first output line's row
                                                 (target <= 2 s), from a new line to its row (target <= 2 s)

``--own hf`` / ``--own lightning`` / ``--own lightning-tqdm`` run the real Hugging Face Trainer or
Lightning Trainer scripts of tests/e2e/owncode/frameworks (tiny models, a few hundred steps) the same way
and follow ``gpucli tail --json``: seconds from the launch to the first metric row, and for each row
the lag from when the framework logged it (a TensorBoard event's wall_time, else when the runner wrote
the row) to its arrival in tail; the rows' sources are counted.

``--warm [ROUNDS]`` measures the next run on the same machine against a fresh one, launch to first step:

    gpucli launch --provider local --profile cpu --name coldN --workdir M_N/coldN ...   (its demo corpus
    gpucli down coldN                                                                    prepared afresh)
    gpucli launch --on coldN --name warmN ...      (code copied there, the prepared corpus reused)

each from the launch command's start to its first training row in ``tail --json``, ROUNDS times (default 3),
cold and warm alternating. ``--warm ROUNDS ssh``: the same over an OpenSSH sshd on 127.0.0.1 (a host gpucli
sets up: the cold run pays setup_pod.sh, the warm one finds its stamp).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def gpucli(*args: str, env: dict) -> subprocess.CompletedProcess:
    # This checkout's gpucli (an installed `gpucli` on PATH may be another version).
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "gpucli.cli.app", *args], capture_output=True, text=True, env=env,
                          timeout=300)


# Prints one loss line at once, then one more each time the file "go" appears (and removes it).
OWN_JOB = """
import os, time
print("iter 0: loss 4.0000, time 1.00ms, mfu -100.00%", flush=True)
for i in range(1, 6):
    while not os.path.exists("go"):
        time.sleep(0.01)
    os.remove("go")
    print(f"iter {i}: loss {4 - i * 0.1:.4f}, time 1.00ms, mfu -100.00%", flush=True)
"""


def own_main() -> int:
    home = Path(tempfile.mkdtemp(prefix="gpucli-bench-own-"))
    env = dict(os.environ, GPUCLI_HOME=str(home))
    code = home / "code"
    code.mkdir()
    (code / "job.py").write_text(OWN_JOB)

    def steps() -> set[int]:
        out = gpucli("tail", "own", "--no-follow", "--json", env=env).stdout
        return {r["step"] for r in map(json.loads, filter(str.strip, out.splitlines())) if r.get("kind") == "train"}

    def wait_step(step: int, since: float) -> float | None:
        while time.monotonic() - since < 30:
            if step in steps():
                return time.monotonic() - since
        return None

    t0 = time.monotonic()
    r = gpucli("launch", "--provider", "local", "--code", str(code), "--run", f"{sys.executable} job.py",
               "--name", "own", env=env)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    t_launch = time.monotonic() - t0
    try:
        t_first = wait_step(0, t0)
        lags = []
        for i in range(1, 6):
            t1 = time.monotonic()
            (Path(home) / "local-runs" / "own" / "code" / "go").write_text("")
            lags.append(wait_step(i, t1))
    finally:
        gpucli("down", "own", env=env)
    print(f"launch command returned after {t_launch:.2f} s")
    print(f"first output line in tail after {t_first:.2f} s from the launch (target <= 2 s)" if t_first
          else "first output line not in tail within 30 s")
    shown = ", ".join(f"{x:.2f}" if x is not None else "never" for x in lags)
    print(f"a new line reached tail after {shown} s (target <= 2 s; each includes one `gpucli tail` start)")
    shutil.rmtree(home, ignore_errors=True)
    return 0


FRAMEWORK_RUNS = {
    "hf": "hf_clm.py --steps 300 --sleep 0.05",
    "lightning": "lightning_lm.py --epochs 4 --batches 40 --sleep 0.05",
    "lightning-tqdm": "lightning_lm.py --epochs 4 --batches 40 --sleep 0.05 --bar tqdm",
}


def framework_main(kind: str) -> int:
    home = Path(tempfile.mkdtemp(prefix=f"gpucli-bench-{kind}-"))
    env = dict(os.environ, GPUCLI_HOME=str(home))
    code = home / "code"
    shutil.copytree(REPO / "tests" / "e2e" / "owncode" / "frameworks", code)
    t0 = time.monotonic()
    r = gpucli("launch", "--provider", "local", "--profile", "cpu", "--code", str(code), "--run",
               f"{sys.executable} {FRAMEWORK_RUNS[kind]}", "--name", "fw", env=env)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    t_launch = time.monotonic() - t0
    genv = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    tail = subprocess.Popen([sys.executable, "-m", "gpucli.cli.app", "tail", "fw", "--json"], env=genv,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    t_first, lags, sources = None, [], {}
    try:
        assert tail.stdout is not None
        deadline = time.monotonic() + 600
        for line in tail.stdout:
            now_wall, now = time.time(), time.monotonic()
            row = json.loads(line) if line.strip().startswith("{") else {}
            if row.get("kind") in ("train", "val"):
                t_first = t_first if t_first is not None else now - t0
                lags.append(now_wall - float(row.get("logged_at") or row.get("time") or now_wall))
                sources[row.get("source")] = sources.get(row.get("source"), 0) + 1
            if row.get("event") == "finished" or now > deadline:
                break
    finally:
        tail.terminate()
        tail.wait(10)
        gpucli("down", "fw", env=env)
    lags.sort()
    print(f"{kind}: launch command returned after {t_launch:.1f} s")
    print(f"{kind}: first metric row in tail {t_first:.1f} s after the launch" if t_first is not None
          else f"{kind}: no metric row")
    if lags:
        print(f"{kind}: logged -> in tail: median {lags[len(lags) // 2]:.2f} s, max {lags[-1]:.2f} s over "
              f"{len(lags)} rows; sources {sources}")
    shutil.rmtree(home, ignore_errors=True)
    return 0


def _first_step(name: str, env: dict, t0: float, limit_s: float = 600) -> float | None:
    while time.monotonic() - t0 < limit_s:
        out = gpucli("tail", name, "--no-follow", "--json", env=env).stdout
        if any(json.loads(x).get("kind") == "train" for x in out.splitlines() if x.strip()):
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def _stopped(name: str, env: dict) -> None:
    gpucli("down", name, env=env)
    for _ in range(300):
        st = json.loads(gpucli("status", name, "--json", env=env).stdout or "{}")
        if st.get("state") != "running":
            return
        time.sleep(0.5)


def warm_main(rounds: int, over_ssh: bool) -> int:
    home = Path(tempfile.mkdtemp(prefix="gpucli-bench-warm-"))
    env = dict(os.environ, GPUCLI_HOME=str(home), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    common = ["--profile", "cpu", "--phase", "fast", "--steps", "2000"]
    where = ["--provider", "local"]
    server = None
    if over_ssh:  # an OpenSSH sshd on 127.0.0.1 (the tests' fixture): a host gpucli sets up (setup_pod.sh)
        sys.path.insert(0, str(REPO))
        from tests.support.sshd import SshServer, make_keypair

        key, pub = make_keypair(home / "client" / "id_ed25519")
        server = SshServer.start(home / "sshd", authorized_keys=[pub])
        where = ["--provider", "ssh", "--host", f"{server.user}@127.0.0.1:{server.port}", "--identity", str(key),
                 "--python", sys.executable]
    cold, warm = [], []
    try:
        for i in range(rounds):
            t0 = time.monotonic()
            r = gpucli("launch", *where, *common, "--name", f"cold{i}",
                       "--workdir", str(home / f"m{i}" / f"cold{i}"), env=env)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
            cold.append(_first_step(f"cold{i}", env, t0))
            _stopped(f"cold{i}", env)
            t0 = time.monotonic()
            r = gpucli("launch", "--on", f"cold{i}", *common, "--name", f"warm{i}", env=env)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
            warm.append(_first_step(f"warm{i}", env, t0))
            _stopped(f"warm{i}", env)
            print(f"round {i + 1}: cold {cold[-1]:.1f} s, warm {warm[-1]:.1f} s to the first step", flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(home, ignore_errors=True)
    c = sorted(x for x in cold if x is not None)
    w = sorted(x for x in warm if x is not None)
    if c and w:
        mc, mw = c[len(c) // 2], w[len(w) // 2]
        print(f"median launch to first step: cold {mc:.1f} s, warm {mw:.1f} s ({mw / mc:.0%} of cold)")
    return 0


def main() -> int:
    if "--warm" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--warm") + 1:]
        rounds = next((int(a) for a in rest if a.isdigit()), 3)
        return warm_main(rounds, "ssh" in rest)
    if "--own" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--own") + 1:]
        if rest and rest[0] in FRAMEWORK_RUNS:
            return framework_main(rest[0])
        return own_main()
    home = Path(tempfile.mkdtemp(prefix="gpucli-bench-"))
    env = dict(os.environ, GPUCLI_HOME=str(home))
    t0 = time.monotonic()
    r = gpucli("launch", "--provider", "local", "--profile", "cpu", "--phase", "fast", "--name", "bench", env=env)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    t_launch = time.monotonic() - t0
    t_first = t_val = None
    try:
        while time.monotonic() - t0 < 300 and (t_first is None or t_val is None):
            out = gpucli("tail", "bench", "--no-follow", "--json", env=env).stdout
            rows = [json.loads(x) for x in out.splitlines() if x.strip()]
            if t_first is None and any(x.get("kind") == "train" for x in rows):
                t_first = time.monotonic() - t0
            if t_val is None and any(x.get("kind") == "val" for x in rows):
                t_val = time.monotonic() - t0
            time.sleep(0.5)
        # The first checkpoint comes at checkpoint_interval (100 steps for the fast phase on CPU).
        fetched = None
        while time.monotonic() - t0 < 600:
            r = gpucli("fetch-best", "bench", "--dest", str(home / "fetched"), "--json", env=env)
            if r.returncode == 0:
                fetched = json.loads(r.stdout)
                break
            time.sleep(2)
        t_fetch = time.monotonic() - t0
    finally:
        gpucli("down", "bench", env=env)
    print(f"launch command returned after {t_launch:.1f} s")
    print(f"first metrics row after {t_first:.1f} s (target <= 30 s)" if t_first else "no metrics row in 300 s")
    print(f"first validation row after {t_val:.1f} s (target <= 120 s)" if t_val else "no validation row in 300 s")
    if fetched:
        print(f"fetch-best: {fetched['checkpoint']} (val loss {fetched['val_loss']:.3f}) "
              f"{', '.join(fetched['files'])} after {t_fetch:.1f} s")
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
