"""The privacy core must stay importable without TensorFlow (fast tests, notebooks, Beam)."""
import pkgutil
import subprocess
import sys

import sage_tfx


def test_core_modules_do_not_import_tensorflow():
    modules = [m.name for m in pkgutil.walk_packages(sage_tfx.__path__, "sage_tfx.")
               if not m.name.startswith(("sage_tfx.components", "sage_tfx.pipelines"))]
    assert "sage_tfx.ledger" in modules
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "heavy = [m for m in ('tensorflow', 'tfx', 'tensorflow_transform', 'tensorflow_privacy') "
            "if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core modules imported {out.stdout.strip()}"
