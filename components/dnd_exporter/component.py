"""DnDExporter: a live Draw-and-Discard server's model as a ``Model`` artifact (Format-Serving),
usable by DPModelValidator and Pusher. No inputs; no budget (the average is a DP output).

By default the export releases the run (``POST /v1/release``): the model is recorded against the
run's grant by the server, and a re-executed exporter gets the same weights byte for byte
(``dnd_model_sha256`` on the artifact). The caller's token comes from ``token_file`` (a path,
never the token itself in an exec property) or ``$SAGE_LEDGER_TOKEN`` / ``$SAGE_LEDGER_TOKEN_FILE``.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.dsl.io import fileio
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import path_utils

from sage_tfx.components.dnd_trainer.protocol import FeatureSpec, features_from_json, \
    features_to_json

SERVER_URL_KEY = "server_url"
FEATURES_KEY = "features"
RELEASE_KEY = "release"          # int 1 (default): release the run; 0: its live average
TOKEN_FILE_KEY = "token_file"    # a file holding the caller's bearer token ('' = environment)
MODEL_KEY = "model"


class DnDExporterSpec(ComponentSpec):
    PARAMETERS = {SERVER_URL_KEY: ExecutionParameter(type=str),
                  FEATURES_KEY: ExecutionParameter(type=str),
                  RELEASE_KEY: ExecutionParameter(type=int, optional=True),
                  TOKEN_FILE_KEY: ExecutionParameter(type=str, optional=True)}
    INPUTS: Dict[str, ChannelParameter] = {}
    OUTPUTS = {MODEL_KEY: ChannelParameter(type=standard_artifacts.Model)}


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        from sage_tfx.components.dnd_exporter.exporter import export_from_server
        [model] = output_dict[MODEL_KEY]
        token = None
        if exec_properties.get(TOKEN_FILE_KEY):
            with open(exec_properties[TOKEN_FILE_KEY]) as f:
                token = f.read().strip()
        served = export_from_server(exec_properties[SERVER_URL_KEY],
                                    path_utils.serving_model_path(model.uri),
                                    features_from_json(exec_properties[FEATURES_KEY]), token=token,
                                    release=exec_properties.get(RELEASE_KEY, 1) != 0)
        if "run_id" in served:
            model.set_string_custom_property("dnd_run_id", served["run_id"])
        model.set_int_custom_property("dnd_final", int(served["final"]))
        model.set_string_custom_property("dnd_model_sha256", served["model_sha256"])
        with fileio.open(os.path.join(model.uri, "privacy_report.json"), "w") as f:
            f.write(json.dumps({"source": "dnd server average", "spec": served}, indent=2,
                               sort_keys=True))


class DnDExporter(base_component.BaseComponent):
    """Exports ``server_url``'s released model (or live average, ``release=False``) with the
    given features' public bounds."""

    SPEC_CLASS = DnDExporterSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)

    def __init__(self, *, server_url: str, features: Sequence[FeatureSpec], release: bool = True,
                 token_file: str = ""):
        text = features_to_json(list(features))
        features_from_json(text)
        super().__init__(spec=DnDExporterSpec(server_url=server_url, features=text,
                                              release=int(bool(release)), token_file=token_file,
                                              model=types.Channel(type=standard_artifacts.Model)))
