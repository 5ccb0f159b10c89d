"""PTKFeaturizer executor: adds a pinned PTK version's features to every split of Examples.

The version is the input PTKState's (or the pinned ``ptk_id`` / ``version``); its state is read
from the lake (only DP outputs live there), ``featurize_fn(batch, state, config=...)`` returns
float columns, and each output example is the input example plus those features. The output
records ``ptk_id``, ``ptk_version`` and ``ptk_grant_id``.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.components.ptk_trainer import examples_io, spec
from sage_tfx.ledger import secrets
from sage_tfx.ptk.abstraction import UnknownPTKError, resolve_reference
from sage_tfx.ptk.lake import Lake


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        url = exec_properties[spec.LEDGER_URL_KEY]
        ptk_id, version = exec_properties.get(spec.PTK_ID_KEY), exec_properties.get(spec.VERSION_KEY)
        if input_dict.get(spec.PTK_STATE_KEY):
            st = artifact_utils.get_single_instance(input_dict[spec.PTK_STATE_KEY])
            ptk_id = st.get_string_custom_property(spec.PTK_ID_KEY)
            version = st.get_int_custom_property(spec.VERSION_KEY)
        featurize = resolve_reference(exec_properties[spec.FEATURIZE_FN_KEY])
        lake = Lake(url)
        try:
            v = lake.version(ptk_id, int(version))
        finally:
            lake.close()
        if v is None:
            raise UnknownPTKError(f"PTK {ptk_id!r} has no version {version} in "
                                  f"{secrets.redact(url)}")
        examples = artifact_utils.get_single_instance(input_dict[spec.EXAMPLES_KEY])
        out = artifact_utils.get_single_instance(output_dict[spec.FEATURIZED_KEY])
        splits = artifact_utils.decode_split_names(examples.split_names)
        for split in splits:
            raw, cols = examples_io.read_split(examples.uri, split)
            feats = featurize(cols, v["state"], config=v["config"]) if raw else {}
            for i, ex in enumerate(raw):
                for name, values in feats.items():
                    ex.features.feature[name].float_list.value.append(float(np.asarray(values)[i]))
            examples_io.write_split(out.uri, split, raw)
        out.split_names = examples.split_names
        out.set_string_custom_property("ptk_id", ptk_id)
        out.set_int_custom_property("ptk_version", int(version))
        out.set_string_custom_property("ptk_grant_id", v["grant_id"])
