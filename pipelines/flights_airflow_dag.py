"""Airflow DAG file of the flights DP pipeline (``flights-dp``): put it in Airflow's dags folder.

Airflow 2 (TFX 1.15's AirflowDagRunner needs Airflow < 3) runs each TFX component as one task;
the gate's ledger run id is ``<dag id>.<DAG run id>``, so every DAG run is one new request and a
retried task replays its grant without charging twice. Configuration comes from the
environment of the scheduler and workers (``orchestration.config_from_env``)::

    export SAGE_PIPELINE_CONFIG='{"pipeline_root": "/data/tfx", "metadata_path": "/data/mlmd.db",
        "stream": "flights", "window_last": 10, "epsilon": 1.0, "delta": 1e-6,
        "target": 500, "serving_model_dir": "/data/serving"}'
    export SAGE_LEDGER_URL=postgresql://sage@ledger-host:5432/sage   # shared by all workers
    export SAGE_LEDGER_TOKEN_FILE=/run/secrets/sage-etl-token          # the pipeline principal
    export SAGE_BEAM_ARGS="--runner=DirectRunner --direct_num_workers=2"
    airflow dags test flights-dp          # or trigger it from the UI / scheduler

A ``$SAGE_LEDGER_URL`` with a password never reaches the DAG, its serialized form or ML
Metadata: the pipeline refers to it as ``env:SAGE_LEDGER_URL`` and every task resolves it from
the worker's environment when it connects (``orchestration.config_from_env``).

Under Airflow every task runs (the DAG has no TFX ``Cond``): on a denial BlockExampleGen fails
with ``MissingGrantError`` before reading anything, and the tasks after it do not run.
"""
from sage_tfx.pipelines import orchestration

# The DAG id is the pipeline name: "flights-dp" unless the config's pipeline_name says otherwise.
DAG = orchestration.airflow_dag(
    orchestration.build("flights-dp", orchestration.config_from_env(), "airflow"))
