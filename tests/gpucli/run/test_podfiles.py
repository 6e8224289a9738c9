"""The one list of what goes to a run's machine (gpucli.runs.podfiles), checked against the code that runs
there: every module a pod-side script loads by path travels with it, and every file of gpucli/pod and
gpucli/store is in the list, so a new pod module cannot be forgotten by one of the senders."""

import ast
import re
from pathlib import Path

from gpucli.providers.local.target import LocalHost
from gpucli.runs import podfiles

ROOT = Path(__file__).resolve().parents[3]
POD = ROOT / "gpucli" / "pod"
STORE = ROOT / "gpucli" / "store"
LOADERS = {"_load", "_load_file", "with_name", "spec_from_file_location"}


def loaded_by_path(path: Path) -> set[str]:
    """The file names a pod-side script loads from beside itself: ``_load("x")``, ``_load_file("x.py")``,
    ``Path(__file__).with_name("x.py")``, ``here / "x.py"``; a shell script's ``python x.py`` and
    ``--pins file``."""
    if path.suffix == ".sh":
        text = path.read_text()
        return set(re.findall(r"\"\$PY\" (\w+\.py)", text)) | set(re.findall(r"--pins (\S+)", text))
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        arg = None
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in LOADERS and node.args and isinstance(node.args[0], ast.Constant):
                arg = node.args[0].value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            arg = node.right.value if str(node.right.value).endswith(".py") else None
        if isinstance(arg, str) and re.fullmatch(r"\w+(\.py)?", arg) and not arg.startswith("gpucli_"):
            names.add(arg if arg.endswith(".py") else f"{arg}.py")
    return names


def sources() -> dict[str, Path]:
    """Each file a bundle sends, by its name on the pod, as it is on this machine."""
    return {f.name: f.path for b in podfiles.BUNDLES for f in b.files}


def test_the_scan_finds_the_known_loads():
    """The scan itself reads the loaders it must (a scan that finds nothing would pass everything)."""
    assert {"procid.py", "peers.py", "storeflush.py"} <= loaded_by_path(POD / "watchdog.py")
    assert {"logparse.py", "terminal.py", "framefiles.py", "jobalerts.py", "jobvenv.py"} <= loaded_by_path(POD / "jobrun.py")
    assert {"notify.py", "webhook.py", "webhooks.py"} <= loaded_by_path(POD / "jobalerts.py")
    assert loaded_by_path(POD / "idlewatch.py") == {"watchdog.py"}
    assert loaded_by_path(STORE / "storesync.py") == {"objstore.py", "storelocal.py"}
    assert loaded_by_path(POD / "setup_pod.sh") == {"envbuild.py", "requirements.txt"}


def test_every_pod_and_store_file_is_in_the_manifest():
    listed = {f.path.resolve() for b in podfiles.BUNDLES for f in b.files if not f.source.startswith("trainer/")}
    ours = {p.resolve() for d in (POD, STORE) for p in d.iterdir() if p.is_file() and p.suffix in (".py", ".sh")
            and p.name != "__init__.py"}
    assert ours - listed == set(), f"files of gpucli/pod or gpucli/store no sender knows: {sorted(ours - listed)}"


# The slow check sends its one alert through the bundled trainer's senders, read from the trainer package in
# the run's code folder (podfiles.TRAINER): only a bundled-trainer run has a planned speed to be slow against.
FROM_TRAINER = {"slowrun.py": {"notify.py", "webhook.py", "webhooks.py"}}


def test_the_slow_checks_senders_are_in_the_trainer_package():
    for name in FROM_TRAINER["slowrun.py"]:
        assert list(podfiles.TRAINER.source().rglob(name)), name


def test_every_module_loaded_by_path_travels_with_its_loader():
    problems = []
    for bundle in podfiles.BUNDLES:
        if bundle is podfiles.ON_STDIN:
            continue  # piped to the host's Python, never a file beside anything
        for f in bundle.files:
            if f.path.suffix not in (".py", ".sh"):
                continue
            for need in loaded_by_path(f.path):
                if need in bundle.names or need in FROM_TRAINER.get(f.name, ()):
                    continue
                extra = [b for b in podfiles.BUNDLES if need in b.names and f.name in b.beside]
                if not extra:
                    problems.append(f"{bundle.key}: {f.name} loads {need}, which is not sent with it")
    assert not problems, "\n".join(problems)


def test_every_listed_file_exists_and_lands_where_its_bundle_says(tmp_path):
    for bundle in podfiles.BUNDLES:
        for f in bundle.files:
            assert f.optional or f.path.is_file(), f"{bundle.key}: {f.source} is missing"
        if bundle is podfiles.ON_STDIN:
            continue
        folder = tmp_path / bundle.key
        folder.mkdir()
        bundle.write(LocalHost(), str(folder))
        for f in bundle.files:
            landed = folder / f.name
            assert landed.read_bytes() == f.data(), f"{bundle.key}: {f.name}"
            assert landed.stat().st_mode & 0o777 == f.mode, f"{bundle.key}: {f.name} mode"
    assert (podfiles.TRAINER.source() / "train.py").is_file()
    assert podfiles.TRAINER.name == "code/trainer"


def test_names_on_the_pod_are_one_file_each():
    """Two bundles may send the same name only when it is the same file (procid.py, watchdog.py, fetch.py)."""
    seen: dict[str, Path] = {}
    for bundle in podfiles.BUNDLES:
        for f in bundle.files:
            assert seen.setdefault(f.name, f.path) == f.path, f"{f.name}: two different files"
