"""Kubeflow Pipelines v2: the system pipelines (PTK, Pyramid, DP bagging, Draw-and-Discard)
compile with TFX's KubeflowV2DagRunner, like the pipelines of ``orchestration.PIPELINES``.

Compiling reads no data: the pipelines are built with tiny arguments on temporary paths (the PTK
pipeline reads its allocation from a real PTK store, so one PTK is registered first).
"""
import pytest

pytestmark = pytest.mark.slow

IMAGE = "sage-tfx:test"
KFP_JOB_UUID = "{{$.pipeline_job_uuid}}"


def _ptk(tmp_path):
    from sage_tfx.pipelines import ptk_pipeline
    from sage_tfx.ptk import PTKStore, StoreConfig

    url = f"sqlite:///{tmp_path}/ptk-ledger.db"
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    try:
        pid = store.register_ptk(
            "histstats", tau=0.2, menu=[(0.5, 200)],
            config={"key": "city", "domain": ["a", "b"], "value": "delay", "lower": 0.0,
                    "upper": 10.0})
    finally:
        store.close()
    return ptk_pipeline.create_pipeline(
        "sage-ptk", str(tmp_path / "ptk"), str(tmp_path / "ptk.db"), url, "events", 2, pid, 0,
        "histstats")


def _pyramid(tmp_path):
    from sage_tfx.pipelines import pyramid_pipeline
    from sage_tfx.pyramid import CountSpec

    spec = CountSpec(groups=("user",), label="y", width=64, epsilon=1.0, hash_family="tf_siphash")
    return pyramid_pipeline.create_pipeline(
        "sage-pyramid", str(tmp_path / "pyr"), str(tmp_path / "pyr.db"), "sqlite:////tmp/x.db",
        "obs", spec, store_dir=str(tmp_path / "store"), count_window=0,
        count_blocks=["w0a", "w0b"], hot_blocks=["hot"], hot_epsilon=0.5)


def _bagging(tmp_path):
    from sage_tfx.pipelines import dp_bagging_pipeline

    return dp_bagging_pipeline.create_pipeline(
        "sage-dp-bagging", str(tmp_path / "bag"), str(tmp_path / "bag.db"),
        ledger_url="sqlite:////tmp/x.db", stream="obs", window_last=2,
        public_csv_dir=str(tmp_path), public_size=200, epsilon=4.0, delta=1e-5, k=2, n=3,
        label_key="label", unit_key="user", feature_keys=["x0", "x1"])


def _dnd(tmp_path):
    from sage_tfx.pipelines import dnd_pipeline

    return dnd_pipeline.create_pipeline(
        "dnd-email", str(tmp_path / "dnd"), str(tmp_path / "dnd.db"),
        ledger_url="sqlite:////tmp/x.db", stream="email", window_last=2,
        settings=dnd_pipeline.email_settings(), validate_epsilon=1.0, target=0.6,
        serving_model_dir=str(tmp_path / "serving"))


SYSTEMS = {"ptk": _ptk, "pyramid": _pyramid, "dp-bagging": _bagging, "dnd": _dnd}


def test_system_pipelines_compile_to_kfp_v2_ir(tmp_path):
    from kfp_pods import deployment, load_job, pipeline_spec
    from sage_tfx.components.gate import spec as gate_spec
    from sage_tfx.components.gate.component import SageGate
    from sage_tfx.pipelines import orchestration

    for system, build in SYSTEMS.items():
        pipeline = build(tmp_path / system)
        name = pipeline.pipeline_info.pipeline_name
        assert orchestration.check_pipeline_name(name) == name
        gates = [c for c in pipeline.components if isinstance(c, SageGate)]
        assert gates, system
        orchestration.for_orchestrator(pipeline, orchestration.KUBEFLOW)
        for gate in gates:
            run_id = gate.exec_properties[gate_spec.PIPELINE_RUN_ID_KEY]
            assert run_id == orchestration.gate_component.pipeline_run_id_for("kubeflow")

        path = orchestration.compile_kubeflow(pipeline, str(tmp_path / "out"), image=IMAGE)
        spec = pipeline_spec(load_job(path))  # parses with the pipeline-spec protos
        assert spec.pipeline_info.name == name
        assert spec.schema_version == "2.1.0"
        tasks = spec.root.dag.tasks
        assert set(tasks) == {c.id for c in pipeline.components}, system
        for gate in gates:
            params = tasks[gate.id].inputs.parameters
            value = params[gate_spec.PIPELINE_RUN_ID_KEY].runtime_value.constant.string_value
            assert value == KFP_JOB_UUID, (system, gate.id)
            # Each gate's own node id: a pod derives its run id from it (two gates, two ids).
            node_id = params[gate_spec.NODE_ID_KEY].runtime_value.constant.string_value
            assert node_id == gate.id, (system, gate.id)
        # sage-tfx's own artifact types reach the IR with their metadata as custom properties.
        custom = [a.artifact_type.instance_schema for c in spec.components.values()
                  for a in c.output_definitions.artifacts.values()
                  if a.artifact_type.instance_schema.startswith("title: sage_tfx.")]
        assert custom and all("properties" not in s for s in custom), system
        for executor in deployment(spec).executors.values():
            assert executor.container.image == IMAGE
