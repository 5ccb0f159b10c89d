"""PTK types from a server-side registry the operator declares — never from a client-named import.

A PTK registration names a *registered type* (``"histstats"``), not code: the store looks the
name up in a :class:`TypeRegistry` and calls the functions the operator put there. The ptklib
kernels are built in under their module names (:data:`BUILTIN_TYPES`); an operator adds types

* in Python: ``registry.register("mytype", train_dp=..., eval=..., dp_event=...)`` or
  ``registry.register_module(my_kernel_module)``;
* by configuration: ``sage-tfx ptk serve --ptk-type mytype=my_pkg.my_kernel`` or the
  environment variable ``SAGE_PTK_TYPES="mytype=my_pkg.my_kernel,other=pkg.mod"`` of the
  store's (and the PTKTrainer pods') process — modules the operator trusts, imported at start.

A name a client sends is only ever a key of this table: a string that is not a registered name
(``"builtins:eval"``, ``"os:system"``) is refused with :class:`UnknownPTKTypeError` before
anything is imported or called.
"""
from __future__ import annotations

import importlib
import os
import re
import threading
from types import ModuleType
from typing import Callable, Iterable, Optional, Union

from sage_tfx.ptk.abstraction import FunctionReferenceError, PTKType

#: The ptklib kernels (Tab. 1 of the PTK paper), registered under these names.
BUILTIN_TYPES = ("counts", "trees", "hpf", "covariance", "histstats", "lloyd")
_BUILTIN_MODULES = {n: f"sage_tfx.ptk.kernels.{n}" for n in BUILTIN_TYPES}
TYPES_ENV = "SAGE_PTK_TYPES"
NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
_NAME_RE = re.compile(NAME_PATTERN)
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class UnknownPTKTypeError(FunctionReferenceError):
    """A PTK type name that is not in the operator's registry (or not a name at all)."""


def check_type_name(name) -> str:
    """``name`` if it is a well-formed type name (1-64 of letters, digits, ``_ . -``)."""
    if isinstance(name, str) and ":" in name:
        raise UnknownPTKTypeError(
            f"{name[:80]!r} is a code reference; PTK types are registered by the store's "
            "operator and named by type (e.g. 'histstats'): no client-named code is imported")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UnknownPTKTypeError(
            f"a PTK type name is 1-64 letters, digits, '_', '.' or '-', got {str(name)[:80]!r}")
    return name


def parse_type_specs(text: str) -> list[tuple[str, str]]:
    """``"name=pkg.mod,pkg.other"`` -> [(name, module)] (a bare module registers under its last
    component). Operator configuration only: this names modules to import."""
    out = []
    for item in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, module = item.partition("=")
        if not sep:
            name, module = item.rsplit(".", 1)[-1], item
        if not _MODULE_RE.match(module.strip()):
            raise FunctionReferenceError(f"not a module path: {module!r} (in {item!r})")
        out.append((check_type_name(name.strip()), module.strip()))
    return out


class TypeRegistry:
    """Registered PTK types by name (thread-safe). ``builtins``: the ptklib kernels."""

    def __init__(self, *, builtins: bool = True):
        self._lock = threading.Lock()
        self._types: dict[str, PTKType] = {}
        self._builtin = set(BUILTIN_TYPES) if builtins else set()

    def register(self, name: str, *, train_dp: Callable, eval: Callable,  # noqa: A002
                 dp_event: Callable, erm: Optional[Callable] = None,
                 featurize: Optional[Callable] = None, replace: bool = False) -> PTKType:
        """Registers functions under ``name`` (operator code). Refuses to silently replace a
        registered type unless ``replace``."""
        return self._add(PTKType(check_type_name(name), train_dp, eval, dp_event, erm, featurize),
                         replace)

    def register_module(self, module: Union[ModuleType, str], name: Optional[str] = None, *,
                        replace: bool = False) -> PTKType:
        """Registers the type a kernel module defines; ``module`` is a module object or the
        import path of a module the operator trusts (never a client's string)."""
        if isinstance(module, str):
            if not _MODULE_RE.match(module):
                raise FunctionReferenceError(f"not a module path: {module!r}")
            try:
                module = importlib.import_module(module)
            except ImportError as exc:
                raise FunctionReferenceError(f"cannot import {module!r}: {exc}") from exc
        name = check_type_name(name or module.__name__.rsplit(".", 1)[-1])
        return self._add(PTKType.from_module(name, module), replace)

    def _add(self, ptk_type: PTKType, replace: bool) -> PTKType:
        with self._lock:
            if not replace and (ptk_type.name in self._types or ptk_type.name in self._builtin):
                raise FunctionReferenceError(
                    f"PTK type {ptk_type.name!r} is already registered (replace=True to swap it)")
            self._builtin.discard(ptk_type.name)
            self._types[ptk_type.name] = ptk_type
            return ptk_type

    def get(self, name) -> PTKType:
        """The registered type ``name``. Raises :class:`UnknownPTKTypeError` (nothing imported)."""
        check_type_name(name)
        with self._lock:
            found = self._types.get(name)
            if found is None and name in self._builtin:
                # a fixed table of the package's own kernels: the client's string is a key only
                module = importlib.import_module(_BUILTIN_MODULES[name])
                found = self._types[name] = PTKType.from_module(name, module)
                self._builtin.discard(name)
        if found is None:
            raise UnknownPTKTypeError(
                f"no PTK type {name!r} is registered; registered: {', '.join(self.names())}")
        return found

    def names(self) -> list[str]:
        """Every registered type name (built-in and operator-registered), sorted."""
        with self._lock:
            return sorted(set(self._types) | self._builtin)

    def __contains__(self, name) -> bool:
        try:
            check_type_name(name)
        except UnknownPTKTypeError:
            return False
        return name in self.names()


def registry_from(specs: Iterable[tuple[str, str]] = (), *, builtins: bool = True,
                  environ=os.environ) -> TypeRegistry:
    """The built-ins, the modules of ``$SAGE_PTK_TYPES`` and ``specs`` (operator configuration)."""
    reg = TypeRegistry(builtins=builtins)
    for name, module in [*parse_type_specs(environ.get(TYPES_ENV, "")), *specs]:
        reg.register_module(module, name)
    return reg


_DEFAULT: Optional[TypeRegistry] = None
_DEFAULT_LOCK = threading.Lock()


def default_registry() -> TypeRegistry:
    """The process's registry: built-ins plus ``$SAGE_PTK_TYPES`` (read once)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = registry_from()
        return _DEFAULT
