"""PTKFeaturizer executor: adds a pinned PTK version's features to every split of Examples.

The version is the input PTKState's (or the pinned ``ptk_id`` / ``version``); its state is read
from the lake (only DP outputs live there), the registered type's ``featurize(batch, state,
config)`` (``featurize_fn``, default the PTK's own type) returns float columns, and each output
example is the input example plus those features. The output
records ``ptk_id``, ``ptk_version`` and ``ptk_grant_id``.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.components.ptk_trainer import examples_io, spec
from sage_tfx.ptk.abstraction import UnknownPTKError
from sage_tfx.ptk.lake import Lake
from sage_tfx.ptk.registry import default_registry


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        url = exec_properties[spec.LEDGER_URL_KEY]
        ptk_id, version = (exec_properties.get(spec.PTK_ID_KEY),
                           exec_properties.get(spec.VERSION_KEY))
        if input_dict.get(spec.PTK_STATE_KEY):
            st = artifact_utils.get_single_instance(input_dict[spec.PTK_STATE_KEY])
            ptk_id = st.get_string_custom_property(spec.PTK_ID_KEY)
            version = st.get_int_custom_property(spec.VERSION_KEY)
        lake = Lake(url)
        try:
            v = lake.version(ptk_id, int(version))
            rec = lake.ptk(ptk_id)
        finally:
            lake.close()
        if v is None or rec is None:
            raise UnknownPTKError(f"PTK {ptk_id!r} has no version {version} in the PTK lake")
        ptype = default_registry().get(exec_properties.get(spec.FEATURIZE_FN_KEY)
                                       or rec.ptk_type)
        examples = artifact_utils.get_single_instance(input_dict[spec.EXAMPLES_KEY])
        out = artifact_utils.get_single_instance(output_dict[spec.FEATURIZED_KEY])
        splits = artifact_utils.decode_split_names(examples.split_names)
        for split in splits:
            raw, cols = examples_io.read_split(examples.uri, split)
            feats = ptype.featurize(cols, v.state, v.config) if raw else {}
            for i, ex in enumerate(raw):
                for name, values in feats.items():
                    ex.features.feature[name].float_list.value.append(float(np.asarray(values)[i]))
            examples_io.write_split(out.uri, split, raw)
        out.split_names = examples.split_names
        out.set_string_custom_property("ptk_id", ptk_id)
        out.set_int_custom_property("ptk_version", int(version))
        out.set_string_custom_property("ptk_grant_id", v.grant_id)
