# The sage-tfx pipeline image: the pinned TFX 1.15 stack (requirements/lock.txt) plus sage-tfx.
#
# One image serves every place a pipeline step runs off the laptop:
#   - Kubeflow Pipelines v2 pods: KubeflowV2DagRunner's container command is
#     `python -m tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor` (it replaces
#     the entrypoint); the pod finds sage-tfx's executors and its SageGrant artifact type by
#     import path in this image.
#   - Airflow workers (apache-airflow 2.9.3 is in the lock), with a DAG file written by
#     `sage-tfx compile --target airflow` (or pipelines/flights_airflow_dag.py); run them with
#     `--entrypoint airflow`.
#   - Beam SDK workers of a portable runner (Flink, Spark: --environment_type=DOCKER
#     --environment_config=<this image>; Dataflow: --sdk_container_image=<this image>): the
#     entrypoint is Beam's SDK harness boot program, copied from the Beam SDK image of the
#     locked apache-beam version, which starts the worker with this image's Python.
#
# Build, then compile and submit inside the image, so that file paths baked into the compiled
# pipeline (the flights schema, module files under /sage-tfx) are the paths the pods see:
#   docker build -t registry.example.com/sage-tfx:0.1 .
#   docker run --rm --entrypoint sage-tfx -v "$PWD/out:/out" registry.example.com/sage-tfx:0.1 \
#     compile --target kubeflow gate-stats --image registry.example.com/sage-tfx:0.1 \
#     --ledger-secret sage-ledger:url --token-secret sage-etl:token --stream flights \
#     --window-last 3 --epsilon 0.5 --pipeline-root gs://bucket/tfx --output-dir /out
#
# The ledger: every pod, worker and the gate must see ONE ledger, a PostgreSQL URL given as a
# Kubernetes Secret (--ledger-secret) or $SAGE_LEDGER_URL; an embedded SQLite ledger only works
# when all steps share one filesystem. The image holds no ledger URL, token or key.
#
# Base images are pinned by digest: a tag can be re-pointed (official images are rebuilt under
# the same tag), a digest cannot, and BuildKit checks every pulled layer against it. The digests
# are build arguments with no default, so a build without them fails at the FROM line instead of
# taking whatever the tag points to today. Resolve them once per base-image change, from a
# machine that reaches the registry, and keep the output in docker/base-images.env (reviewed like
# the lock):
#   scripts/pin-base-images.sh > docker/base-images.env     # docker buildx imagetools inspect
#   docker build $(sed 's/^/--build-arg /' docker/base-images.env) -t IMAGE .
#
# Beam's boot program runs the SDK harness in the image's own environment
# (RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1): otherwise it creates a virtualenv under
# /opt/apache/beam-venv, which uid 1000 cannot write, and the worker never starts. The pipeline
# virtualenv /opt/venv belongs to uid 1000, so the boot program can pip-install what a DOCKER-
# environment job stages (requirements, extra packages, the workflow tarball, TFX module wheels)
# into it.
#
# tests/orchestration/test_dockerfile.py checks what can be checked without a Docker daemon:
# digest-pinned base images, the Beam stage matching the locked apache-beam, a compiler where
# the lock has sdist-only packages (pyfarmhash), the lock installed, the entrypoint, a non-root
# user, and the boot program's environment steps run as uid 1000 in the image's layout
# (tests/orchestration/test_image_layout.py).

ARG BEAM_DIGEST
ARG PYTHON_DIGEST

# Beam's SDK harness boot program (the version of apache-beam in requirements/lock.txt).
FROM apache/beam_python3.10_sdk:2.56.0@${BEAM_DIGEST} AS beam

# Build stage: a C/C++ toolchain for the lock's packages that ship no wheel (pyfarmhash 0.3.2,
# a C++ extension), installed into a virtualenv that the runtime stage copies.
FROM python:3.10.13-slim-bookworm@${PYTHON_DIGEST} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential=12.9 \
 && rm -rf /var/lib/apt/lists/*
RUN python -m pip install uv==0.13.9 \
 && python -m venv /opt/venv
COPY requirements/lock.txt /tmp/lock.txt
RUN uv pip install --python /opt/venv/bin/python -r /tmp/lock.txt

# Runtime stage: no compiler, the built virtualenv (uid 1000's), Beam's boot, sage-tfx, a
# non-root user.
FROM python:3.10.13-slim-bookworm@${PYTHON_DIGEST}
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv TF_CPP_MIN_LOG_LEVEL=2 \
    RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1
COPY --from=build --chown=1000:1000 /opt/venv /opt/venv
COPY --from=beam /opt/apache/beam /opt/apache/beam
WORKDIR /sage-tfx

# sage-tfx itself, installed in place so that compiled paths under /sage-tfx stay valid.
COPY setup.py README.md ./
COPY sage_tfx sage_tfx
COPY components components
COPY pipelines pipelines
RUN python -m pip install --no-deps --no-build-isolation -e . \
 && python -c "import sage_tfx, sage_tfx.components.gate.executor, tfx, tensorflow_privacy, farmhash, kfp_server_api" \
 && test -x /opt/apache/beam/boot \
 && useradd --uid 1000 --user-group --create-home --shell /usr/sbin/nologin sage

# Pods and workers run as this user (Kubernetes runAsNonRoot: a numeric UID).
USER 1000:1000
ENV HOME=/home/sage

ENTRYPOINT ["/opt/apache/beam/boot"]
