"""DP Transform: TFX Transform with differentially private analyzers for Sage (Sage §3.1, List. 1).

* ``component.DPTransform`` — the component (drop-in for ``tfx.components.Transform``, plus a
  ``grant`` input and ``public_features``); ``executor.Executor`` — the stock Transform executor
  run under the grant's ``transform`` ε.
* ``analyzers`` — the DP analyzers a ``preprocessing_fn`` uses (``dp_mean``, ``dp_scale_to_0_1``,
  ``dp_group_by_mean``, ...); ``budget`` — the ε budget they charge (``DPPreprocessingFn``,
  re-exported by ``analyzers``).
* ``audit`` — refuses non-DP tf.Transform analyzers over features not declared public.
* ``privacy`` — the transform part of a privacy plan: ε for the analyzers, the spent = charged
  check, ``transform_plan_part`` to build the part (rdp: the analyzers' Laplace events).
"""
