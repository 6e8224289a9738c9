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

``--warm ROUNDS --fresh-env [--wheels DIR] [--mb MB]``: what a pod pays. The cold launch goes to an sshd on
127.0.0.1 whose Python (``--python``: this interpreter as a bare venv) lacks the trainer's packages, so
setup_pod.sh builds the pinned venv beside the run folders as on a pod: pip with no cache and no pip config
of this machine, torch's CPU build from PyTorch's index (or from ``--wheels DIR``, a folder holding the
pinned torch wheel, where that index cannot be reached), its other packages from PyPI; with a ``--data``
folder of MB megabytes of real text (default 4: this Python's standard library sources) to sync and
prepare. Then one line of the trainer is changed (in a copy of gpucli and the trainer, which the launches
run from) and ``launch --on`` that run measures the warm launch; what each launch said about the
environment, the code and the data is printed with the times.
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
SRC = [REPO]  # where gpucli and its trainer are imported from (--fresh-env: a copy, so a line can be changed)



def _medians(cold: list, warm: list) -> tuple[float, float] | None:
    """The median cold and warm times of the rounds that reached a first step; None without both."""
    c = sorted(x for x in cold if x is not None)
    w = sorted(x for x in warm if x is not None)
    return (c[len(c) // 2], w[len(w) // 2]) if c and w else None

def gpucli(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    # This checkout's gpucli (an installed `gpucli` on PATH may be another version).
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC[0]), env.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "gpucli.cli.app", *args], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, cwd=SRC[0],  # `-m` puts the cwd first on sys.path
                          timeout=timeout)


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
    if (m := _medians(cold, warm)) is not None:
        mc, mw = m
        print(f"median launch to first step: cold {mc:.1f} s, warm {mw:.1f} s ({mw / mc:.0%} of cold)")
    return 0


# What the launch says about the three things a warm launch should skip.
_SAID = ("trainer environment", "trainer code:", "data:", "code: copied", "prepared")


def _said(r: subprocess.CompletedProcess) -> list[str]:
    return [" ".join(ln.split()) for ln in (r.stdout + r.stderr).splitlines() if any(k in ln for k in _SAID)]


def _corpus(folder: Path, mb: float) -> int:
    """A few MB of real text: this Python's standard library sources, ~1 MB a file."""
    import sysconfig

    folder.mkdir(parents=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunk, n, total = [], 0, 0
    for f in sorted(stdlib.glob("*.py")):
        chunk.append(f.read_text(errors="replace"))
        if sum(map(len, chunk)) >= 1 << 20 or total + sum(map(len, chunk)) >= mb * (1 << 20):
            text = "".join(chunk)
            (folder / f"part{n:02d}.txt").write_text(text)
            total, n, chunk = total + len(text.encode()), n + 1, []
        if total >= mb * (1 << 20):
            break
    return total


def fresh_main(rounds: int, wheels: str | None, mb: float) -> int:
    """``--fresh-env``: the cold launch goes to an SSH host whose Python lacks the trainer's packages, so
    setup_pod.sh builds the pinned venv as on a pod (pip, no cache: a new pod has none), with a real --data
    corpus to sync and prepare; the warm launch is ``launch --on`` that run after one line of the trainer
    was changed here."""
    sys.path.insert(0, str(REPO))
    from tests.support.sshd import SshServer, make_keypair

    home = Path(tempfile.mkdtemp(prefix="gpucli-bench-fresh-"))
    src = home / "src"  # a copy of gpucli and its trainer: the line changed between the launches is the copy's
    for pkg in ("gpucli", "trainer"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    SRC[0] = src
    image = home / "image"  # the "image's Python": this interpreter without any site package
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(image)],
                   check=True)
    image_py = str(image / "bin" / "python")
    if subprocess.run([image_py, "-c", "import torch"], capture_output=True).returncode == 0:
        print("the bare Python has torch: nothing would be built", file=sys.stderr)
        return 1
    size = _corpus(home / "corpus", mb)
    # The host's pip as a fresh pod's: no config of this machine, no cache; torch's CPU build from PyTorch's
    # index, or from --wheels DIR (a folder holding the pinned torch wheel) where that index is not reachable.
    host_env = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if os.environ.get("PIP_CERT"):
        host_env["PIP_CERT"] = os.environ["PIP_CERT"]
    env = dict(os.environ, GPUCLI_HOME=str(home / "gpucli-home"), GPUCLI_ENV_INSTALLER="pip",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    if wheels:
        host_env["PIP_FIND_LINKS"] = str(Path(wheels).resolve())
        env["GPUCLI_TORCH_INDEX"] = "none"
    key, pub = make_keypair(home / "client" / "id_ed25519")
    server = SshServer.start(home / "sshd", authorized_keys=[pub], set_env=host_env)
    where = ["--provider", "ssh", "--host", f"{server.user}@127.0.0.1:{server.port}", "--identity", str(key),
             "--python", image_py]
    common = ["--profile", "cpu", "--phase", "fast", "--steps", "2000", "--data", str(home / "corpus")]
    print(f"corpus {size / 1e6:.1f} MB of text; torch from {wheels or 'PyTorch index'}; pip without cache",
          flush=True)
    edited = src / "trainer" / "train.py"
    cold, warm, launched = [], [], []
    try:
        for i in range(rounds):
            load = "/".join(f"{x:.1f}" for x in os.getloadavg())
            t0 = time.monotonic()
            launched.append(f"cold{i}")
            r = gpucli("launch", *where, *common, "--name", f"cold{i}",
                       "--workdir", str(home / f"m{i}" / f"cold{i}"), env=env, timeout=1800)
            if r.returncode != 0:
                print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
                return 1
            cold.append(_first_step(f"cold{i}", env, t0, limit_s=1800))
            said_cold = _said(r)
            _stopped(f"cold{i}", env)
            with edited.open("a") as fh:  # the one line a user changes before trying again
                fh.write(f"# round {i + 1}: one line changed before the next run\n")
            t0 = time.monotonic()
            launched.append(f"warm{i}")
            r = gpucli("launch", "--on", f"cold{i}", *common, "--name", f"warm{i}", env=env, timeout=1800)
            if r.returncode != 0:
                print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
                return 1
            warm.append(_first_step(f"warm{i}", env, t0, limit_s=1800))
            said_warm = _said(r)
            console = home / f"m{i}" / f"warm{i}" / "console.log"
            reused = console.exists() and "reusing prepared data" in console.read_text(errors="replace")
            _stopped(f"warm{i}", env)
            shown = [f"{x:.1f} s" if x is not None else "no step" for x in (cold[-1], warm[-1])]
            print(f"round {i + 1} (load {load}): cold {shown[0]}, warm {shown[1]} to the first step", flush=True)
            print("  cold: " + "\n  cold: ".join(said_cold), flush=True)
            print("  warm: " + "\n  warm: ".join(said_warm), flush=True)
            print(f"  warm: trainer log says prepared data reused: {reused}", flush=True)
    finally:
        for name in launched:  # a round cut short leaves nothing running
            gpucli("down", name, env=env)
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    if (m := _medians(cold, warm)) is not None:
        mc, mw = m
        ratios = sorted(b / a for a, b in zip(cold, warm, strict=True) if a and b)
        print(f"median launch to first step: cold {mc:.1f} s, warm {mw:.1f} s; median warm/cold per round "
              f"{ratios[len(ratios) // 2]:.0%}")
    return 0


def main() -> int:
    if "--warm" in sys.argv[1:]:
        rest = sys.argv[sys.argv.index("--warm") + 1:]
        rounds = next((int(a) for a in rest if a.isdigit()), 3)
        if "--fresh-env" in rest:
            wheels = rest[rest.index("--wheels") + 1] if "--wheels" in rest else None
            mb = float(rest[rest.index("--mb") + 1]) if "--mb" in rest else 4.0
            return fresh_main(rounds, wheels, mb)
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
