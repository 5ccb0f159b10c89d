# The sage-tfx pipeline image: the pinned TFX 1.15 stack (requirements/lock.txt) plus sage-tfx.
#
# One image serves every place a pipeline step runs off the laptop:
#   - Kubeflow Pipelines v2 pods: KubeflowV2DagRunner's container command is
#     `python -m tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor`; the pod finds
#     sage-tfx's executors and its SageGrant artifact type by import path in this image.
#   - Airflow workers (apache-airflow 2.9.3 is in the lock), with the DAG file
#     pipelines/flights_airflow_dag.py (or one written by `sage-tfx compile --target airflow`).
#   - Beam SDK workers of a portable runner (Flink, Spark: --environment_type=DOCKER
#     --environment_config=<this image>; Dataflow: --sdk_container_image=<this image>).
#
# Build and compile inside the image, so that file paths baked into the compiled pipeline
# (the flights schema, module files under /sage-tfx) are the paths the pods see:
#   docker build -t registry.example.com/sage-tfx:0.1 .
#   docker run --rm -v "$PWD/out:/out" -e SAGE_LEDGER_URL=postgresql://sage@ledger:5432/sage \
#     registry.example.com/sage-tfx:0.1 sage-tfx compile --target kubeflow flights-dp \
#     --image registry.example.com/sage-tfx:0.1 --stream flights --window-last 10 --epsilon 1 \
#     --delta 1e-6 --quality-target 500 --pipeline-root gs://bucket/tfx \
#     --serving-dir gs://bucket/serving --output-dir /out
#
# The ledger: every pod, worker and the gate must see ONE ledger, so use a PostgreSQL URL
# (`postgresql://user@host:port/db`). `sage-tfx compile` takes it from --ledger-url or
# $SAGE_LEDGER_URL (as below) and bakes it into the gate's and readers' exec properties; an
# embedded SQLite ledger only works when all steps share one filesystem.
FROM python:3.10-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /sage-tfx

# The pinned stack first (a layer that changes only with the lock).
COPY requirements/lock.txt requirements/lock.txt
RUN python -m pip install uv==0.13.9 \
 && uv pip install --system -r requirements/lock.txt

# sage-tfx itself, installed in place so that compiled paths under /sage-tfx stay valid.
COPY setup.py README.md ./
COPY sage_tfx sage_tfx
COPY components components
COPY pipelines pipelines
RUN uv pip install --system --no-deps -e . \
 && python -c "import sage_tfx, sage_tfx.components.gate.executor, tfx, tensorflow_privacy"

# The shared ledger, set at deploy time (Kubernetes env, Airflow worker env, ...).
ENV SAGE_LEDGER_URL=""

CMD ["sage-tfx", "--help"]
