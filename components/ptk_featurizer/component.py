"""PTKFeaturizer: featurizes Examples with a pinned PTK version (PTK paper §4.1, ``featurize``).

The version is pinned by the ``ptk_state`` input (a PTKTrainer output) or by ``ptk_id`` and
``version``; the output Examples record ``ptk_id``, ``ptk_version`` and ``ptk_grant_id`` (lineage).
Featurizing reads only the PTK's DP state: it charges nothing to the ledger (post-processing).
``featurize_fn`` names the registered PTK type whose ``featurize`` runs (default: the PTK's own
type); a ``module:function`` reference is refused, like everywhere in the PTK store.
"""
from __future__ import annotations

from typing import Optional

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts

from sage_tfx.components.ptk_featurizer import executor, spec
from sage_tfx.ptk.registry import check_type_name


class PTKFeaturizer(base_component.BaseComponent):
    """Outputs ``featurized_examples``: the input splits plus the PTK's features."""

    SPEC_CLASS = spec.PTKFeaturizerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, ledger_url: str,
                 featurize_fn: Optional[str] = None,
                 ptk_state: Optional[types.BaseChannel] = None, ptk_id: Optional[str] = None,
                 version: Optional[int] = None):
        if featurize_fn is not None:
            check_type_name(featurize_fn)
        if ptk_state is None and (ptk_id is None or not isinstance(version, int) or version < 1):
            raise ValueError("pin a PTK version: give ptk_state, or ptk_id and version >= 1")
        super().__init__(spec=spec.PTKFeaturizerSpec(
            examples=examples, ptk_state=ptk_state, ledger_url=ledger_url, ptk_id=ptk_id,
            version=version, featurize_fn=featurize_fn,
            featurized_examples=types.Channel(type=standard_artifacts.Examples)))
