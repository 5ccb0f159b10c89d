"""DnDExporter: the average model of a live Draw-and-Discard server as a serving SavedModel.

Importing this package is cheap: names load TFX / TensorFlow on first use.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "DnDExporter": "sage_tfx.components.dnd_exporter.component",
    "export_from_server": "sage_tfx.components.dnd_exporter.exporter",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
