"""Every TFX component and artifact type is importable from ``sage_tfx.components``.

Read from the source (no TFX import): each folder of ``components/`` is one component whose class
(a ``BaseComponent`` / ``BaseBeamComponent`` subclass in its ``component.py``) must be exported,
lazily, from the package.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from sage_tfx import PUBLIC_API
from sage_tfx import components

ROOT = Path(__file__).resolve().parents[2]
COMPONENT_BASES = {"BaseComponent", "BaseBeamComponent"}
ARTIFACT_BASES = {"Artifact"}


def _classes(path: Path, bases: set[str]) -> list[str]:
    """Names of the top-level classes in ``path`` with a base named in ``bases``."""
    tree = ast.parse(path.read_text())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)
                     for b in node.bases}
            if names & bases:
                out.append(node.name)
    return out


FOLDERS = sorted(p.parent for p in (ROOT / "components").glob("*/__init__.py"))


def test_every_folder_is_found():
    names = {f.name for f in FOLDERS}
    assert {"gate", "dp_bagging_trainer", "pyramid_counts", "pyramid_snapshot",
            "pyramid_transform"} <= names


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_each_component_folder_is_exported(folder):
    found = _classes(folder / "component.py", COMPONENT_BASES)
    assert found, f"components/{folder.name}/component.py defines no component class"
    for name in found:
        assert components._LAZY.get(name) == f"sage_tfx.components.{folder.name}.component", (
            f"{name} (components/{folder.name}) is not exported from sage_tfx.components")
        assert name in components.__all__ and name in PUBLIC_API["sage_tfx.components"]


@pytest.mark.parametrize("path", sorted((ROOT / "components").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_each_artifact_type_is_exported(path):
    module = "sage_tfx." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
    for name in _classes(path, ARTIFACT_BASES):
        assert components._LAZY.get(name) == module, (
            f"artifact type {name} ({path.relative_to(ROOT)}) is not exported")


def test_exports_name_real_classes():
    """Each export names a class that its module defines (checked in the source, no TFX)."""
    for name, module in components._LAZY.items():
        rel = Path(*module.split(".")[2:])
        path = ROOT / "components" / rel.with_suffix(".py")
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assert name in defined, f"{module} defines no class {name}"


def test_importing_sage_tfx_and_components_stays_light():
    """``import sage_tfx.components`` (and so ``import sage_tfx``) loads no TFX / TensorFlow and
    none of the component modules."""
    code = ("import sys, sage_tfx, sage_tfx.components as c\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tfx', 'tensorflow', 'apache_beam') or m.startswith('sage_tfx.components.')))\n"
            "print(len(c.__all__))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    loaded, count = out.stdout.strip().splitlines()
    assert loaded == "[]" and int(count) == len(components._LAZY)
