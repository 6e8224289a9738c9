"""A launch whose Python cannot run the trainer fails before the trainer starts, with the install command.

The interpreters are real: a venv made here (no torch, numpy or pyyaml in it), and this Python behind
a wrapper whose PYTHONPATH shadows one package with a module that fails to import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpucli.run.inputs.requirements import CPU_TORCH_INDEX, install_command, parse_check_output
from gpucli.runs import records as runs
from tests.support.cli import cli


def _bare_venv(tmp_path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    return tmp_path / "venv" / "bin" / "python"


def _hiding(tmp_path: Path, module: str, *, stub_torch: bool = False) -> Path:
    """This Python, with ``module`` made unimportable (a package of that name that raises on import);
    ``stub_torch``: torch replaced by an empty package too, so the check spends no seconds importing it."""
    shadow = tmp_path / "shadow" / module
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ImportError('{module} hidden by the test')\n")
    if stub_torch:
        (tmp_path / "shadow" / "torch").mkdir()
        (tmp_path / "shadow" / "torch" / "__init__.py").write_text("__version__ = '0.0-stub'\n")
    wrapper = tmp_path / "bin" / f"python-without-{module}"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shadow.parent}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def test_local_launch_without_torch_fails_with_the_cpu_install_command(capsys, tmp_path):
    python = _bare_venv(tmp_path)
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--provider", "local", "--name", "notorch",
                         "--python", str(python))
    assert code != 0 and "Traceback" not in err
    assert "started run" not in out
    assert "cannot import torch, numpy, yaml" in err
    # The exact commands for that interpreter: torch's CPU build first, then the rest.
    assert f"{python} -m pip install torch --index-url {CPU_TORCH_INDEX}" in err.replace("\n", "")
    assert f"{python} -m pip install numpy pyyaml" in err.replace("\n", "")
    record = runs.load("notorch")
    assert record.status == "failed" and record.pid is None  # nothing was started
    assert "cannot import torch" in (record.message or "")
    # The trainer was never started: no console log, no code synced.
    workdir = Path(os.path.expanduser(record.workdir))
    assert not (workdir / "console.log").exists() and not (workdir / "code" / "trainer").exists()


def test_a_bpe_run_needs_tokenizers(capsys, tmp_path):
    python = _hiding(tmp_path, "tokenizers", stub_torch=True)
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--provider", "local", "--name", "notok",
                         "--python", str(python), "--set", "data.tokenizer=bpe")
    assert code != 0 and "started run" not in out
    flat = err.replace("\n", "")
    assert "cannot import tokenizers" in flat and "hidden by the test" in flat  # the import's own error
    assert f"{python} -m pip install tokenizers" in flat
    assert runs.load("notok").status == "failed"


def test_missing_python_is_named(capsys, tmp_path):
    code, _, err = cli(capsys, "launch", "--profile", "cpu", "--provider", "local", "--name", "nopy",
                       "--python", str(tmp_path / "no-such-python"))
    assert code != 0 and "Traceback" not in err
    assert "no-such-python is not found on this machine" in err.replace("\n", "")


def test_install_commands():
    # A pod gets what setup_pod.sh installs (the stock torch from PyPI); a local CPU run the CPU build.
    assert install_command("python3", ["torch", "yaml"], pod=True, cpu=False) == \
        "python3 -m pip install torch && python3 -m pip install pyyaml"
    assert install_command("/opt/my py/bin/python", ["torch"], pod=False, cpu=True) == \
        f"'/opt/my py/bin/python' -m pip install torch --index-url {CPU_TORCH_INDEX}"
    assert install_command("python", ["numpy"], pod=False, cpu=False) == "python -m pip install numpy"


def test_check_output_parsing():
    got = parse_check_output('noise from a sitecustomize\nGPUCLI-REQUIREMENTS {"python": "3.9.1", "torch": "2.1",'
                             ' "numpy": null, "numpy_error": "ImportError: broken", "yaml": "6.0", "tokenizers": null}\n')
    assert got is not None and got.python_too_old
    assert got.missing(tokenizers=False) == ["numpy"] and got.missing(tokenizers=True) == ["numpy", "tokenizers"]
    assert got.errors == {"numpy": "ImportError: broken"}
    assert parse_check_output("Traceback ...\nSyntaxError") is None
    assert parse_check_output("GPUCLI-REQUIREMENTS [1, 2]") is None


def test_a_package_imported_already_is_only_located(tmp_path):
    """On a pod, setup_pod.sh has just imported torch: the check only locates it (no second import of
    seconds); everything else is imported, so a broken package is still caught."""
    from gpucli.run.inputs.requirements import CHECK_SCRIPT

    python = _hiding(tmp_path, "torch")  # a torch that raises when imported

    def check(*located: str):
        proc = subprocess.run([str(python), "-c", CHECK_SCRIPT, *located], capture_output=True, text=True,
                              timeout=120)
        return parse_check_output(proc.stdout)

    located = check("torch")
    assert located is not None and located.versions["torch"] and located.versions["numpy"]
    imported = check()
    assert imported is not None and imported.missing(tokenizers=False) == ["torch"]
    assert "hidden by the test" in imported.errors["torch"]
