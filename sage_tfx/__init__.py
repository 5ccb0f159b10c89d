"""sage-tfx: differentially private TFX pipelines under block-composition access control.

The privacy core; no TensorFlow, TFX or Beam at import time. Layers, each importing only the
ones listed before it (``tests/test_layout.py`` enforces the rules; ``docs/design.md`` draws them):

``sage_tfx.ledger``
    The hub: streams, blocks, requests and grants, the basic and rdp accounting modes, the audit
    chain, the SQLite and PostgreSQL stores. Every system charges its privacy cost here.
``sage_tfx.streams``
    Splitting a stream into blocks (Beam and in-memory), datasets, the example codec.
``sage_tfx.dp``
    Mechanisms, DP statistics, DP-SGD and DP regressions, SLAed validators.
``sage_tfx.adaptive``
    Privacy plans, the per-block allocator and the privacy-adaptive search.
``sage_tfx.ptk``, ``sage_tfx.pyramid``, ``sage_tfx.bagging``, ``sage_tfx.dnd``
    The systems of ``docs/papers.md`` (as they arrive): each depends on the shared layers
    above and never on a sibling system; its paper reproduction lives in its own ``eval/``.
``sage_tfx.eval``
    Sage's own §5 reproduction (the library behind ``benchmarks/sage/``).

Above the core: ``sage_tfx.components`` (TFX components, from ``components/``) and
``sage_tfx.pipelines`` (runnable pipelines, from ``pipelines/``); the core never imports them.
``sage_tfx.cli`` is the ``sage-tfx`` command; ``sage_tfx.errors`` the exceptions every layer raises.

:data:`PUBLIC_API` lists the supported import paths in one place (``tests/test_layout.py``
imports every name).
"""

# module -> the names users import from it. Anything else is internal and may move.
PUBLIC_API: dict[str, tuple[str, ...]] = {
    "sage_tfx.ledger": (
        "open_ledger", "Ledger", "Window", "BlockSpec", "BlockState", "Grant", "GrantedBlock",
        "Decision", "Stream", "AuditEntry", "AuditReport", "DEFAULT_CONTEXT", "BASIC", "RDP"),
    "sage_tfx.ledger.anchor": ("write_anchor", "verify_anchors", "read_key", "AnchorReport"),
    "sage_tfx.ledger.releases": ("Release", "Outcome", "release_value_once", "release_tree_once",
                                 "tree_digest", "MAX_VALUE_BYTES"),
    "sage_tfx.ledger.access": ("Principal", "ADMIN", "PIPELINE", "AUDITOR", "CLIENT", "ROLES",
                               "TOKEN_ENV", "TOKEN_FILE_ENV"),
    "sage_tfx.ledger.secrets": ("resolve", "redact", "has_password", "check_no_password"),
    "sage_tfx.ledger.leases": ("Lease",),
    "sage_tfx.services": ("Authenticator", "BodyLimit", "install_error_handlers"),
    "sage_tfx.ledger.keys": ("KeyProvider", "LocalKeyFile", "DataKey", "provider",
                             "register_provider", "aad_for", "PROVIDER_ENV"),
    "sage_tfx.ledger.accounting": (
        "check_epsilon", "check_delta", "check_positive", "check_event", "event_to_json",
        "event_from_json", "rdp_epsilon", "DEFAULT_RDP_ORDERS"),
    "sage_tfx.streams": (
        "BlockScheme", "TimeWindowScheme", "HashBucketScheme", "scheme_from_spec",
        "block_location", "split_into_blocks", "split_and_register", "SplitResult",
        "nycflights13_csv", "chicago_taxi_csv_path"),
    "sage_tfx.dp.mechanisms": (
        "LaplaceMechanism", "GaussianMechanism", "analytic_gaussian_sigma", "gaussian_delta",
        "split_budget", "BudgetShare"),
    "sage_tfx.dp.noise": (
        "laplace", "gaussian", "discrete_laplace", "discrete_gaussian", "laplace_epsilon",
        "gaussian_rho", "SeededNoise", "SECURE"),
    "sage_tfx.dp.queries": (
        "DPRelease", "dp_count", "dp_sum", "dp_mean", "dp_group_by_count", "dp_group_by_sum",
        "dp_group_by_mean"),
    "sage_tfx.dp.histograms": ("dp_histogram", "dp_min_max", "dp_quantiles"),
    "sage_tfx.dp.feature_statistics": ("NumericFeature", "CategoricalFeature",
                                       "StatisticsConfig"),
    "sage_tfx.components.dp_statistics_gen": ("DPStatisticsGen", "statistics_part"),
    "sage_tfx.dp.dpsgd": (
        "dpsgd_event", "dpsgd_epsilon", "calibrate_noise_multiplier", "dpsgd_guarantee",
        "DPGuarantee"),
    "sage_tfx.dp.keras_dpsgd": ("make_dp_keras_model", "compile_dp", "train_dp_keras",
                                "make_poisson_dp_model", "poisson_batches"),
    "sage_tfx.dp.adassp": ("adassp", "AdaSSPResult"),
    "sage_tfx.dp.logistic": ("dp_logistic_regression", "DPLogisticResult"),
    "sage_tfx.dp.validation": (
        "Outcome", "ValidationResult", "LossValidator", "AccuracyValidator",
        "SumStatisticValidator"),
    "sage_tfx.dp.granted": ("release_json_once", "validate_once", "adassp_once", "JsonRelease"),
    "sage_tfx.adaptive": (
        "PlanPart", "PrivacyPlan", "Allocator", "AdaptiveSearch", "SearchConfig",
        "IterationRecord", "run_statistic_iteration", "StatisticIteration"),
    "sage_tfx.errors": (
        "SageError", "InvalidPrivacyParameterError", "AccountingModeError", "UnknownStreamError",
        "UnknownBlockError", "RetiredBlockError", "InvalidRequestError", "GrantStateError",
        "MissingGrantError", "ReleaseConflictError", "AuthenticationError",
        "PermissionDeniedError", "LeaseTimeoutError"),
    "sage_tfx.dp.counts": (
        "CountSketch", "CountTable", "COUNT_MIN", "COUNT_MEDIAN", "key_hashes", "l1_sensitivity",
        "table_epsilons", "noise_scales"),
    "sage_tfx.dp.count_selection": (
        "private_count_quantile", "mi_score", "mi_score_sensitivity", "private_top_k"),
    "sage_tfx.dp.partition_selection": (
        "PartitionSelection", "select_partitions", "threshold", "bound_contributions",
        "bounded_counts", "order_and_filter", "recall"),
    "sage_tfx.pyramid": (
        "CountSpec", "Featurization", "PyramidStore", "SealResult", "WindowSealedError",
        "RetentionError", "BudgetDeniedError", "UnknownFeatureError", "NonCategoricalError",
        "select_groups", "select_noise_weights", "exact_noise_weights", "pyramid_run_id",
        "window_event"),
    "sage_tfx.pyramid.graph": ("featurizer_module", "save_featurizer", "example_feature_kinds"),
    "sage_tfx.bagging": (
        "BaggingConfig", "plan_labels", "labels_from_grant", "fit_dp_bagging", "chunk_assignment",
        "train_teachers", "vote_counts", "noisy_argmax", "label_public", "train_student",
        "max_queries", "epsilon_of", "queries_event", "PersonalisedMomentsAccountant",
        "TeacherCache"),
    "sage_tfx.components.dp_bagging_trainer": ("DPBaggingTrainer", "bagging_cost"),
    "sage_tfx.dnd": (
        "ClientConfig", "client_update", "FeatureBounds", "GLMSpec", "SpamCheck", "paper_rule",
        "DnDState", "initial_instances", "stationary_variance"),
    "sage_tfx.dnd.budget": ("RunBudget", "UpdateRefused", "request_run", "run_epsilon",
                            "run_event"),
    "sage_tfx.dnd.server": ("create_app", "build_service", "main"),
    "sage_tfx.dnd.simulator": ("simulate", "SimulationResult"),
    "sage_tfx.components.dnd_trainer": ("DnDTrainer", "dnd_train_part", "FeatureSpec",
                                        "export_glm"),
    "sage_tfx.components.dnd_trainer.protocol": ("RunSettings", "run_protocol"),
    "sage_tfx.components.dnd_exporter": ("DnDExporter", "export_from_server"),
    "sage_tfx.cli": ("main",),
    "sage_tfx.components": (
        "SageGate", "BlockExampleGen", "DPTransform", "DPTrainer", "DPModelValidator",
        "DPStatisticsGen", "SageGrant", "PTKTrainer", "PTKFeaturizer", "PTKState", "DnDTrainer",
        "DnDExporter",
        "DPBaggingTrainer", "PyramidCountTable", "PyramidSnapshot", "PyramidTransform",
        "PyramidWindowTable", "PyramidFeaturization"),
    "sage_tfx.components.dp_transform.analyzers": (
        "DPPreprocessingFn", "dp_mean", "dp_scale_to_0_1", "dp_group_by_mean", "dp_count",
        "dp_quantiles"),
    "sage_tfx.components.dp_trainer": ("DPTrainer", "DPSGDSpec", "AdaSSPSpec", "ModelFnArgs",
                                       "ArchitectureError"),
    # The PTK store (docs/papers.md, "PTK store").
    "sage_tfx.ptk": (
        "PTKStore", "StoreConfig", "Reject", "PTK", "PTKType", "PrivacyCharge", "allocate",
        "Allocation", "Option", "UnknownPTKError", "FunctionReferenceError",
        "UnaccountableEventError", "PerformanceTargetError", "SubscriberError"),
    "sage_tfx.ptk.registry": ("TypeRegistry", "UnknownPTKTypeError", "default_registry",
                              "registry_from"),
    "sage_tfx.ptk.profiler": ("ProfileParams", "profile_menu", "profile_entry", "profile_cost"),
    "sage_tfx.ptk.service": ("create_app", "serve", "main"),
    "sage_tfx.components.ptk_trainer.component": ("PTKTrainer",),
    "sage_tfx.components.ptk_featurizer.component": ("PTKFeaturizer",),
    # ptklib kernels 1-3 (count featurization, DP trees, DP HPF) and the Fig. 5 harness.
    "sage_tfx.ptk.kernels.counts": ("train_dp", "eval", "dp_event", "erm", "featurize"),
    "sage_tfx.ptk.kernels.trees": ("train_dp", "eval", "dp_event", "erm", "featurize"),
    "sage_tfx.ptk.kernels.hpf": ("train_dp", "eval", "dp_event", "erm", "featurize"),
    "sage_tfx.ptk.eval.fig5": ("run_fig5", "run_and_write", "summarize", "write_csv", "plot"),
    # ptklib kernels 4-6 (Analyze-Gauss, historical statistics, DP Lloyd) and the PTK demo.
    "sage_tfx.ptk.kernels.covariance": ("train_dp", "eval", "dp_event", "erm", "featurize"),
    "sage_tfx.ptk.kernels.histstats": ("train_dp", "eval", "dp_event", "erm", "featurize"),
    "sage_tfx.ptk.kernels.lloyd": ("train_dp", "eval", "dp_event", "train_nonprivate",
                                   "featurize", "noise_multipliers"),
    "sage_tfx.pipelines.ptk_demo": ("run", "main"),
    # Trustworthy DP: Poisson DP-SGD, empirical privacy audits.
    "sage_tfx.dp.audit": (
        "audit_mechanism", "epsilon_lower_bound", "clopper_pearson", "membership_inference",
        "one_run_audit", "one_run_epsilon_lower_bound", "textbook_laplace_reachable",
        "gaussian_shift_audit"),
    "sage_tfx.pipelines.lineage": ("open_store", "privacy_lineage", "GrantLineage"),
    # One surface: each system's cost as the DpEvent it charges (docs/design.md, "One surface").
    "sage_tfx.adaptive.cost": ("cost",),
    "sage_tfx.ptk.cost": ("cost",),
    "sage_tfx.pyramid.cost": ("cost",),
    "sage_tfx.bagging.cost": ("cost",),
    "sage_tfx.dnd.cost": ("cost",),
}


# Artifact type name ``sage_tfx.<Name>`` -> the module that defines the class.
_ARTIFACT_TYPES = {
    "SageGrant": "sage_tfx.components.artifacts",
    "PTKState": "sage_tfx.components.ptk_trainer.spec",
    "PyramidWindowTable": "sage_tfx.components.pyramid_artifacts",
    "PyramidFeaturization": "sage_tfx.components.pyramid_artifacts",
}


def __getattr__(name: str):  # pylint: disable=invalid-name
    """``sage_tfx.SageGrant`` (and the other custom artifact types, ``sage_tfx.PTKState``,
    ``sage_tfx.PyramidWindowTable``, ``sage_tfx.PyramidFeaturization``): the class behind the
    artifact type name.

    A Kubeflow Pipelines v2 pod rebuilds a custom-typed artifact by importing its type name as a
    class path (TFX's ``kubeflow_v2_entrypoint_utils``), so these names must resolve. They are
    looked up by name only when asked for: importing the core still imports no TFX and no
    components.
    """
    if name in _ARTIFACT_TYPES:
        import importlib
        return getattr(importlib.import_module(_ARTIFACT_TYPES[name]), name)
    raise AttributeError(f"module 'sage_tfx' has no attribute {name!r}")
