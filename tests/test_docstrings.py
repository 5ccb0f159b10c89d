"""Every public name of the core (``sage_tfx/``) has a docstring.

Public: every module whose file name does not start with ``_`` (``__init__.py`` is its package),
every top-level function and class whose name does not start with ``_``, and every method of such
a class whose name does not start with ``_`` (properties included). Read with ``ast``: nothing is
imported, so the test takes well under a second.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "sage_tfx"
# Public names allowed to go without a docstring ("path name": reason). Keep it empty if you can.
ALLOWED: dict = {}

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def undocumented(source: str, where: str) -> list:
    """``where:line name`` of each public name in ``source`` that has no docstring."""
    tree = ast.parse(source)
    out = [] if ast.get_docstring(tree) else [f"{where}:1 <module>"]
    for node in tree.body:
        if not isinstance(node, _DEFS) or node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None:
            out.append(f"{where}:{node.lineno} {node.name}")
        if isinstance(node, ast.ClassDef):
            out += [f"{where}:{m.lineno} {node.name}.{m.name}" for m in node.body
                    if isinstance(m, _DEFS[:2]) and not m.name.startswith("_")
                    and ast.get_docstring(m) is None]
    return out


def core_modules() -> list:
    """The core's public modules, as paths."""
    return sorted(p for p in CORE.rglob("*.py")
                  if not any(part.startswith((".", "_")) for part in p.relative_to(CORE).parts
                             if part != "__init__.py"))


def test_every_public_name_of_the_core_has_a_docstring():
    modules = core_modules()
    assert len(modules) > 100, "the walk found too few modules"
    missing = [m for p in modules
               for m in undocumented(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    missing = [m for m in missing if f"{m.split(':')[0]} {m.split(' ', 1)[1]}" not in ALLOWED]
    assert not missing, (f"{len(missing)} public name(s) without a docstring (one line of what, "
                         "then Args/Returns/Raises where it helps):\n" + "\n".join(missing))


@pytest.mark.parametrize("source, found", [
    ('"""m."""\ndef f():\n    return 1\n', ["x.py:2 f"]),
    ('"""m."""\nclass C:\n    """c."""\n    @property\n    def p(self):\n        return 1\n',
     ["x.py:5 C.p"]),
    ('def _f():\n    pass\n', ["x.py:1 <module>"]),
    ('"""m."""\nclass _C:\n    def f(self):\n        pass\ndef g():\n    """g."""\n', []),
])
def test_the_check_finds_what_it_should(source, found):
    assert undocumented(source, "x.py") == found
