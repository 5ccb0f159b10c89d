"""``sage-tfx compile --pipeline module:function``: a user's own pipeline (a module file for its
trainer, a schema file of its own) compiles like the six of the catalog, with a ``gs://`` root on
a machine without GCS access: the module file is compiled as its import path, so no wheel is
built or uploaded; the files of this machine the pods will open are named on stderr."""
import json
import shutil
import sys
import textwrap

import pytest

from flightsdata import STREAM
from sage_tfx.pipelines import flights_plan

pytestmark = pytest.mark.slow  # imports TFX

PIPELINE = '''
import os

from tfx import v1 as tfx

from sage_tfx.components import BlockExampleGen, DPTrainer, SageGate
from sage_tfx.pipelines.flights_dp_pipeline import make_plan

HERE = os.path.dirname(os.path.abspath(__file__))


def create_pipeline(*, pipeline_name, pipeline_root, metadata_path, ledger_url, stream,
                    window_last, epsilon, delta, beam_pipeline_args=(), module_file=None):
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last,
                    plan=make_plan(epsilon, delta, transform_share=0.0))
    examples = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
    schema = tfx.components.ImportSchemaGen(schema_file=os.path.join(HERE, "schema.pbtxt"))
    trainer = DPTrainer(examples=examples.outputs["examples"], schema=schema.outputs["schema"],
                        grant=gate.outputs["grant"],
                        module_file=module_file or os.path.join(HERE, "fraud_trainer.py"))
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root,
        components=[gate, examples, schema, trainer],
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args))
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``userpipes.fraud:create_pipeline`` importable here (as in an image that installed it)."""
    pkg = tmp_path / "src" / "userpipes"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fraud.py").write_text(textwrap.dedent(PIPELINE))
    (pkg / "fraud_trainer.py").write_text("def model_fn(fn_args):\n    raise NotImplementedError\n")
    shutil.copy(flights_plan.SCHEMA_PATH, pkg / "schema.pbtxt")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for name in [n for n in sys.modules if n.split(".")[0] == "userpipes"]:
        monkeypatch.delitem(sys.modules, name)  # another test's copy of the package
    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    return pkg


def _compile(tmp_path, target, *extra):
    from sage_tfx.pipelines import compile as compile_lib
    return compile_lib.main([
        "--target", target, "--stream", STREAM, "--window-last", "3", "--epsilon", "1",
        "--delta", "1e-6", "--ledger", "postgresql://etl@db:5432/ledger",
        "--output-dir", str(tmp_path / "out"), *extra])


def test_a_user_pipeline_compiles_for_kubeflow_with_a_gs_root(user_package, tmp_path, capsys):
    code = _compile(tmp_path, "kubeflow", "--pipeline", "userpipes.fraud:create_pipeline",
                    "--pipeline-root", "gs://no-such-bucket-here/tfx", "--image", "me/fraud:1")
    out, err = capsys.readouterr()
    assert code == 0, err
    job_path, package_path = out.split()
    assert job_path.endswith("/fraud.json") and package_path.endswith("/fraud.yaml")
    text = open(job_path).read()
    job = json.loads(text)
    assert job["pipelineSpec"]["pipelineInfo"]["name"] == "fraud"  # the module's name
    assert "_wheels" not in text and "fraud_trainer.py" not in text  # nothing was packaged
    trainer = job["pipelineSpec"]["root"]["dag"]["tasks"]["DPTrainer"]["inputs"]["parameters"]
    assert trainer["module_path"]["runtimeValue"]["constant"] == "userpipes.fraud_trainer"
    assert "gs://no-such-bucket-here/tfx" in text
    # The schema is a file of this machine the pods open: named, with the fix.
    assert "ImportSchemaGen.schema_file: " + str(user_package / "schema.pbtxt") in err
    assert "compile inside the image" in err


def test_a_user_pipeline_compiles_to_an_airflow_dag_file(user_package, tmp_path, capsys):
    code = _compile(tmp_path, "airflow", "--pipeline", "userpipes.fraud:create_pipeline",
                    "--pipeline-name", "fraud-daily", "--pipeline-root", str(tmp_path / "root"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip().endswith("/fraud_daily_dag.py")
    dag = open(out.strip()).read()
    assert "orchestration.build('userpipes.fraud:create_pipeline', CONFIG, \"airflow\")" in dag
    assert '"pipeline_name": "fraud-daily"' in dag


@pytest.mark.parametrize("args, message", [
    (["gate-stats", "--pipeline", "userpipes.fraud:create_pipeline"], "name one pipeline"),
    ([], "name one pipeline"),
    (["--pipeline", "userpipes.nosuch:create_pipeline"], "cannot import it here"),
    (["--pipeline", "userpipes.fraud:nosuch"], "cannot import it here"),
    (["--pipeline", "userpipes.fraud:create_pipeline", "--set", "module_file=/elsewhere/t.py"],
     "does not exist"),
])
def test_a_bad_reference_is_refused_and_writes_nothing(user_package, tmp_path, capsys, args,
                                                       message):
    code = _compile(tmp_path, "kubeflow", "--pipeline-root", "gs://b/tfx", *args)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_module_file_the_pods_could_not_import_is_refused(user_package, tmp_path, capsys):
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "trainer.py").write_text("def model_fn(fn_args):\n    pass\n")
    code = _compile(tmp_path, "kubeflow", "--pipeline", "userpipes.fraud:create_pipeline",
                    "--pipeline-root", "gs://b/tfx", "--set", f"module_file={loose}/trainer.py")
    err = capsys.readouterr().err
    assert code == 2 and "is not importable here" in err and "install it in" in err, err
    assert not (tmp_path / "out").exists()


def test_a_missing_option_is_named_by_its_flag(tmp_path, capsys, monkeypatch):
    from sage_tfx.pipelines import compile as compile_lib

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    code = compile_lib.main(["--target", "airflow", "gate-stats", "--stream", STREAM,
                             "--pipeline-root", str(tmp_path / "root"), "--window-last", "3",
                             "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "pipeline gate-stats needs --ledger (or $SAGE_LEDGER_URL), --epsilon" in err, err
    assert not (tmp_path / "out").exists()
