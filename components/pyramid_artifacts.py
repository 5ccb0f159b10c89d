"""Artifact types of the Pyramid components.

* :class:`PyramidWindowTable` — one sealed window of DP count tables.
    - ``{uri}/window.json``: window id, run id, grant id, ε charged, per-table ε and noise scales,
      the ledger release name and whether this run replayed it.
    - ``{uri}/tables.npz``: the window's noisy tables, byte for byte the release recorded
      against the grant (the store's ``sealed/w<id>.npz`` is another copy).
* :class:`PyramidFeaturization` — a snapshot of the featurization (sum of the live windows).
    - ``{uri}/featurization.npz``: ``sage_tfx.pyramid.Featurization.save`` (summed sketches,
      noisy label prior, noise variances, the count spec, the live windows).

Both hold only DP releases (noisy tables and their public parameters), never raw observations.
Their metadata (``window``, ``run_id``, ... below) are MLMD custom properties, read and written as
attributes: the types declare no PROPERTIES, which Kubeflow Pipelines v2 IR cannot carry for a
custom artifact type.
"""
from tfx.types.artifact import Artifact

from sage_tfx.components.artifacts import _custom_property

WINDOW_FILE = "window.json"
TABLES_FILE = "tables.npz"
FEATURIZATION_FILE = "featurization.npz"

WINDOW_PROPERTY = "window"
RUN_ID_PROPERTY = "run_id"
GRANT_ID_PROPERTY = "grant_id"
EPSILON_PROPERTY = "epsilon"
WINDOWS_PROPERTY = "windows"
SPEC_DIGEST_PROPERTY = "spec_digest"


class PyramidWindowTable(Artifact):
    """A sealed window of DP count tables (layout in the module docstring)."""

    TYPE_NAME = "sage_tfx.PyramidWindowTable"
    window = _custom_property(WINDOW_PROPERTY, "int", "the sealed window's index")
    run_id = _custom_property(RUN_ID_PROPERTY, "string", "the ledger run id that paid for it")
    grant_id = _custom_property(GRANT_ID_PROPERTY, "string", "the grant that paid for it")
    epsilon = _custom_property(EPSILON_PROPERTY, "float", "ε charged for the window's tables")
    spec_digest = _custom_property(SPEC_DIGEST_PROPERTY, "string", "digest of the CountSpec")


class PyramidFeaturization(Artifact):
    """A featurization snapshot: the summed DP tables of the live windows."""

    TYPE_NAME = "sage_tfx.PyramidFeaturization"
    windows = _custom_property(WINDOWS_PROPERTY, "string", "the live windows, a JSON list")
    spec_digest = _custom_property(SPEC_DIGEST_PROPERTY, "string", "digest of the CountSpec")
