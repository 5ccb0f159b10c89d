"""`sage-tfx compile` for all six pipelines, ε and the window as KFP runtime parameters, and a
run submitted with other values: the gate charges the submitted values, and what runs reads
exactly the blocks the ledger charged.

The submitted run is taken from what the KFP API stand-in (fake_kfp) received and executed
task by task as KFP's pods would (kfp_pods), with the run's parameter values.
"""
import json
import os

import pytest
import yaml

from flightsdata import STREAM, spent

pytestmark = pytest.mark.slow

IMAGE = "registry.example.com/sage-tfx:test"
BEAM = ["--beam-arg=--direct_num_workers=1", "--beam-arg=--direct_running_mode=in_memory"]


def _args(name, tmp, ledger_url):
    """The README's compile arguments of each pipeline (paths under tmp; a gs:// pipeline root
    that this machine cannot reach: compiling only records it)."""
    common = ["--ledger-url", ledger_url, "--stream", STREAM, "--pipeline-root", "gs://b/tfx",
              "--image", IMAGE, "--output-dir", str(tmp / "out"), *BEAM]
    own = {
        "flights-dp": ["--window-last", "3", "--epsilon", "1", "--delta", "1e-6",
                       "--quality-target", "2500", "--serving-dir", str(tmp / "serving")],
        "gate-stats": ["--window-last", "3", "--epsilon", "0.5", "--delta", "1e-6"],
        "ptk": ["--window-last", "2", "--epsilon", "0.5", "--delta", "0", "--set",
                "ptk_id=ptk-1", "--set", "window_index=0", "--set", "featurize_fn=histstats"],
        "pyramid": ["--serving-dir", str(tmp / "pserving"), "--set",
                    'spec={"groups": ["user"], "label": "y", "width": 64, "epsilon": 1.0, '
                    '"hash_family": "tf_siphash"}', "--set", f"store_dir={tmp / 'store'}",
                    "--set", "count_window=0", "--set", 'count_blocks=["w0a", "w0b"]',
                    "--set", 'hot_blocks=["hot"]', "--set", "hot_epsilon=0.5"],
        "dp-bagging": ["--window-last", "2", "--epsilon", "4", "--delta", "1e-5", "--set",
                       f"public_csv_dir={tmp}", "--set", "public_size=200", "--set", "k=2",
                       "--set", "n=3", "--set", "label_key=label", "--set", "unit_key=user",
                       "--set", 'feature_keys=["x0", "x1"]'],
        "dnd": ["--window-last", "2", "--epsilon", "4", "--quality-target", "0.6",
                "--serving-dir", str(tmp / "dserving"), "--set", "validate_epsilon=1.0"],
    }[name]
    return ["--target", "kubeflow", name, *common, *own]


def test_compile_knows_all_six_pipelines_with_runtime_parameters(tmp_path, capsys,
                                                                 monkeypatch):
    from kfp_pods import load_job, pipeline_spec
    from sage_tfx.pipelines import catalog, compile as compile_cli

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    assert set(catalog.PIPELINES) == {"flights-dp", "gate-stats", "ptk", "pyramid",
                                      "dp-bagging", "dnd"}
    for name in catalog.PIPELINES:
        rc = compile_cli.main(_args(name, tmp_path, "postgresql://sage@ledger:5432/sage"))
        captured = capsys.readouterr()
        assert rc == 0, (name, captured.err)
        job_path, package_path = captured.out.split()
        spec = pipeline_spec(load_job(job_path))  # a valid PipelineJob
        with open(package_path) as f:
            [package] = list(yaml.safe_load_all(f))  # no Secrets: the pipeline spec alone
        assert package == json.load(open(job_path))["pipelineSpec"]
        declared = package["root"].get("inputDefinitions", {}).get("parameters", {})
        assert set(declared) == set(catalog.RUNTIME_PARAMETERS[name]), name
        gates = [t for n, t in spec.root.dag.tasks.items() if n.startswith("SageGate")]
        assert gates, name
        for key, definition in declared.items():
            assert definition["isOptional"] is True
            # The default is the compiled value, and every gate takes the pipeline parameter.
            flag = "--" + key.replace("_", "-")
            args = _args(name, tmp_path, "")
            assert definition["defaultValue"] == pytest.approx(float(args[args.index(flag) + 1]))
            for gate in gates:
                assert gate.inputs.parameters[key].component_input_parameter == key, (name, key)
        # Nothing was created at the pipeline root or the metadata default but the output dir.
        assert not os.path.exists(os.path.join(tmp_path, "gs:"))
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        f"{n}.{ext}" for n in catalog.PIPELINES for ext in ("json", "yaml"))


def test_compile_errors_are_clear_and_write_nothing(tmp_path, capsys, monkeypatch):
    from sage_tfx.pipelines import compile as compile_cli

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    url = "postgresql://sage@ledger:5432/sage"
    cases = [
        (_args("gate-stats", tmp_path, url) + ["--set", "epsilon=1"], "given by a flag"),
        (_args("gate-stats", tmp_path, url)[:-6] + ["--window-last", "3", "--epsilon", "-1"],
         "epsilon"),
        (_args("ptk", tmp_path, url)[:-6], "needs --set ptk_id=VALUE, --set window_index=VALUE"),
        (_args("dnd", tmp_path, url) + ["--set", "no_such_option=1"], "no_such_option"),
        (_args("dnd", tmp_path, url) + ["--delta", "1e-6"], "gaussian unit"),
        (["--target", "airflow", *_args("gate-stats", tmp_path, url)[2:]], "--metadata-path"),
    ]
    for argv, message in cases:
        assert compile_cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    assert not os.path.exists(tmp_path / "out")


def test_compile_dnd_with_the_gaussian_unit(tmp_path, capsys, monkeypatch):
    """--delta and --set unit=gaussian / l2_norm_clip reach DnDTrainer, and the gate's plan
    charges the train part (ε, δ) per update."""
    from kfp_pods import load_job, pipeline_spec
    from sage_tfx.pipelines import compile as compile_cli

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    argv = _args("dnd", tmp_path, "postgresql://sage@ledger:5432/sage") + [
        "--delta", "1e-6", "--set", "unit=gaussian", "--set", "l2_norm_clip=2.0"]
    assert compile_cli.main(argv) == 0
    job_path, _ = capsys.readouterr().out.split()
    spec = pipeline_spec(load_job(job_path))
    [trainer] = [t for n, t in spec.root.dag.tasks.items() if n.startswith("DnDTrainer")]
    [gate] = [t for n, t in spec.root.dag.tasks.items() if n.startswith("SageGate")]

    def const(task, key):
        return task.inputs.parameters[key].runtime_value.constant

    assert const(trainer, "unit").string_value == "gaussian"
    assert const(trainer, "delta").number_value == 1e-6
    assert const(trainer, "l2_norm_clip").number_value == 2.0
    plan = json.loads(const(gate, "plan_json").string_value)
    assert plan["parts"][0] == {"name": "train", "epsilon": 4.0, "delta": 1e-6, "event": None,
                                "params": []}


def test_compiled_airflow_dag_takes_only_deployment_from_the_environment(tmp_path, capsys,
                                                                        monkeypatch):
    from sage_tfx.pipelines import compile as compile_cli, orchestration

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    argv = ["--target", "airflow", *_args("gate-stats", tmp_path, "postgresql://s@h/l")[2:],
            "--metadata-path", str(tmp_path / "mlmd.db")]
    argv[argv.index("gs://b/tfx")] = str(tmp_path / "root")
    assert compile_cli.main(argv) == 0, capsys.readouterr().err
    dag_file = capsys.readouterr().out.strip()
    text = open(dag_file).read()
    assert "deployment_from_env()" in text and "config_from_env" not in text
    env = {"SAGE_PIPELINE_CONFIG": json.dumps({"stream": "other", "epsilon": 9.0}),
           "SAGE_LEDGER_URL": "postgresql://etl@db/l", "SAGE_BEAM_ARGS": "--a=1 --b=2"}
    assert orchestration.deployment_from_env(env) == {
        "ledger_url": "postgresql://etl@db/l", "beam_pipeline_args": ["--a=1", "--b=2"]}


def test_a_run_submitted_with_other_values_charges_and_reads_those(flights_blocks, tmp_path,
                                                                   capsys, monkeypatch):
    import kfp_pods
    from fake_kfp import FakeKfp
    from sage_tfx.pipelines import compile as compile_cli, submit

    _, ledger_url, block_ids = flights_blocks
    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    argv = _args("gate-stats", tmp_path, ledger_url)
    argv[argv.index("gs://b/tfx")] = str(tmp_path / "root")
    assert compile_cli.main(argv) == 0
    _, package = capsys.readouterr().out.split()
    with FakeKfp() as kfp:
        assert submit.main([package, "--host", kfp.url, "--param", "epsilon=0.25",
                            "--param", "window_last=2"]) == 0
    body = kfp.requests[0]["body"]
    job = kfp_pods.write_job(str(tmp_path / "submitted.json"), body["pipeline_spec"],
                             dict(body["runtime_config"], pipeline_root=str(tmp_path / "root")))
    before = spent(ledger_url)[0]
    results = kfp_pods.run_job(job, job_uuid="5b0e2c1a-0000-4000-8000-0000000000cd",
                               log_dir=str(tmp_path / "logs"))
    assert all(r["ran"] for r in results.values()), results.keys()
    grant = results["SageGate"]["outputs"]["grant"]["metadata"]
    assert grant["granted"] == 1.0
    assert (grant["epsilon"], grant["delta"]) == (0.25, 1e-6)  # δ: the compiled default
    assert json.loads(grant["block_ids"]) == block_ids[-2:]
    examples = results["BlockExampleGen"]["outputs"]["examples"]["metadata"]
    assert json.loads(examples["block_ids"]) == block_ids[-2:]
    # The ledger charged the submitted ε to exactly the two blocks read, once.
    by_block, grants, inconsistencies, audit = spent(ledger_url)
    [new] = [g for g in grants if g.grant_id == grant["grant_id"]]
    assert (new.epsilon, new.delta, new.block_ids) == (0.25, 1e-6, tuple(block_ids[-2:]))
    for b in block_ids:
        charged = 0.25 if b in block_ids[-2:] else 0.0
        assert by_block[b][0] == pytest.approx(before[b][0] + charged), b
    assert inconsistencies == [] and audit.ok


def test_ptk_compiled_without_a_ledger_trains_at_the_submitted_epsilon(tmp_path, capsys,
                                                                      monkeypatch):
    """PTK: ε set at submit time is what the gate charges and what PTKTrainer trains at (the
    lineage the PTK store records for the version)."""
    import kfp_pods
    from fake_kfp import FakeKfp
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines import compile as compile_cli, submit
    from sage_tfx.ptk import PTKStore, StoreConfig

    # The PTK tests' data and block writer (tests/ptk/).
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(__file__)), "ptk"))
    from ptk_data import HS, HS_CONFIG
    from test_ptk_pipeline_e2e import STREAM as PTK_STREAM, write_blocks

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    url = f"sqlite:///{tmp_path}/ledger.db"
    write_blocks(str(tmp_path / "blocks"), url)
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 200)])
    store.close()
    argv = _args("ptk", tmp_path, url)
    argv[argv.index("gs://b/tfx")] = str(tmp_path / "root")
    argv[argv.index(STREAM)] = PTK_STREAM
    argv[argv.index("ptk_id=ptk-1")] = f"ptk_id={pid}"
    assert compile_cli.main(argv) == 0, capsys.readouterr().err
    _, package = capsys.readouterr().out.split()
    with FakeKfp() as kfp:
        assert submit.main([package, "--host", kfp.url, "--param", "epsilon=0.3"]) == 0
    body = kfp.requests[0]["body"]
    job = kfp_pods.write_job(str(tmp_path / "submitted.json"), body["pipeline_spec"],
                             dict(body["runtime_config"], pipeline_root=str(tmp_path / "root")))
    results = kfp_pods.run_job(job, job_uuid="7c1d0e2f-0000-4000-8000-0000000000ef",
                               log_dir=str(tmp_path / "logs"))
    assert all(r["ran"] for r in results.values()), results.keys()
    with open_ledger(url) as ledger:
        (grant,) = ledger.grants(PTK_STREAM)
        spent = {b.block_id: b.epsilon_spent for b in ledger.blocks(PTK_STREAM)}
    assert (grant.epsilon, grant.delta) == (0.3, 0.0)
    assert spent == {"2024-01-01": 0.0, "2024-01-02": 0.3, "2024-01-03": 0.3}
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    try:
        lineage = store.lineage(pid)
    finally:
        store.close()
    assert lineage.grant_id == grant.grant_id and lineage.epsilon == 0.3
    assert lineage.blocks == ("2024-01-02", "2024-01-03")
