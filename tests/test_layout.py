"""The architecture of ``docs/design.md``, enforced: layers, systems, heavy imports, module size.

Static checks read every module's ``import`` statements (module level and inside functions), so
a rule cannot be dodged by importing late; a subprocess then imports the core for real and looks
at ``sys.modules``.
"""
import ast
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

import sage_tfx

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "sage_tfx"

# Shared layers in order: each may import itself and the layers before it.
SHARED = ("ledger", "streams", "dp", "adaptive")
LAYER_DEPS = {
    "ledger": set(),
    "streams": {"ledger"},
    "dp": {"ledger"},
    "adaptive": {"ledger", "dp", "streams"},
}
# Systems from docs/papers.md: each may import every shared layer, never a sibling system.
SYSTEMS = ("ptk", "pyramid", "bagging", "dnd")
# Sage's own evaluation sits on the shared layers like a system does.
SAGE_EVAL = "eval"
# Top-level modules of the core: utilities every layer may use, and the command line.
UTILITIES = {"errors", "_lazy", "reporting"}
# What the HTTP services share (authentication against the ledger, body limits): on the ledger,
# used by the systems that serve (ptk, dnd).
SERVICES = "services"
TOP_LEVEL = UTILITIES | {"cli", "__init__", SERVICES}
# The command line: cli.py and its command groups, cli_<group>.py (e.g. cli_principals).
CLI_GROUP = re.compile(r"^cli_[a-z]+$")
HEAVY = ("tensorflow", "tfx", "tensorflow_transform", "tensorflow_privacy", "apache_beam")
# The one core module that imports Beam at module level: the splitter's pipeline, itself only
# imported inside ``split_into_blocks``.
BEAM_MODULES = {"sage_tfx.streams.beam"}
MAX_LINES = 600


def _module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _core_files() -> list[pathlib.Path]:
    return sorted(CORE.rglob("*.py"))


def _imports(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return out


def _part(module: str) -> str:
    """The first component below ``sage_tfx`` (a layer, system, eval or top-level module)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _sage_parts(imports: set[str]) -> set[str]:
    return {_part(m) for m in imports if m == "sage_tfx" or m.startswith("sage_tfx.")}


def test_every_core_package_is_a_known_layer_system_or_utility():
    """A new subpackage must be placed in the architecture (here and in docs/design.md)."""
    known = set(SHARED) | set(SYSTEMS) | {SAGE_EVAL} | TOP_LEVEL
    found = {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found |= {p.stem for p in CORE.glob("*.py") if not CLI_GROUP.match(p.stem)}
    assert found <= known, f"unplaced core packages/modules: {sorted(found - known)}"
    assert set(SHARED) <= found


def _violations(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """What ``path`` (a module of the core under ``root``) imports against the layout rules."""
    module = _module_name(path, root)
    imports = _imports(path, root)
    here = _part(module)
    used = _sage_parts(imports) - {here, "__init__"}
    problems = [f"{module} imports the TFX layer: {m}" for m in sorted(imports)
                if m.split(".")[0] in ("components", "pipelines")
                or m.startswith(("sage_tfx.components", "sage_tfx.pipelines"))]
    if here in LAYER_DEPS:
        allowed = LAYER_DEPS[here] | UTILITIES
    elif here in SYSTEMS or here == SAGE_EVAL:
        allowed = set(SHARED) | UTILITIES | {SERVICES}
    elif here == SERVICES:
        allowed = {"ledger"} | UTILITIES
    elif here == "cli" or CLI_GROUP.match(here):  # the command line over the ledger and the
        allowed = ({"ledger", "streams"} | set(SYSTEMS) | UTILITIES  # splitter, the systems'
                   | {"cli"} | {p for p in used if CLI_GROUP.match(p)})  # commands, its groups
    else:  # the utilities and sage_tfx/__init__ import no layer
        allowed = set()
    if not used <= allowed:
        problems.append(f"{module} imports {sorted(used - allowed)} (allowed: {sorted(allowed)})")
    return problems


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_import_rules(path):
    assert _violations(path) == []


@pytest.mark.parametrize("path", sorted((ROOT / "components").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_components_never_import_pipelines(path):
    bad = [m for m in _imports(path) if m.startswith("sage_tfx.pipelines")]
    assert not bad, f"{path}: a component must not depend on a pipeline: {bad}"


@pytest.mark.parametrize("where,source", [
    ("ledger/probe.py", "def f():\n    from sage_tfx.dp import mechanisms\n"),
    ("streams/probe.py", "from sage_tfx.adaptive import plan\n"),
    ("ptk/probe.py", "from sage_tfx.pyramid import windows\n"),
    ("dnd/probe.py", "from ..bagging import teachers\n"),
    ("dp/probe.py", "import sage_tfx.components.gate\n"),
    ("eval/probe.py", "from sage_tfx.pipelines import sage_demo\n"),
])
def test_the_rules_catch_violations(tmp_path, where, source):
    """The checker itself: each forbidden import, late or relative, is reported."""
    probe = tmp_path / "sage_tfx" / where
    probe.parent.mkdir(parents=True)
    probe.write_text(source)
    assert _violations(probe, tmp_path)


def test_the_rules_allow_the_shared_layers(tmp_path):
    probe = tmp_path / "sage_tfx" / "ptk" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from sage_tfx.ledger import open_ledger\nfrom sage_tfx.dp import queries\n"
                     "from sage_tfx.adaptive import plan\nfrom . import store\n")
    assert _violations(probe, tmp_path) == []


def test_importing_the_core_pulls_in_no_tensorflow_tfx_or_beam():
    """Every core module (except the splitter's Beam pipeline) imports without TF, TFX or Beam."""
    modules = [_module_name(p) for p in _core_files()]
    modules = [m for m in modules if m not in BEAM_MODULES]
    assert "sage_tfx.ledger" in modules and "sage_tfx.dp.validation" in modules
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core modules imported {out.stdout.strip()}"


@pytest.mark.parametrize("package", ["sage_tfx", *(f"sage_tfx.{p}" for p in SHARED),
                                     "sage_tfx.components", "sage_tfx.pipelines"])
def test_package_import_is_light(package):
    code = (f"import sys, {package}\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import {package} pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("path", [*_core_files(), *sorted((ROOT / "components").rglob("*.py")),
                                  *sorted((ROOT / "pipelines").rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_over_600_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it"


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.slow) if m.startswith("sage_tfx.components") else m
    for m in sorted(sage_tfx.PUBLIC_API)])  # the components' names import TFX (~20 s)
def test_public_api_imports(module):
    """Every name of the public API (sage_tfx.PUBLIC_API) exists where it is documented."""
    mod = importlib.import_module(module)
    missing = [n for n in sage_tfx.PUBLIC_API[module] if not hasattr(mod, n)]
    assert not missing, f"{module} lacks {missing}"


_IMPORT_RE = re.compile(r"^\s*from (sage_tfx[\w.]*) import ([\w, ()\n]+?)(?:#.*)?$", re.M)


def _documented_imports() -> list[tuple[str, str, str]]:
    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for module, names in _IMPORT_RE.findall(doc.read_text()):
            for name in re.split(r"[,\s()]+", names):
                if name and name != "\\":
                    out.append((doc.name, module, name))
    return out


@pytest.mark.parametrize("doc,module,name", _documented_imports())
def test_documented_import_paths_work(doc, module, name):
    """`from sage_tfx... import ...` lines of README.md and docs/*.md keep working."""
    mod = importlib.import_module(module)
    if not hasattr(mod, name):
        importlib.import_module(f"{module}.{name}")  # a submodule


def test_documented_imports_are_found():
    found = {(m, n) for _, m, n in _documented_imports()}
    assert ("sage_tfx.ledger", "open_ledger") in found and ("sage_tfx.ledger", "Window") in found


@pytest.mark.parametrize("path", [*sorted((ROOT / "components").rglob("*.py")),
                                  *sorted((ROOT / "pipelines").rglob("*.py"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_pipeline_runs_never_use_seeded_noise(path):
    """Seeded (numpy, floating-point-unsafe) noise is for experiments only: a component or a
    pipeline always draws from OpenDP (``sage_tfx.dp.noise``)."""
    assert "SeededNoise" not in path.read_text(), (
        f"{path.relative_to(ROOT)} uses SeededNoise; pipeline runs must use OpenDP noise")
