"""The venv your own code's job runs in on the host (``--setup`` installs there, never into the Python
gpucli or the image runs), seeing the packages of the Python that runs the job runner: uploaded beside
jobrun.py, standard library only."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def use_venv(venv: Path, env: dict[str, str], with_pip: bool) -> str | None:
    """Create ``venv`` when missing (this Python's; pip in it for a --setup), seeing this Python's packages
    (:func:`see_parent`), first on the job's PATH. Returns why it could not be made, or None."""
    python = venv / "bin" / "python"
    pip = venv / "bin" / "pip"
    if not python.exists() or (with_pip and not pip.exists()):
        cmd = [sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(venv)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"venv {venv}: {exc}"
        if res.returncode != 0:
            return f"venv {venv}: {(res.stderr or res.stdout).strip()[-300:]}"
    try:
        see_parent(venv)
    except OSError as exc:
        return f"venv {venv}: {exc}"
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # bash -c with SSH_CLIENT sources ~/.bashrc again (pyenv, conda: the venv buried); its exports are here.
    for var in ("PYTHONHOME", "SSH_CLIENT", "SSH2_CLIENT"):
        env.pop(var, None)
    return None


def see_parent(venv: Path) -> None:
    """A ``.pth`` in the job venv: this Python's package folders (its venv's too; --system-site-packages
    shows the *base* interpreter's) after the venv's own, their .pth files processed (editable installs)."""
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    text = "".join(f"import site; site.addsitedir({d!r})\n" for d in sys.path if d != purelib and os.path.isdir(d)
                   and os.path.basename(d.rstrip(os.sep)) in ("site-packages", "dist-packages"))
    (Path(purelib) / "_gpucli_parent.pth").write_text(text)
