"""Secrets referenced, never embedded: compiled KFP specs, Airflow DAG files, ML Metadata and
logs hold ``env:SAGE_LEDGER_URL`` (or a URL without a password), never the password.

The fast tests compile (no pipeline runs); the slow one runs the gate-stats pipeline under
LocalDagRunner and as Kubeflow pods against PostgreSQL, as a pipeline principal's login role
whose password the server really checks (a scram-sha-256 line in pg_hba.conf for that role).
"""
import json
import logging
import os
import urllib.parse
import uuid

import pytest

from flightsdata import STREAM

pytestmark = pytest.mark.slow

PASSWORD = "s3cr3t-" + uuid.uuid4().hex
DSN = f"postgresql://etl:{PASSWORD}@db.internal:5432/ledger"
REF = "env:SAGE_LEDGER_URL"
IMAGE = "sage-tfx:test"
BEAM_ARGS = ["--direct_num_workers=1", "--direct_running_mode=in_memory"]


def _compile(tmp_path, target, *extra):
    from sage_tfx.pipelines import compile as compile_lib
    return compile_lib.main([
        "--target", target, "gate-stats", "--pipeline-root", str(tmp_path / "root"),
        "--metadata-path", str(tmp_path / "mlmd.db"), "--stream", STREAM, "--window-last", "2",
        "--epsilon", "0.5", "--output-dir", str(tmp_path / "out"), "--image", IMAGE, *extra])


def _files_hold(root, secret: str) -> list:
    """Every file under ``root`` whose bytes contain ``secret``."""
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(dirpath, name), "rb") as f:
                if secret.encode() in f.read():
                    hits.append(os.path.join(dirpath, name))
    return hits


def test_compile_refuses_a_password_and_maps_kubernetes_secrets(tmp_path, capsys, monkeypatch):
    import yaml
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2 as pb

    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    for target in ("kubeflow", "airflow"):
        assert _compile(tmp_path, target, "--ledger", DSN) == 2
        err = capsys.readouterr().err
        assert "carries a password" in err and "env:SAGE_LEDGER_URL" in err
        assert PASSWORD not in err and ("--ledger-secret" in err) == (target == "kubeflow")
    assert not (tmp_path / "out").exists()  # nothing written
    for bad, message in ((["--ledger-secret", "Bad_Name:url"], "NAME:KEY"),
                         (["--ledger-secret", "sage-ledger"], "NAME:KEY"),
                         (["--ledger-secret", "sage-ledger:url", "--ledger",
                           "postgresql://etl@db/ledger"], "leave out --ledger")):
        assert _compile(tmp_path, "kubeflow", *bad) == 2
        assert message in capsys.readouterr().err
    assert _compile(tmp_path, "airflow", "--ledger-secret", "sage-ledger:url") == 2
    assert "Kubeflow pods" in capsys.readouterr().err

    # Kubeflow: the pods get $SAGE_LEDGER_URL and $SAGE_LEDGER_TOKEN from Secrets.
    assert _compile(tmp_path, "kubeflow", "--ledger-secret", "sage-ledger:url",
                    "--token-secret", "sage-etl:token") == 0
    job_path, package_path = capsys.readouterr().out.split()
    with open(job_path) as f:
        job_text = f.read()
    assert REF in job_text and "postgresql://" not in job_text
    job = pb.PipelineJob()
    json_format.Parse(job_text, job)  # still a valid PipelineJob
    with open(package_path) as f:
        spec, platform = list(yaml.safe_load_all(f))
    assert spec == json.loads(job_text)["pipelineSpec"]
    json_format.ParseDict(spec, pb.PipelineSpec())  # the first document is the pipeline spec
    labels = set(spec["deploymentSpec"]["executors"])
    assert labels and platform == {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {
        label: {"secretAsEnv": [
            {"secretName": "sage-etl", "keyToEnv": [{"secretKey": "token",
                                                     "envVar": "SAGE_LEDGER_TOKEN"}]},
            {"secretName": "sage-ledger", "keyToEnv": [{"secretKey": "url",
                                                        "envVar": "SAGE_LEDGER_URL"}]}]}
        for label in labels}}}}}

    # A password-bearing $SAGE_LEDGER_URL becomes the reference, with a note.
    monkeypatch.setenv("SAGE_LEDGER_URL", DSN)
    assert _compile(tmp_path, "airflow") == 0
    captured = capsys.readouterr()
    dag = captured.out.strip()
    assert "holds a password" in captured.err and PASSWORD not in captured.err
    with open(dag) as f:
        text = f.read()
    assert REF in text and PASSWORD not in text and "postgresql://" not in text
    assert _files_hold(tmp_path / "out", PASSWORD) == []


def test_build_paths_refuse_a_password_and_keep_references(tmp_path, monkeypatch):
    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.pipelines import orchestration

    monkeypatch.setenv("SAGE_LEDGER_URL", DSN)
    config = orchestration.config_from_env()
    assert config["ledger_url"] == REF
    monkeypatch.setenv("SAGE_LEDGER_URL", "postgresql://etl@db.internal/ledger")
    assert orchestration.config_from_env()["ledger_url"] == "postgresql://etl@db.internal/ledger"
    monkeypatch.setenv("SAGE_PIPELINE_CONFIG", json.dumps({"ledger_url": DSN}))
    with pytest.raises(InvalidRequestError, match="SAGE_PIPELINE_CONFIG"):
        orchestration.config_from_env()
    with pytest.raises(InvalidRequestError, match="Airflow DAG file"):
        orchestration.airflow_dag_file("gate-stats", {"ledger_url": DSN})

    base = dict(pipeline_root=str(tmp_path), metadata_path=str(tmp_path / "m.db"),
                stream=STREAM, window_last=2, epsilon=0.5)
    with pytest.raises(InvalidRequestError, match="carries a password") as e:
        orchestration.build("gate-stats", dict(base, ledger_url=DSN))
    assert PASSWORD not in str(e.value)
    # Anything else in a pipeline holding a password is refused at compile time, by name.
    pipeline = orchestration.build("gate-stats", dict(
        base, ledger_url=REF, beam_pipeline_args=[f"--sink=postgresql://u:{PASSWORD}@h/db"]))
    with pytest.raises(InvalidRequestError, match="a Beam flag: .*carries a password"):
        orchestration.compile_kubeflow(pipeline, str(tmp_path / "kfp"), image=IMAGE)
    assert not (tmp_path / "kfp").exists()
    # The reference compiles and stays a reference.
    path = orchestration.compile_kubeflow(
        orchestration.build("gate-stats", dict(base, ledger_url=REF)), str(tmp_path / "kfp"),
        image=IMAGE)
    with open(path) as f:
        assert REF in f.read()


def test_system_pipelines_refuse_a_password_before_anything_is_read(tmp_path):
    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.pipelines import (dnd_pipeline, dp_bagging_pipeline, flights_dp_pipeline,
                                    ptk_pipeline, pyramid_pipeline)
    from sage_tfx.pyramid import CountSpec

    root, md = str(tmp_path / "root"), str(tmp_path / "m.db")
    builds = {
        "ptk": lambda: ptk_pipeline.create_pipeline(
            "p", root, md, DSN, "events", 2, "ptk-x", 0, "m:f"),
        "pyramid": lambda: pyramid_pipeline.create_pipeline(
            "p", root, md, DSN, "obs", CountSpec(groups=("u",), label="y", width=8, epsilon=1.0,
                                                 hash_family="tf_siphash"),
            store_dir=str(tmp_path), count_window=0, count_blocks=["a"], hot_blocks=["b"],
            hot_epsilon=0.5),
        "dp-bagging": lambda: dp_bagging_pipeline.create_pipeline(
            "p", root, md, ledger_url=DSN, stream="obs", window_last=2,
            public_csv_dir=str(tmp_path), public_size=200, epsilon=4.0, delta=1e-5, k=2, n=3,
            label_key="label", unit_key="user", feature_keys=["x0"]),
        "dnd": lambda: dnd_pipeline.create_pipeline(
            "p", root, md, ledger_url=DSN, stream="email", window_last=2,
            settings=dnd_pipeline.email_settings(), validate_epsilon=1.0, target=0.6,
            serving_model_dir=str(tmp_path)),
        "flights-dp": lambda: flights_dp_pipeline.create_pipeline(
            pipeline_name="p", pipeline_root=root, metadata_path=md, ledger_url=DSN,
            stream="flights", plan=flights_dp_pipeline.make_plan(1.0, 1e-6), window_last=2,
            target=500.0, serving_model_dir=str(tmp_path)),
    }
    for name, build in builds.items():
        with pytest.raises(InvalidRequestError, match="carries a password") as e:
            build()
        assert PASSWORD not in str(e.value), name


def _hba_requires_password(owner_url: str, role: str):
    """Makes the test server check ``role``'s password (scram-sha-256); returns an undo."""
    import psycopg
    conn = psycopg.connect(owner_url, autocommit=True)
    path = conn.execute("SHOW hba_file").fetchone()[0]
    with open(path) as f:
        original = f.read()
    with open(path, "w") as f:
        f.write(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + original)
    conn.execute("SELECT pg_reload_conf()")

    def undo():
        with open(path, "w") as f:
            f.write(original)
        conn.execute("SELECT pg_reload_conf()")
        conn.close()
    return undo


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.mark.postgres
def test_a_password_dsn_reaches_no_spec_metadata_or_log(postgres_url, tmp_path, capfd,
                                                         monkeypatch):
    import psycopg
    from absl import logging as absl_logging

    import kfp_pods
    from flightsdata import split_flights
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines import compile as compile_lib
    from sage_tfx.pipelines.gate_stats_pipeline import run_local

    split_flights(tmp_path / "data", postgres_url, days=3)
    role = f"etl_{uuid.uuid4().hex[:8]}"
    with open_ledger(postgres_url) as owner:
        root_token = owner.add_principal("root", ["admin"])
    with open_ledger(postgres_url, token=root_token) as root:
        root.add_principal("etl", ["pipeline"], pg_role=role, create_pg_role=True,
                           pg_password=PASSWORD)
        root.bind("etl", STREAM, "default")
    parts = urllib.parse.urlsplit(postgres_url)
    dsn = parts._replace(netloc=f"{role}:{PASSWORD}@{parts.hostname}:{parts.port}").geturl()
    undo = _hba_requires_password(postgres_url, role)
    try:
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn.replace(PASSWORD, "wrong"))
        monkeypatch.setenv("SAGE_LEDGER_URL", dsn)
        monkeypatch.delenv("SAGE_LEDGER_TOKEN", raising=False)

        # LocalDagRunner, every log line captured (INFO, as in the KFP pods, and DEBUG).
        handler = _Lines()
        logging.getLogger().addHandler(handler)
        absl_logging.set_verbosity(absl_logging.DEBUG)
        try:
            summary = run_local(pipeline_root=str(tmp_path / "local"), ledger_url=REF,
                                stream=STREAM, window_last=2, epsilon=0.5,
                                beam_pipeline_args=BEAM_ARGS)
        finally:
            logging.getLogger().removeHandler(handler)
            absl_logging.set_verbosity(absl_logging.INFO)
        out, err = capfd.readouterr()
        logs = "\n".join(handler.lines) + out + err
        assert summary["granted"] and len(summary["blocks"]) == 2
        assert f"SageGate: ledger {REF} granted run" in logs  # the capture works
        assert PASSWORD not in logs
        metadata = tmp_path / "local" / "metadata.db"
        assert metadata.exists() and _files_hold(tmp_path / "local", PASSWORD) == []
        from ml_metadata.metadata_store import metadata_store
        from tfx.orchestration import metadata as tfx_metadata
        store = metadata_store.MetadataStore(
            tfx_metadata.sqlite_metadata_connection_config(str(metadata)))
        [grant] = store.get_artifacts_by_type("sage_tfx.SageGrant")
        assert grant.custom_properties["ledger_url"].string_value == REF

        # Kubeflow: compiled with the Secret reference, run pod by pod; only the Secret (the
        # pods' environment) holds the DSN.
        assert compile_lib.main([
            "--target", "kubeflow", "gate-stats", "--pipeline-root", str(tmp_path / "kfp"),
            "--stream", STREAM, "--window-last", "1", "--epsilon", "0.25", "--output-dir",
            str(tmp_path / "spec"), "--image", IMAGE, "--ledger-secret", "sage-ledger:url",
            *[f"--beam-arg={a}" for a in BEAM_ARGS]]) == 0
        job = capfd.readouterr().out.split()[0]
        pod_env = {k: v for k, v in os.environ.items() if k != "SAGE_LEDGER_URL"}
        results = kfp_pods.run_job(job, log_dir=str(tmp_path / "pods"), base_env=pod_env,
                                   k8s_secrets={"sage-ledger": {"url": dsn}})
        assert all(r["ran"] for r in results.values()), results.keys()
        assert results["SageGate"]["outputs"]["grant"]["metadata"]["ledger_url"] == REF
        for where in ("spec", "pods", "kfp"):
            assert _files_hold(tmp_path / where, PASSWORD) == [], where
    finally:
        undo()
    with open_ledger(postgres_url, token=root_token) as root:
        grants = root.grants(STREAM)
        assert len(grants) == 2 and root.check_consistency(STREAM) == []
        charged = [e for e in root.audit_log(STREAM) if e.kind == "grant"]
        assert [e.payload["principal"] for e in charged] == ["etl", "etl"]
