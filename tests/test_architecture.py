"""The import rules of docs/architecture.md, checked on the source.

Every module of every package is checked, function-level imports included: the rules hold for the
code that runs, not only for what a reader sees at the top of a file.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gpucli"

# What each floor may import from gpucli (besides itself). Floors are listed top to bottom; nothing
# imports upward. `cloud` may read the catalogue (`plan`) to name GPUs and turn offers into setups.
ALLOWED = {
    "__main__": {"cli"},  # `python -m gpucli`: the CLI's entry, nothing else
    "cli": {"run", "providers", "runs", "plan", "ssh", "store", "settings", "errors", "__init__"},
    "run": {"providers", "runs", "plan", "ssh", "pod", "store", "settings", "errors", "__init__"},  # pod: procid, the liveness test
    # every place a run can go, one folder per provider: reads a run's data, never acts on a run
    "providers": {"runs", "plan", "ssh", "pod", "settings", "errors", "__init__"},
    # a run as data (an SSH address and a store URL are data too): nothing here rents, connects or starts
    "runs": {"plan", "ssh", "store", "settings", "errors", "__init__"},
    "ssh": {"settings", "errors", "__init__"},
    "plan": {"settings", "errors", "__init__"},
    "settings": {"errors", "__init__"},
    "errors": {"__init__"},
    "pod": set(),
    "store": set(),  # copied to the pod as it is, like pod/: nothing of gpucli
    "__init__": set(),
}
PRESENTATION = ("typer", "rich", "click")


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def floor_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def gpucli_floor(name: str) -> str | None:
    """The floor an imported dotted name lands on (`gpucli.runs.records` -> `run`); None if not ours."""
    parts = name.split(".")
    if parts[0] != "gpucli":
        return None
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def all_modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py"))


def test_every_module_lives_on_a_known_floor():
    floors = {floor_of(p) for p in all_modules()}
    assert floors <= set(ALLOWED), f"modules outside the layout: {sorted(floors - set(ALLOWED))}"
    for floor in ("cli", "run", "providers", "runs", "plan", "ssh", "pod"):
        assert (PKG / floor).is_dir(), floor


def test_imports_only_go_down():
    problems = []
    for path in all_modules():
        floor = floor_of(path)
        for name in imports(path):
            target = gpucli_floor(name)
            if target is None or target == floor:
                continue
            # `from gpucli import __version__` is the package root, allowed everywhere but pod/.
            if target == "__version__" or (target == "__init__" and floor != "pod"):
                continue
            if target not in ALLOWED[floor]:
                problems.append(f"{path.relative_to(ROOT)} ({floor}) imports {name}")
    assert not problems, "\n".join(problems)


def test_core_never_touches_the_presentation_layer():
    """Nothing outside gpucli/cli imports typer, rich or click, prints, or exits the process."""
    problems = []
    for path in all_modules():
        if floor_of(path) == "cli":
            continue
        for name in imports(path):
            if any(name == p or name.startswith(p + ".") for p in PRESENTATION):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
        if floor_of(path) in ("pod", "store"):
            continue  # the pod's watchdog and uploader are programs of their own: their main() may exit
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("print", "exit", "quit"):
                problems.append(f"{f.id}() in {path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(f, ast.Attribute) and f.attr == "exit" and isinstance(f.value, ast.Name) \
                    and f.value.id in ("sys", "os"):
                problems.append(f"{f.value.id}.exit() in {path.relative_to(ROOT)}:{node.lineno}")
    assert not problems, "\n".join(problems)


def test_only_render_modules_print_in_the_cli():
    for path in sorted((PKG / "cli").rglob("*.py")):
        if path.name.startswith("render"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                raise AssertionError(f"print() in {path.relative_to(ROOT)}:{node.lineno}")


def test_pod_code_is_standard_library_only():
    stdlib = set(sys.stdlib_module_names)
    for path in sorted((PKG / "pod").rglob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            assert top in stdlib or top == "__future__", f"{path.relative_to(ROOT)} imports {name}"


def test_store_code_is_standard_library_and_its_clients():
    """gpucli/store runs on the pod as plain files: the standard library, and the store's own clients
    (boto3, huggingface_hub) only inside the functions that use them."""
    stdlib = set(sys.stdlib_module_names)
    clients = {"boto3", "botocore", "huggingface_hub"}
    for path in sorted((PKG / "store").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top = {n.split(".")[0] for node in tree.body for n in
               ([a.name for a in node.names] if isinstance(node, ast.Import) else
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}
        assert top <= stdlib | {"__future__"}, f"{path.relative_to(ROOT)} imports {sorted(top - stdlib)} at the top"
        for name in imports(path):
            first = name.split(".")[0]
            assert first in stdlib | clients | {"__future__"}, f"{path.relative_to(ROOT)} imports {name}"


def test_trainer_never_imports_gpucli():
    for path in (ROOT / "trainer").rglob("*.py"):
        bad = [n for n in imports(path) if n == "gpucli" or n.startswith("gpucli.")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


TRAINER = ROOT / "trainer"
# The trainer's folders, each one concern, and what each may import from the trainer (besides
# itself). The programs on top (train, prepare, sample, serve, snapshot, ...) may import any folder.
TRAINER_ALLOWED = {
    "spec": set(),                                  # torch-free: shapes, presets, config, alerts
    "model": {"spec"},                              # nn modules only
    "data": {"spec"},
    "watch": {"spec", "model", "data"},             # what a run reports
    "loop": {"spec", "model", "data", "watch"},     # the training loop's parts
    "infer": {"spec", "model", "data"},             # never the loop, and the loop never infer
}


def trainer_folder(path: Path) -> str:
    rel = path.relative_to(TRAINER)
    return rel.parts[0] if len(rel.parts) > 1 else "programs"


def test_trainer_folders_import_only_below():
    problems = []
    for path in sorted(TRAINER.rglob("*.py")):
        folder = trainer_folder(path)
        if folder == "programs":
            continue
        assert folder in TRAINER_ALLOWED, f"trainer/{folder} is not a known folder"
        for name in imports(path):
            parts = name.split(".")
            if parts[0] != "trainer" or len(parts) < 2 or parts[1] == folder:
                continue
            target = parts[1] if parts[1] in TRAINER_ALLOWED else "programs"
            if parts[1] == "__version__":
                continue
            if target not in TRAINER_ALLOWED[folder]:
                problems.append(f"{path.relative_to(ROOT)} ({folder}) imports {name}")
    assert not problems, "\n".join(problems)


def test_the_torch_free_seam_is_torch_free():
    """trainer/spec is what gpucli imports: the standard library and pyyaml only."""
    stdlib = set(sys.stdlib_module_names)
    for path in sorted((TRAINER / "spec").rglob("*.py")):
        for name in imports(path):
            top = name.split(".")[0]
            assert top in stdlib or top in ("__future__", "yaml", "trainer"), f"{path.relative_to(ROOT)} imports {name}"


def test_gpucli_imports_only_the_torch_free_part_of_the_trainer():
    for path in all_modules():
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "trainer":
                assert len(parts) >= 2 and parts[1] == "spec", f"{path.relative_to(ROOT)} imports {name}"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _resolved(node: ast.ImportFrom, path: Path) -> str | None:
    if node.level == 0:
        return node.module
    base = _module_name(path).split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def test_no_import_cycle_anywhere():
    """No circle between modules of gpucli and the trainer, function-level and TYPE_CHECKING imports
    included: the graph drawn from the code is the one that runs."""
    paths = [*all_modules(), *sorted(TRAINER.rglob("*.py"))]
    mods = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = _resolved(node, path)
                if mod:
                    targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            for t in targets:
                # a name inside a module counts as that module; a package import as its __init__
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    deps.add(t)
        graph[name] = deps
    done: set[str] = set()
    stack: list[str] = []

    def visit(n):
        if n in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
        if n in done:
            return
        stack.append(n)
        for d in sorted(graph[n]):
            visit(d)
        stack.pop()
        done.add(n)

    for n in sorted(graph):
        visit(n)


# Inside gpucli/run, each module (or package) has a floor; an import goes to a lower floor only (or
# within its own package). What a run is, where it lives, what is read from it, how it starts, the kinds
# of job, then the life of a run on top.
RUN_FLOORS = {
    "untrusted": 3,  # what comes from a pod, checked: names, numbers, bounded JSON
    "precedence": 2,  # the one rule for a launch's inputs: command line > task.yaml > your config > defaults
    "procs": 4, "datasources": 4, "checkpoints": 4, "tensorboard": 4, "calibrate": 4,
    "nodes": 4.5,  # a run over several machines: its layout, variables and rented cluster
    "linkprobe": 4.6,  # the link between your own machines, measured at launch
    "monitor": 5, "launch": 5, "owner": 5,
    "transfer": 7,  # a launch's planned bytes sized and priced where billed, reserved from --budget
    "store": 6.5,  # the run's checkpoint store seen from here: its uploader started, resume and fetch from it
    "requirements": 6, "money": 6, "harvest": 6, "gpuwatch": 6, "logs": 6, "forward": 6, "export": 6,
    "execjob": 6,  # a command on a run's machine, in its folder and environment
    "runend": 7, "start": 7, "resumescript": 7, "podserve": 7,
    "dataprobe": 7.2,  # the preflight's download check: the host's rate from the run's data source
    "preflight": 7.3,  # the machine checked on the host before the run is detached
    "jobs": 8,  # the kinds of job behind one contract: the bundled trainer and your own command
    "multinode": 8.5,  # starting a run on its machines (one or several), watching and ending them
    "observe": 7.5,  # reading a run: what its record and host show, and what that makes due (no writes)
    "podrescue": 8.6,  # a resume copies the old pod's newest checkpoint home before it ends the pod
    "lifecycle": 9,
    "avoid": 1.2,  # hosts that failed their health check, avoided for a week (GPUCLI_HOME/avoid.json)
    "pick": 5.5,  # launch --pick: the planner's choice as the launch's profile and caps
    "failnodes": 9.05,  # --nodes N across providers: each provider's N machines as one option, and gone after
    "failover": 9.1,  # one launch across providers: offers ranked on the run's cost, tried until one runs
    "envstamp": 7.5,  # the trainer's pinned environment set up (or reused) on any machine a run starts on
    "warm": 9.2,  # the next run on a machine a run already has (launch --on)
    "box": 9.3,  # a dev box: a machine with its environment ready, no job, ended when idle
    "podwake": 7.2,  # reading a run whose pod was kept stopped: start it, read it, stop it again
    "reconcile": 9.5,  # doing what a read found due: the one step `status` and `ls` take after reading
    "control": 10, "follow": 10,
    "remotewatch": 9.4,  # the watcher on an always-on machine of yours (watch --detach --on)
    "sweep": 11,  # many runs under one budget, on top of the life of each
}


def _all_imports(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved, function-level and TYPE_CHECKING included."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _resolved(node, path)
            if mod:
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def test_run_imports_only_go_down():
    run = PKG / "run"
    part = lambda p: p.relative_to(run).parts[0].removesuffix(".py")  # noqa: E731
    modules = {part(p) for p in run.rglob("*.py")} - {"__init__"}
    assert modules == set(RUN_FLOORS), f"gpucli/run modules without a floor: {sorted(modules ^ set(RUN_FLOORS))}"
    problems = []
    for path in sorted(run.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == run:
            continue
        mine = part(path)
        for name in _all_imports(path):
            parts = name.split(".")
            if parts[:2] != ["gpucli", "run"] or len(parts) < 3 or parts[2] not in RUN_FLOORS or parts[2] == mine:
                continue
            if RUN_FLOORS[parts[2]] >= RUN_FLOORS[mine]:
                problems.append(f"{path.relative_to(ROOT)} (floor {RUN_FLOORS[mine]}) imports {name} "
                                f"(floor {RUN_FLOORS[parts[2]]})")
    assert not problems, "\n".join(sorted(set(problems)))


def test_function_level_imports_say_why():
    """An import inside a function hides an edge of the graph: it stays only to keep start-up fast or an
    optional dependency optional, with that reason in a comment on its line (or the line above). The
    CLI floor is the exception as a whole: its commands import everything lazily so that `gpucli --help`
    and each command start in a fraction of a second (checked for the commands by
    test_heavy_modules_are_not_imported_at_module_level_by_commands)."""
    problems = []
    for path in [*all_modules(), *sorted(TRAINER.rglob("*.py"))]:
        if path.is_relative_to(PKG / "cli"):
            continue
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        guarded = {n.lineno for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for n in ast.walk(node) if hasattr(n, "lineno")}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in guarded:
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "#" not in here and not above.startswith("#"):
                        problems.append(f"{path.relative_to(ROOT)}:{node.lineno}: {here.strip()}")
    assert not problems, "function-level imports without a reason:\n" + "\n".join(sorted(set(problems)))


def test_no_source_file_is_too_long():
    limit = 520
    long = [f"{p.relative_to(ROOT)}: {n}" for p in [*all_modules(), *(ROOT / "trainer").rglob("*.py")]
            if (n := len(p.read_text().splitlines())) > limit]
    assert not long, "files over ~500 lines:\n" + "\n".join(long)


def test_heavy_modules_are_not_imported_at_module_level_by_commands():
    """Commands import only typer and the standard library at module level (gpucli --help stays fast)."""
    heavy = ("torch", "paramiko", "requests", "yaml", "rich", "gpucli.plan", "gpucli.providers.clients", "gpucli.ssh",
             "gpucli.run", "matplotlib")
    for path in [PKG / "cli" / "app.py", *sorted((PKG / "cli" / "commands").rglob("*.py"))]:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert not any(n == h or n.startswith(h + ".") for h in heavy), f"{path.name} imports {n} at top"


def test_every_command_has_help():
    import typer.main

    from gpucli.cli.app import app

    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        assert (cmd.help or "").strip(), f"gpucli {name} has no help text"


# -- provider names stay in the provider folders --------------------------------------------------------

PROVIDER_WORDS = ("local", "ssh", "runpod", "vast")
#: Where provider names may be compared and targets' attributes probed: the run targets (each declares
#: its ``Capabilities``), the provider clients, and ``gpucli/pod``: it runs on the pod with the standard
#: library only (test_pod_code_is_standard_library_only), so it cannot ask a target; the launch hands
#: its watchdog ``--provider`` and it calls that provider's API to end its own pod.
PROVIDER_FOLDERS = (PKG / "providers", PKG / "pod")


def _provider_word(node: ast.AST) -> bool:
    """A provider name ("vast") or a stray kind made from a cloud's ("vast-overlay")."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (node.value in PROVIDER_WORDS or any(
        node.value.startswith(w + "-") for w in ("runpod", "vast")))


def provider_name_uses(path: Path) -> list[str]:
    """Comparisons with a provider name (``== "vast"``, ``in ("local", "ssh")``: a collection of names
    only) and tables keyed by provider names (``{"runpod": ..., "vast": ...}``); a data source's
    ``kind`` ("local") is not a provider, nor is a record's ``ssh`` field among its other fields."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            many = [s for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set))]
            named = any(_provider_word(s) for s in sides) or any(s.elts and all(_provider_word(e) for e in s.elts)
                                                                 for s in many)
            others = [ast.unparse(s) for s in sides if not (_provider_word(s) or s in many)]
            if named and not all(o.endswith(".kind") for o in others):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and sum(k is not None and _provider_word(k) for k in node.keys) >= 2:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: a table keyed by provider names")
    return found


def capability_probes(path: Path) -> list[str]:
    """``getattr`` on a target or a provisioner: a capability it does not declare."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and node.args:
            what = ast.unparse(node.args[0])
            if "target" in what or "provision" in what:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_provider_names_stay_in_the_provider_folders():
    """Outside the provider folders nothing compares a provider's name or probes a target with
    ``getattr``: it asks the target (``get_target(record.provider).caps.network_volumes``, a method for
    behaviour). Moving a provider into a folder of its own is then a change of import paths."""
    problems = []
    for path in all_modules():
        if any(path.is_relative_to(folder) for folder in PROVIDER_FOLDERS):
            continue
        problems += provider_name_uses(path) + capability_probes(path)
    assert not problems, "ask the run target (its caps) instead:\n" + "\n".join(problems)
