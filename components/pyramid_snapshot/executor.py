"""PyramidSnapshot executor: sums the live sealed windows of a store into featurization.npz
(a tree store: the complete dyadic nodes covering them)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.components import pyramid_artifacts as pa
from sage_tfx.components.pyramid_snapshot import spec as s
from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid import CountSpec, PyramidStore


class Executor(base_executor.BaseExecutor):

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        spec = CountSpec.from_json(json.loads(exec_properties[s.SPEC_JSON_KEY]))
        store = PyramidStore(spec, exec_properties[s.STORE_DIR_KEY],
                             retention=int(exec_properties[s.RETENTION_KEY]),
                             max_variance=float(exec_properties[s.MAX_VARIANCE_KEY]))
        if not store.live_windows:
            raise InvalidRequestError("the store has no sealed window: nothing to featurize with")
        feat = store.featurization(cache=False)
        out = artifact_utils.get_single_instance(output_dict[s.FEATURIZATION_KEY])
        path = os.path.join(out.uri, pa.FEATURIZATION_FILE)
        feat.save(path)
        out.windows = json.dumps(list(feat.windows))
        out.spec_digest = spec.digest()
