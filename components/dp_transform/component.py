"""DPTransform: TFX Transform whose analyzers are DP and spend the grant's ``transform`` ε.

Sage §3.1, List. 1: a drop-in replacement for ``tfx.components.Transform`` in a Sage pipeline::

    plan = PrivacyPlan.of(PlanPart("transform", 0.1), PlanPart("train", 0.8, 1e-6), ...)
    gate = SageGate(ledger_url=..., stream="taxi", window_last=30, plan=plan)  # charges the plan
    example_gen = BlockExampleGen(grant=gate.outputs["grant"])
    transform = DPTransform(examples=example_gen.outputs["examples"],
                            schema=schema_gen.outputs["schema"],
                            grant=gate.outputs["grant"],
                            module_file="taxi_dp_utils.py",
                            public_features=["payment_type"])
    trainer = tfx.components.Trainer(transform_graph=transform.outputs["transform_graph"],
                                     examples=transform.outputs["transformed_examples"], ...)

The ``preprocessing_fn`` contract (module file, or ``preprocessing_fn`` import path, as for
Transform):

* ``preprocessing_fn(inputs)``, ``preprocessing_fn(inputs, epsilon)`` (Sage List. 1) or either
  with ``custom_config``: ``epsilon`` (if the function takes it) is the plan's ``transform``
  ε; it is also ``analyzers.active_budget().epsilon`` inside the function.
* Dataset statistics come from the DP analyzers of
  ``sage_tfx.components.dp_transform.analyzers`` (``dp_mean``, ``dp_scale_to_0_1``,
  ``dp_group_by_mean``, ``dp_quantiles``, ...), each called with its share of ε; together they
  must spend the ε exactly (over-spending fails at the analyzer, under-spending at the end of the
  trace). In an rdp plan the transform part is the DpEvent the analyzers produce (compute it with
  ``privacy.trace_dp_event``).
* Stock analyzers (``tft.mean``, ``tft.vocabulary``, ``tft.scale_to_z_score``, ``tft.bucketize``,
  ...) are allowed only over features listed in ``public_features``; anything else is refused with
  an error naming the analyzer (see ``audit.py``). Instance-level ops are unrestricted.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence, Union

from tfx import types
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.orchestration import data_types
from tfx.proto import transform_pb2
from tfx.types import standard_artifacts
from tfx.utils import json_utils

from sage_tfx.components.dp_transform import executor
from sage_tfx.components.dp_transform import spec
from sage_tfx.components.gate.executor import check_ledger_url


class DPTransform(base_beam_component.BaseBeamComponent):
    """Transforms Examples with a DP ``preprocessing_fn`` paid for by the grant's plan.

    Component ``inputs`` contains:
      - ``examples``: Channel of type ``standard_artifacts.Examples`` (BlockExampleGen output).
      - ``schema``: Channel of type ``standard_artifacts.Schema``.
      - ``grant``: Channel of type ``SageGrant`` whose plan has a ``transform`` part.
    Component ``outputs`` contains (as Transform's):
      - ``transform_graph``: Channel of type ``standard_artifacts.TransformGraph``; custom
        properties record the grant, the ε spent and each DP analyzer's spend (``spec``).
      - ``transformed_examples``: Channel of type ``standard_artifacts.Examples`` (if
        ``materialize``).
    """

    SPEC_CLASS = spec.DPTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples: types.BaseChannel, schema: types.BaseChannel,
                 grant: types.BaseChannel, *,
                 module_file: Optional[Union[str, data_types.RuntimeParameter]] = None,
                 preprocessing_fn: Optional[Union[str, data_types.RuntimeParameter]] = None,
                 public_features: Sequence[str] = (),
                 splits_config: Optional[transform_pb2.SplitsConfig] = None,
                 materialize: bool = True,
                 force_tf_compat_v1: bool = False,
                 custom_config: Optional[Dict[str, Any]] = None,
                 ledger_url: Optional[str] = None):
        """Constructs a DPTransform.

        Args:
          examples: Examples read under ``grant`` (BlockExampleGen output).
          schema: the Schema of the raw examples.
          grant: the SageGate ``grant`` output; its plan's ``transform`` part is the budget.
          module_file: path of a Python module defining ``preprocessing_fn`` (see module doc).
          preprocessing_fn: import path of the function, instead of ``module_file``.
          public_features: features whose values may be released exactly: stock (non-DP)
            analyzers may read them. Everything else is private.
          splits_config: as Transform: splits to analyze (default train) and to transform.
          materialize: write ``transformed_examples``.
          force_tf_compat_v1: trace in TF1 graph mode, as Transform.
          custom_config: dict passed to a ``preprocessing_fn`` that takes ``custom_config``.
          ledger_url: the ledger to verify the grant against; default the one named in the
            grant artifact.

        Raises:
          ValueError: both or neither of module_file / preprocessing_fn, malformed
            public_features or ledger_url.
        """
        if bool(module_file) == bool(preprocessing_fn):
            raise ValueError("Exactly one of 'module_file' or 'preprocessing_fn' must be supplied.")
        if isinstance(public_features, str):
            raise ValueError("public_features must be a list of feature names, not a string")
        public = executor.parse_public_features(list(public_features))
        if ledger_url is not None and type(ledger_url).__name__ != "RuntimeParameter":
            check_ledger_url(ledger_url)
        transformed_examples = None
        if materialize:
            transformed_examples = types.Channel(type=standard_artifacts.Examples)
            transformed_examples.matching_channel_name = spec.EXAMPLES_KEY
        super().__init__(spec=spec.DPTransformSpec(
            examples=examples,
            schema=schema,
            grant=grant,
            module_file=module_file,
            preprocessing_fn=preprocessing_fn,
            force_tf_compat_v1=int(force_tf_compat_v1),
            splits_config=splits_config,
            custom_config=json_utils.dumps(custom_config),
            public_features=json.dumps(list(public)),
            ledger_url=ledger_url,
            transform_graph=types.Channel(type=standard_artifacts.TransformGraph),
            transformed_examples=transformed_examples,
        ))
        if udf_utils.should_package_user_modules():
            # As Transform: the module file is packaged and passed as module_path at run time.
            udf_utils.add_user_module_dependency(self, spec.MODULE_FILE_KEY, spec.MODULE_PATH_KEY)
