"""The pod guards itself from its first moment: a boot guard sent in the create call itself.

Between the provider's create call and the launch's first SSH command only the laptop's process guards a
new pod; a SIGKILLed launch would leave it billing until ``down --strays``. So the create call carries
a start command (vast ``onstart``; RunPod v2 ``args``) that starts this guard in the container before
anything else. It waits for gpucli's hand-over, the pod-side watchdog's ``watchdog.json`` written after
the guard started (gpucli/pod/watchdog.py writes it the moment it runs), and exits. Until then the run
folder's ``.launching`` marker is the launch's heartbeat (gpucli.run.starting.start touches it at each step):
each touch moves the deadline to the touch plus the window. With no hand-over by the deadline the
guard ends its own pod through the provider's API with the pod-scoped credential, as the watchdog
does, retrying for up to 15 minutes.

A start command runs at *every* container start, not once (vast: "/root/onstart.sh runs automatically
on container startup", vast-ai/docs guides/reference/faq/instances.mdx; RunPod: the create call's
``args`` are the container's start command, which "overrides the default CMD",
pods/templates/manage-templates.mdx L27, and a container's CMD runs whenever it starts: a pod that ``--on-end stop`` kept and a
user starts to copy its checkpoints, the zero-GPU "data recovery" start of
pods/troubleshooting/zero-gpus.mdx, a host-side restart). So the guard tells the launch it was made for
from a restart by the run folder: empty (or only the launch's marker) at the guard's start, this is
that launch, and with nothing of the run on the pod by the deadline (no checkpoint) the pod is
*terminated* (a stopped pod would still bill its disk): RunPod ``POST /v2/pods/{id}/action``
``{"action": "terminate"}``, then ``DELETE /v2/pods/{id}``, then GraphQL ``podTerminate``; vast
``DELETE /api/v0/instances/{id}/``. A folder that already holds anything of the run means a restart:
the run's resume hook (vast onstart, RunPod args; gpucli/run/inputs/resumescript.py) starts the watchdog of a
live run, which hands over as at launch, and otherwise the guard only ever *stops* the pod, never
terminates it (its disk holds the checkpoints): RunPod ``{"action": "stop"}`` (a 409 "not valid now",
the pod already EXITED, is done), then GraphQL ``podStop``; vast ``PUT {"state": "stopped"}``. Whoever
reads a restarted pod keeps it up by touching ``.hold`` in the run folder, each touch another window. Which call worked is one line of the guard's log.

The window: the launch's ``--ready-timeout`` (the create-to-SSH wait, image pull included, which starts
before the container does) plus ``MARGIN_S`` for the SSH login and writing the watchdog's files;
``GPUCLI_BOOT_GUARD_S`` sets it outright (tests). The key is read from the container's environment,
never passed on a command line; the command line holds the code, the run folder, the window, the API
endpoint and gpucli's User-Agent only. The guard needs ``python3`` in the image (both providers'
default images have it); without it the guard does not run and the laptop's process and
``down --strays`` remain the guards, as before.
"""

from __future__ import annotations

import base64
import os
import shlex
import zlib

MARGIN_S = 600.0  # SSH login, the first mkdir and the watchdog's files: seconds on any link
LOG = ".gpucli-boot-guard.log"  # in the container user's home
#: Touched in the run folder by whatever reads a restarted pod: each touch keeps the pod up for another
#: window, as the launch's ``.launching`` does.
HOLD = ".hold"

# The guard itself: standard library only, run as ``python3 -c`` with the arguments below.
_GUARD = r"""
import json, os, sys, time, urllib.error, urllib.request
provider, wd, window, base, agent = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
wd = wd if wd.startswith("/") else os.path.join(os.path.expanduser("~"), wd[2:] if wd.startswith("~/") else wd)
log_path = os.path.expanduser("~/@LOG@")
def log(text):
    with open(log_path, "a") as fh:
        fh.write(time.strftime("%Y-%m-%d %H:%M:%S") + " boot guard: " + text + "\n")
def mtime(name):
    try:
        return os.stat(os.path.join(wd, name)).st_mtime
    except OSError:
        return None
def entries(path):
    try:
        return [n for n in os.listdir(path) if n != ".launching"]
    except OSError:
        return []
def stamp(name):
    try:
        st = os.stat(os.path.join(wd, name))
        return (st.st_ino, st.st_mtime_ns)
    except OSError:
        return None
def live_state():
    try:
        with open(os.path.join(wd, "watchdog.json")) as fh:
            return json.load(fh).get("state") not in ("ending", "done")
    except Exception:
        return False
started = time.time()
deadline = started + window
# what the watchdog.json of an earlier container left: only a write after this start is a hand-over
before = stamp("watchdog.json")
held = entries(wd)
if held:
    log("the container started again; %s holds %d entries of the run: this guard may stop the pod, never "
        "terminate it" % (wd, len(held)))
log("guarding %s until gpucli's watchdog runs (window %.0f s)" % (wd, window))
while True:
    seen = stamp("watchdog.json")
    if seen is not None and seen != before:
        if live_state():
            log("handed over: gpucli's watchdog runs")
            sys.exit(0)
        before = seen  # a watchdog that is ending (or done) hands nothing over
    for beat_name in (".launching", "@HOLD@"):
        beat = mtime(beat_name)
        if beat is not None and beat >= started - 1:
            deadline = max(deadline, beat + window)
    if time.time() >= deadline:
        break
    time.sleep(min(2.0, max(0.1, window / 10)))
stop = bool(held) or bool(entries(os.path.join(wd, "checkpoints")))
word = "stop" if stop else "terminate"
if provider == "runpod":
    pod, key = os.environ.get("RUNPOD_POD_ID"), os.environ.get("RUNPOD_API_KEY")
    mutation = ("mutation stopPod($podId: String!) { podStop(input: {podId: $podId}) { id desiredStatus } }" if stop
                else "mutation terminatePod($podId: String!) { podTerminate(input: {podId: $podId}) }")
    calls = [("REST v2", "POST", "%s/v2/pods/%s/action" % (base, pod), {"action": word})]
    if not stop:
        calls.append(("REST v2", "DELETE", "%s/v2/pods/%s" % (base, pod), None))
    calls.append(("GraphQL", "POST", "%s/graphql" % base, {"query": mutation, "variables": {"podId": pod}}))
    gone_words = "does not exist"
else:
    pod, key = os.environ.get("CONTAINER_ID"), os.environ.get("CONTAINER_API_KEY")
    url = "%s/api/v0/instances/%s/" % (base, pod)
    calls = [("API", "PUT", url, {"state": "stopped"})] if stop else [("API", "DELETE", url, None)]
    gone_words = "no_such_instance"
def done(path, status, text):
    try:
        body = json.loads(text or "{}")
    except ValueError:
        body = None
    if path == "GraphQL":
        return isinstance(body, dict) and not body.get("errors") and isinstance(body.get("data"), dict)
    if provider == "runpod":
        # 409: the action is not valid for the pod's status now (openapi podAction): a stop asked of a pod
        # that is already EXITED; only a problem body counts, never a proxy's page
        return status < 300 or (stop and status == 409 and isinstance(body, dict) and "title" in body)
    return status < 300 and isinstance(body, dict) and body.get("success") is True
if not pod or not key:
    log("no hand-over, and no pod id or pod key in the environment: cannot end the pod")
    sys.exit(1)
log("no hand-over by the deadline: %s; %s the pod" % (
    "the run folder holds the run" if stop else "the launch is gone", "stopping" if stop else "terminating"))
give_up, delay = time.time() + 900, 2.0
while time.time() < give_up:
    for path, method, url, body in calls:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": "Bearer " + key, "Content-Type": "application/json", "User-Agent": agent})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                status, text = resp.status, resp.read(65536).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read(65536).decode("utf-8", "replace")
        except Exception as exc:
            log("%s %s (%s): %s" % (method, url, path, type(exc).__name__))
            continue
        if done(path, status, text):
            log("%s (%s %s %s: HTTP %d)" % ("stopped" if stop else "terminated", path, method, url, status))
            sys.exit(0)
        if status == 404 and gone_words in text:
            log("the pod is gone")
            sys.exit(0)
        log("%s %s (%s): HTTP %d" % (method, url, path, status))
    time.sleep(delay)
    delay = min(delay * 2, 60.0)
log("could not %s the pod" % word)
sys.exit(1)
""".replace("@LOG@", LOG).replace("@HOLD@", HOLD)


def window_s(ready_timeout_s: float) -> float:
    """How long the guard waits for the hand-over (or a heartbeat): see the module docstring."""
    raw = os.environ.get("GPUCLI_BOOT_GUARD_S")
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = 0.0
        if value > 0:
            return value
    return float(ready_timeout_s) + MARGIN_S


def guard_code() -> str:
    """The guard's Python source (for tests that run it outside a pod)."""
    return _GUARD


def guard_command(provider: str, workdir: str, window: float, api_base: str, user_agent: str) -> str:
    """A ``sh`` line that starts the guard detached and returns at once (no key in it)."""
    code = base64.b64encode(zlib.compress(_GUARD.encode(), 9)).decode()  # ~1.3 KB: onstart stays short
    args = " ".join(shlex.quote(a) for a in (provider, workdir, f"{window:.0f}", api_base.rstrip("/"), user_agent))
    return (f"(command -v python3 >/dev/null 2>&1 && $(command -v setsid) python3 -c "
            f"\"import base64,zlib;exec(zlib.decompress(base64.b64decode('{code}')))\" {args} >/dev/null 2>&1 < /dev/null &)")


#: RunPod's own images, whose start is known: ``CMD ["/start.sh"]`` (runpod/containers
#: official-templates/base/Dockerfile; /start.sh starts their sshd with ``PUBLIC_KEY``).
RUNPOD_IMAGES = ("runpod/",)


def start_args(guard: str, resume_hook: str | None = None) -> str:
    """RunPod v2 ``args`` ("Arguments passed to the container entrypoint", api-reference-v2/openapi.json
    ``BaseContainerConfig``): the guard, the run's resume hook (a container started again resumes a live
    run, as vast's onstart does: gpucli/providers/onstart.py), then the image's own start, which args
    would otherwise replace ("make sure you're not overriding existing commands that are critical for
    the image to run", pods/templates/manage-templates.mdx L32). Like a template's start command these
    args run at every container start, not once: a stopped pod started again, a restart, RunPod's
    zero-GPU start (pods/troubleshooting/zero-gpus.mdx). Sent only for :data:`RUNPOD_IMAGES`: for
    another image gpucli does not know its start, so it sends no args and that pod has no boot guard."""
    parts = [guard, resume_hook] if resume_hook else [guard]
    return "bash -c " + shlex.quote("; ".join([*parts, "exec /start.sh"]))
