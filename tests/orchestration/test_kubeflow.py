"""Kubeflow Pipelines v2: every pipeline compiles; the flights pipeline, run pod by pod from its IR,
decides exactly what a LocalDagRunner run decides.

The KFP run executes each task's container command and arguments from the compiled JSON in its
own process (``kfp_pods``), so what is tested is what a pod gets: the SageGrant rebuilt from the
IR's artifact metadata (custom properties only), the gate's run id from KFP's job placeholder,
the Cond evaluated on the grant's ``granted`` metadata, the Beam flags from the IR.
"""
import json
import os

import pytest

from flightsdata import DELTA, EPSILON, STREAM, TARGET, WINDOW, spent

pytestmark = pytest.mark.slow

IMAGE = "sage-tfx:test"
BEAM_ARGS = ["--direct_num_workers=1", "--direct_running_mode=in_memory"]


def _config(root, ledger_url, name):
    return dict(pipeline_name=name, pipeline_root=str(root / name), ledger_url=ledger_url,
                metadata_path=str(root / name / "mlmd.db"), stream=STREAM, window_last=WINDOW,
                epsilon=EPSILON, delta=DELTA, target=TARGET, use_transform=False,
                serving_model_dir=str(root / name / "serving"),
                trainer_config={"seed": 1}, beam_pipeline_args=BEAM_ARGS)


def test_every_pipeline_compiles_to_kfp_v2_ir(tmp_path):
    from kfp_pods import deployment, load_job, pipeline_spec
    from sage_tfx.pipelines import orchestration

    configs = {
        "flights-dp": dict(_config(tmp_path, "sqlite:////tmp/l.db", "flights-dp"),
                           use_transform=True),
        "gate-stats": dict(pipeline_root=str(tmp_path), metadata_path=str(tmp_path / "m.db"),
                           ledger_url="postgresql://sage@ledger:5432/sage", stream=STREAM,
                           window_last=WINDOW, epsilon=0.5, beam_pipeline_args=BEAM_ARGS),
    }
    assert set(configs) <= set(orchestration.PIPELINES)  # all six: test_runtime_parameters.py
    for name, config in configs.items():
        path = orchestration.compile_kubeflow(orchestration.build(name, config, "kubeflow"),
                                              str(tmp_path / "out"), image=IMAGE)
        job = load_job(path)  # parses with the pipeline-spec protos
        spec = pipeline_spec(job)
        assert orchestration.KFP_NAME_RE.match(spec.pipeline_info.name), name
        assert spec.schema_version == "2.1.0"
        gate = spec.root.dag.tasks["SageGate"]
        run_id = gate.inputs.parameters["pipeline_run_id"].runtime_value.constant.string_value
        assert run_id == "{{$.pipeline_job_uuid}}"
        grant_type = spec.components["SageGate"].output_definitions.artifacts["grant"]
        assert grant_type.artifact_type.instance_schema.startswith("title: sage_tfx.SageGrant")
        assert "properties" not in grant_type.artifact_type.instance_schema
        for label, executor in deployment(spec).executors.items():
            assert executor.container.image == IMAGE
            assert list(executor.container.args[-len(BEAM_ARGS):]) == BEAM_ARGS, label
        # Everything after the gate runs only on a grant.
        for task_name, task in spec.root.dag.tasks.items():
            if task_name != "SageGate":
                assert "metadata['granted'] == 1.0" in task.trigger_policy.condition, task_name

    with pytest.raises(ValueError, match="pipeline name"):
        orchestration.build("gate-stats", dict(configs["gate-stats"], pipeline_name="Gate_Stats"))


@pytest.fixture(scope="module")
def local_run(flights_blocks, tmp_path_factory):
    """(IterationResult, config) of the flights pipeline (no DP Transform) under LocalDagRunner."""
    from sage_tfx.pipelines import flights_dp_pipeline as fp

    _, ledger_url, block_ids = flights_blocks
    config = _config(tmp_path_factory.mktemp("local"), ledger_url, "flights-local")
    c = dict(config)
    plan = fp.make_plan(c.pop("epsilon"), c.pop("delta"), transform_share=0.0)
    local = fp.run_iteration(plan=plan, **c)
    assert local.outcome == "ACCEPT" and local.pushed, local
    assert local.blocks == tuple(block_ids[-WINDOW:])
    return local, config


def test_mlmd_lineage_names_the_blocks_and_cost_of_the_model(flights_blocks, local_run):
    """"Which blocks trained this model, and at what privacy cost", from ML Metadata alone."""
    from sage_tfx.pipelines.lineage import open_store, privacy_lineage

    _, ledger_url, _ = flights_blocks
    local, config = local_run
    store = open_store(config["metadata_path"])
    [model] = store.get_artifacts_by_type("Model")
    [pushed] = store.get_artifacts_by_type("PushedModel")
    _, grants, _, _ = spent(ledger_url)
    ledger_grant = next(g for g in grants if g.grant_id == local.grant_id)
    for artifact in (model, pushed):
        [lineage] = privacy_lineage(store, artifact.id)
        assert lineage.grant_id == ledger_grant.grant_id and lineage.run_id == ledger_grant.run_id
        assert lineage.blocks == ledger_grant.block_ids == local.blocks
        assert (lineage.epsilon, lineage.delta, lineage.event) == (EPSILON, DELTA, None)
        assert (lineage.mode, lineage.stream, lineage.ledger_url) == ("basic", STREAM, ledger_url)
    # The grant itself has no upstream grant; an unknown id is an error.
    [grant_artifact] = store.get_artifacts_by_type("sage_tfx.SageGrant")
    assert privacy_lineage(store, grant_artifact.id) == []
    with pytest.raises(LookupError):
        privacy_lineage(store, 10 ** 9)


def test_kfp_pods_decide_what_local_dag_runner_decides(flights_blocks, local_run, tmp_path):
    import kfp_pods
    from sage_tfx.components.gate.executor import derive_run_id
    from sage_tfx.pipelines import orchestration

    _, ledger_url, block_ids = flights_blocks
    granted = tuple(block_ids[-WINDOW:])
    local, _ = local_run

    # The same pipeline compiled for Kubeflow, every task run as its pod would run it.
    kfp_config = _config(tmp_path, ledger_url, "flights-kfp")
    path = orchestration.compile_kubeflow(orchestration.build("flights-dp", kfp_config, "kubeflow"),
                                          str(tmp_path / "kfp"), image=IMAGE)
    job_uuid = "8f3c1d2e-0000-4000-8000-00000000cafe"
    results = kfp_pods.run_job(path, job_uuid=job_uuid, log_dir=str(tmp_path / "logs"))
    for name, r in results.items():
        print(f"KFP pod {name}: {r['seconds']:.1f}s")
    assert all(r["ran"] for r in results.values()), results.keys()
    assert set(results) == {"SageGate", "BlockExampleGen", "ImportSchemaGen", "DPTrainer",
                            "DPModelValidator", "Pusher"}

    grant_meta = results["SageGate"]["outputs"]["grant"]["metadata"]
    assert grant_meta["granted"] == 1.0
    assert json.loads(grant_meta["block_ids"]) == list(granted)
    assert (grant_meta["epsilon"], grant_meta["delta"], grant_meta["mode"]) == (
        EPSILON, DELTA, "basic")
    # The gate's ledger run id came from the KFP job placeholder, substituted per job; its
    # pipeline and node ids from the IR (a KFP pod's executor context names neither).
    assert grant_meta["run_id"] == derive_run_id("flights-kfp", "SageGate", job_uuid)

    blessing = results["DPModelValidator"]["outputs"]["blessing"]["metadata"]
    # The validator's released numbers carry fresh OpenDP noise in each run (seeded noise never
    # reaches a pipeline run), so compare what the plan determines, and the keys written.
    assert set(blessing) - {"membership_auc", "membership_advantage"} >= set(local.blessing)
    keys = {"epsilon", "delta", "eta", "target", "loss_bound", "metric_name", "outcome",
            "blessed"} & set(local.blessing)
    assert {"epsilon", "outcome", "blessed"} <= keys
    assert {k: blessing[k] for k in keys} == pytest.approx({k: local.blessing[k] for k in keys})
    assert blessing["grant_id"] == grant_meta["grant_id"] != local.grant_id
    assert blessing["outcome"] == "ACCEPT" and blessing["blessed"] == 1.0

    pushed = results["Pusher"]["outputs"]["pushed_model"]["metadata"]
    assert pushed["pushed"] == 1.0
    versions = os.listdir(kfp_config["serving_model_dir"])
    assert len(versions) == 1
    assert os.path.exists(os.path.join(kfp_config["serving_model_dir"], versions[0],
                                       "saved_model.pb"))

    # The ledger: two runs, two grants of the same cost on the same blocks, nothing else.
    by_block, grants, inconsistencies, audit = spent(ledger_url)
    assert sorted(g.grant_id for g in grants) == sorted([local.grant_id, grant_meta["grant_id"]])
    assert all(g.block_ids == granted and g.epsilon == EPSILON and g.delta == DELTA
               for g in grants)
    assert {b: v[2] for b, v in by_block.items()} == {
        b: (2 if b in granted else 0) for b in block_ids}
    assert inconsistencies == [] and audit.ok


def test_gate_refuses_a_run_id_template_no_orchestrator_resolved(flights_blocks, tmp_path):
    """A KFP backend that leaves {{$.pipeline_job_uuid}} as text must not get a constant run id
    (every run would replay one grant): the gate fails and charges nothing."""
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.gate import executor, spec
    from sage_tfx.errors import InvalidRequestError

    _, ledger_url, _ = flights_blocks
    before = spent(ledger_url)[0]
    grant = SageGrant()
    grant.uri = str(tmp_path / "grant")
    props = {spec.LEDGER_URL_KEY: ledger_url, spec.STREAM_KEY: STREAM,
             spec.CONTEXT_KEY: "default", spec.WINDOW_LAST_KEY: 1, spec.EPSILON_KEY: 0.1,
             spec.PIPELINE_RUN_ID_KEY: "{{$.pipeline_job_uuid}}"}
    with pytest.raises(InvalidRequestError, match="unresolved pipeline run id"):
        executor.Executor().Do({}, {spec.GRANT_KEY: [grant]}, props)
    assert spent(ledger_url)[0] == before


def test_two_gates_are_two_grants_under_local_dag_runner(tmp_path):
    """The reference: LocalDagRunner's executor context names each gate's node (built for
    "local" as `build` does: the baked-in ids change nothing there)."""
    import twogates
    from tfx import v1 as tfx
    from sage_tfx.pipelines import orchestration

    url = twogates.make_ledger(tmp_path)
    pipeline = twogates.create_pipeline(
        "two-gates-local", str(tmp_path / "root"), str(tmp_path / "mlmd.db"), url)
    tfx.orchestration.LocalDagRunner().run(orchestration.for_orchestrator(pipeline, "local"))
    twogates.check_two_grants(url, "two-gates-local")


def test_two_gates_are_two_grants_on_kfp_pods(tmp_path):
    """A KFP pod's executor context names no node: each gate's node id comes from the compiled
    IR (baked in by for_orchestrator), so the two pods make two requests, both charged."""
    import kfp_pods
    import twogates
    from sage_tfx.components.gate import spec as gate_spec
    from sage_tfx.pipelines import orchestration

    url = twogates.make_ledger(tmp_path)
    name = "two-gates-kfp"
    path = orchestration.compile_kubeflow(
        twogates.create_pipeline(name, str(tmp_path / "root"), str(tmp_path / "m.db"), url),
        str(tmp_path / "kfp"), image=IMAGE)
    tasks = kfp_pods.pipeline_spec(kfp_pods.load_job(path)).root.dag.tasks
    for gate_id in twogates.GATE_IDS:
        params = tasks[gate_id].inputs.parameters
        assert params[gate_spec.NODE_ID_KEY].runtime_value.constant.string_value == gate_id
        assert params[gate_spec.PIPELINE_ID_KEY].runtime_value.constant.string_value == name
    job_uuid = "2f0c9a5e-0000-4000-8000-0000000000ab"
    results = kfp_pods.run_job(path, job_uuid=job_uuid, log_dir=str(tmp_path / "logs"))
    assert set(results) == set(twogates.GATE_IDS) and all(r["ran"] for r in results.values())
    twogates.check_two_grants(url, name, job_uuid)
