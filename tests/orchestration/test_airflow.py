"""Airflow 2: the DAG files run for real with ``airflow dags test`` (SQLite metadata DB in a
temporary AIRFLOW_HOME), and two DAG runs in parallel share one PostgreSQL ledger.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from flightsdata import DELTA, EPSILON, STREAM, TARGET, WINDOW, split_flights, spent

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DAG_FILE = os.path.join(REPO, "pipelines", "flights_airflow_dag.py")
BEAM_ARGS = "--direct_num_workers=1 --direct_running_mode=in_memory"
LOGICAL_DATE = "2024-01-02"


def _airflow(args, home, env=None, **kwargs):
    """Runs the ``airflow`` command of this virtualenv with AIRFLOW_HOME=home."""
    full_env = dict(os.environ, AIRFLOW_HOME=str(home),
                    AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
                    AIRFLOW__CORE__LOAD_EXAMPLES="False",
                    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
                    AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="600", **(env or {}))
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    return subprocess.Popen([airflow, *args], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def _check(proc, what):
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{what} failed:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    """An AIRFLOW_HOME with a migrated SQLite metadata DB (copied per test: migration is slow)."""
    home = tmp_path_factory.mktemp("airflow")
    (home / "dags").mkdir()
    _check(_airflow(["db", "migrate"], home), "airflow db migrate")
    return home


def _home(airflow_home, tmp_path, name, dag_source):
    home = tmp_path / name
    (home / "dags").mkdir(parents=True)
    shutil.copy(airflow_home / "airflow.db", home / "airflow.db")
    shutil.copy(dag_source, home / "dags" / os.path.basename(dag_source))
    return home


def test_flights_dag_charges_blesses_and_pushes(flights_blocks, airflow_home, tmp_path):
    from sage_tfx.components.gate.executor import derive_run_id
    from sage_tfx.pipelines.lineage import open_store, privacy_lineage

    _, ledger_url, block_ids = flights_blocks
    granted = block_ids[-WINDOW:]
    before, grants_before, _, _ = spent(ledger_url)
    config = dict(pipeline_root=str(tmp_path / "tfx"), metadata_path=str(tmp_path / "mlmd.db"),
                  stream=STREAM, window_last=WINDOW, epsilon=EPSILON, delta=DELTA,
                  target=TARGET, use_transform=False,
                  serving_model_dir=str(tmp_path / "serving"),
                  trainer_config={"seed": 1})
    home = _home(airflow_home, tmp_path, "home", DAG_FILE)
    env = {"SAGE_PIPELINE_CONFIG": json.dumps(config), "SAGE_LEDGER_URL": ledger_url,
           "SAGE_BEAM_ARGS": BEAM_ARGS}
    out = _check(_airflow(["dags", "test", "flights-dp", LOGICAL_DATE], home, env), "dags test")
    assert "DagRun Finished" in out and "state=success" in out, out[-3000:]

    # The ledger: one new grant, the plan's cost charged once to the granted blocks.
    after, grants, inconsistencies, audit = spent(ledger_url)
    [grant] = [g for g in grants if g.grant_id not in {x.grant_id for x in grants_before}]
    assert list(grant.block_ids) == granted
    assert (grant.epsilon, grant.delta) == (EPSILON, DELTA)
    assert grant.run_id == derive_run_id(
        "flights-dp", "SageGate", f"flights-dp.manual__{LOGICAL_DATE}T00:00:00+00:00")
    assert {b: after[b][2] - before[b][2] for b in block_ids} == {
        b: int(b in granted) for b in block_ids}
    assert inconsistencies == [] and audit.ok

    # ML Metadata: the blessing, the pushed model, and the lineage back to the grant.
    store = open_store(config["metadata_path"])
    [blessing] = store.get_artifacts_by_type("ModelBlessing")
    assert blessing.custom_properties["blessed"].int_value == 1
    assert blessing.custom_properties["grant_id"].string_value == grant.grant_id
    [pushed] = store.get_artifacts_by_type("PushedModel")
    assert pushed.custom_properties["pushed"].int_value == 1
    [version] = os.listdir(config["serving_model_dir"])
    assert os.path.exists(os.path.join(config["serving_model_dir"], version, "saved_model.pb"))
    [lineage] = privacy_lineage(store, pushed.id)
    assert (lineage.grant_id, list(lineage.blocks), lineage.epsilon, lineage.delta) == (
        grant.grant_id, granted, EPSILON, DELTA)


@pytest.mark.postgres
def test_parallel_dag_runs_share_one_postgres_ledger(postgres_url, airflow_home, tmp_path):
    """Two DAG runs at once on one PostgreSQL ledger: 4 blocks, each run asks for the 2 most
    recent blocks with budget left at the full ε_g. Whichever commits first gets the 2 newest;
    the other can only get the 2 older ones. Nothing is over-spent, and each run's Examples hold
    exactly its own grant's blocks."""
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines import compile as compile_lib
    from sage_tfx.pipelines.lineage import open_store

    root = tmp_path / "data"  # ε_g = 1: one run of ε = 1 exhausts a block
    split = split_flights(root, postgres_url, epsilon_g=1.0)
    block_ids = [b.block_id for b in split.blocks]
    with open_ledger(postgres_url) as ledger:
        records = {b.block_id: b.records for b in ledger.blocks(STREAM)}
    procs = {}
    for name in ("a", "b"):
        # The DAG files are what `sage-tfx compile --target airflow` writes.
        config = dict(pipeline_name=f"gate-stats-{name}", pipeline_root=str(tmp_path / name),
                      metadata_path=str(tmp_path / name / "mlmd.db"))
        assert compile_lib.main([
            "--target", "airflow", "gate-stats", "--pipeline-name", config["pipeline_name"],
            "--pipeline-root", config["pipeline_root"], "--metadata-path",
            config["metadata_path"], "--ledger", postgres_url, "--stream", STREAM,
            "--window-last", "2", "--epsilon", "1", "--output-dir", str(tmp_path / "dags"),
            *[f"--beam-arg={f}" for f in BEAM_ARGS.split()]]) == 0
        dag_source = tmp_path / "dags" / f"gate_stats_{name}_dag.py"
        env = {}  # everything is in the DAG file
        home = _home(airflow_home, tmp_path, f"home-{name}", dag_source)
        procs[name] = (_airflow(["dags", "test", f"gate-stats-{name}", LOGICAL_DATE], home, env),
                       config)
    for name, (proc, _) in procs.items():
        out = _check(proc, f"dags test {name}")
        assert "state=success" in out, out[-3000:]

    by_block, grants, inconsistencies, audit = spent(postgres_url)
    assert len(grants) == 2 and inconsistencies == [] and audit.ok
    assert sorted(g.block_ids for g in grants) == [tuple(block_ids[:2]), tuple(block_ids[2:])]
    assert all(v == (1.0, 0.0, 1) for v in by_block.values()), by_block  # ε_g, never more
    for name, (_, config) in procs.items():
        store = open_store(config["metadata_path"])
        [grant] = store.get_artifacts_by_type("sage_tfx.SageGrant")
        [examples] = store.get_artifacts_by_type("Examples")
        grant_blocks = json.loads(grant.custom_properties["block_ids"].string_value)
        assert json.loads(examples.custom_properties["block_ids"].string_value) == grant_blocks
        assert examples.custom_properties["grant_id"].string_value == (
            grant.custom_properties["grant_id"].string_value)
        # The data itself: StatisticsGen counted exactly the granted blocks' records.
        [stats] = store.get_artifacts_by_type("ExampleStatistics")
        assert _num_examples(stats.uri) == sum(records[b] for b in grant_blocks)


def _num_examples(stats_uri):
    from tensorflow_metadata.proto.v0 import statistics_pb2
    total = 0
    for split in ("train", "eval"):
        s = statistics_pb2.DatasetFeatureStatisticsList()
        with open(os.path.join(stats_uri, f"Split-{split}", "FeatureStats.pb"), "rb") as f:
            s.ParseFromString(f.read())
        total += s.datasets[0].num_examples
    return total


def test_two_gates_are_two_grants_on_airflow(airflow_home, tmp_path):
    """An Airflow task's executor context names no node: each gate's node id comes from the
    DAG's exec properties (baked in by airflow_dag), so the two tasks make two requests."""
    import twogates

    url = twogates.make_ledger(tmp_path)
    name = "two-gates-airflow"
    dag_file = tmp_path / "two_gates_dag.py"
    dag_file.write_text(twogates.AIRFLOW_DAG)
    home = _home(airflow_home, tmp_path, "home", dag_file)
    shutil.copy(twogates.__file__, home / "dags" / "twogates.py")  # the DAG file imports it
    env = twogates.airflow_env(name, tmp_path / "root", tmp_path / "mlmd.db", url)
    out = _check(_airflow(["dags", "test", name, LOGICAL_DATE], home, env), "dags test")
    assert "state=success" in out, out[-3000:]
    twogates.check_two_grants(url, name, f"{name}.manual__{LOGICAL_DATE}T00:00:00+00:00")
