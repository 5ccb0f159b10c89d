"""``ruff check`` is clean over the repository (configuration: ``ruff.toml``).

Pyflakes (unused imports and variables, undefined names, redefinitions) and pycodestyle
(E, W; lines up to 100 characters) over every Python file and notebook.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format", "concise", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_ruff_check_is_clean():
    out = _ruff(".")
    assert out.returncode == 0, f"ruff check found:\n{out.stdout}{out.stderr}"


def test_the_configuration_catches_what_it_should(tmp_path):
    """The repository's ruff.toml, applied to a probe file: an unused import, an undefined name
    and a 101-character line are each reported."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\n\ndef f():\n    return undefined_name\n\n\n"
                     f"X = '{'x' * 95}'\n")
    out = _ruff("--config", str(ROOT / "ruff.toml"), str(probe), cwd=tmp_path)
    assert out.returncode == 1
    for code in ("F401", "F821", "E501"):
        assert code in out.stdout, out.stdout
