"""Lazy package exports: a name is imported from its module on first attribute access.

Used by packages whose exports import TFX / TensorFlow, so that importing the package stays cheap.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, names: Mapping[str, str], namespace: dict
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for a package exporting ``names`` (name -> module).

    A loaded name is cached in ``namespace`` (the package's ``globals()``), so the module-level
    ``__getattr__`` runs once per name.
    """
    exported = sorted(names)

    def __getattr__(name: str) -> Any:  # pylint: disable=invalid-name
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:  # pylint: disable=invalid-name
        return sorted(list(namespace) + exported)

    return exported, __getattr__, __dir__
