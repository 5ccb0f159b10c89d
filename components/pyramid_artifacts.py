"""Artifact types of the Pyramid components.

* :class:`PyramidWindowTable` — one sealed window of DP count tables.
    - ``{uri}/window.json``: window id, run id, grant id, ε charged, per-table ε and noise scales.
* :class:`PyramidFeaturization` — a snapshot of the featurization (sum of the live windows).
    - ``{uri}/featurization.npz``: ``sage_tfx.pyramid.Featurization.save`` (summed sketches,
      noisy label prior, noise variances, the count spec, the live windows).

Both hold only DP releases (noisy tables and their public parameters), never raw observations.
"""
from tfx.types.artifact import Artifact, Property, PropertyType

WINDOW_FILE = "window.json"
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
    PROPERTIES = {
        WINDOW_PROPERTY: Property(type=PropertyType.INT),
        RUN_ID_PROPERTY: Property(type=PropertyType.STRING),
        GRANT_ID_PROPERTY: Property(type=PropertyType.STRING),
        EPSILON_PROPERTY: Property(type=PropertyType.FLOAT),
        SPEC_DIGEST_PROPERTY: Property(type=PropertyType.STRING),
    }


class PyramidFeaturization(Artifact):
    """A featurization snapshot: the summed DP tables of the live windows."""

    TYPE_NAME = "sage_tfx.PyramidFeaturization"
    PROPERTIES = {
        WINDOWS_PROPERTY: Property(type=PropertyType.STRING),
        SPEC_DIGEST_PROPERTY: Property(type=PropertyType.STRING),
    }
