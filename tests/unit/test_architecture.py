"""The import rules of ARCHITECTURE.md and STYLE.md, checked on the source."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "gpucli"


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def module_files(*names: str) -> list[Path]:
    out = []
    for name in names:
        p = PKG / name
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p] if p.exists() else [])
    return out


FORBIDDEN_IN_CORE = ("typer", "rich", "click", "gpucli.cli", "gpucli.commands", "gpucli.render")


def test_core_never_imports_the_presentation_layer():
    core = module_files("providers", "remote.py", "transfer.py", "catalog.py", "estimate.py", "planner.py",
                        "query.py", "runs.py", "launcher.py", "errors.py", "settings.py")
    assert core
    for path in core:
        bad = [n for n in imports(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN_IN_CORE)]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_nothing_prints_outside_render():
    for path in PKG.rglob("*.py"):
        if path.name == "render.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                raise AssertionError(f"print() in {path.relative_to(ROOT)}:{node.lineno}")


def test_trainer_never_imports_gpucli():
    for path in (ROOT / "trainer").rglob("*.py"):
        bad = [n for n in imports(path) if n == "gpucli" or n.startswith("gpucli.")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_heavy_modules_are_not_imported_at_module_level_by_commands():
    """Commands import only typer and the standard library at module level (gpucli --help stays fast)."""
    heavy = ("torch", "paramiko", "requests", "yaml", "rich", "gpucli.catalog", "gpucli.planner",
             "gpucli.providers", "gpucli.remote", "gpucli.launcher", "matplotlib")
    for path in [PKG / "cli.py", *module_files("commands")]:
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

    from gpucli.cli import app

    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        assert (cmd.help or "").strip(), f"gpucli {name} has no help text"
