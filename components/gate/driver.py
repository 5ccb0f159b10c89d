"""SageGate's driver under TFX's legacy launcher (AirflowDagRunner): grants named per node.

The legacy ``BaseDriver`` names every output artifact ``<output key>:<run id>``, and ML Metadata
keeps artifact names unique per type: the second SageGate of one DAG run (same type, same key
``grant``) fails in its driver, before it runs (tensorflow/tfx#4977 added the run id to the name,
not the node). This driver names the grant ``<node id>:<output key>:<run id>``. Downstream
components find their inputs by producer node and output key, never by this name.

Only the legacy launcher runs component drivers this way: ``sage_tfx.pipelines.orchestration.
for_orchestrator`` sets it for Airflow only (LocalDagRunner and Kubeflow compile a pipeline
to IR, where a custom driver class would be a different kind of driver).
"""
from __future__ import annotations

from typing import Any, Dict, List

from tfx import types
from tfx.dsl.components.base import base_driver


class NodeScopedNamesDriver(base_driver.BaseDriver):
    """``BaseDriver`` whose output artifacts are named ``<node id>:<output key>:<run id>``."""

    def _prepare_output_artifacts(self, input_artifacts: Dict[str, List[types.Artifact]],
                                  output_dict: Dict[str, types.Channel],
                                  exec_properties: Dict[str, Any], execution_id: int,
                                  pipeline_info: Any, component_info: Any
                                  ) -> Dict[str, List[types.Artifact]]:
        result = super()._prepare_output_artifacts(
            input_artifacts, output_dict, exec_properties, execution_id, pipeline_info,
            component_info)
        for key, artifacts in result.items():
            for artifact in artifacts:
                artifact.name = f"{component_info.component_id}:{key}:{pipeline_info.run_id}"
        return result
