"""``sage-tfx compile``: a pipeline of ``pipelines/`` as a Kubeflow Pipelines job or an Airflow DAG.

::

    sage-tfx compile --target kubeflow flights-dp --image registry/sage-tfx:0.1 \\
        --ledger-secret sage-ledger:url --token-secret sage-etl:token \\
        --stream flights --window-last 10 \\
        --epsilon 1 --delta 1e-6 --quality-target 500 --pipeline-root gs://bucket/tfx \\
        --serving-dir gs://bucket/serving --beam-arg=--runner=DataflowRunner \\
        --beam-arg=--project=my-project --output-dir out/
    # -> out/flights-dp.json (KFP v2 IR as a PipelineJob: Vertex AI Pipelines) and
    #    out/flights-dp.yaml (the KFP package: pipeline spec + kfp-kubernetes platform spec
    #    mapping the Secrets to $SAGE_LEDGER_URL / $SAGE_LEDGER_TOKEN in every pod)

    sage-tfx compile --target airflow gate-stats --ledger postgresql://... --stream flights \\
        --window-last 3 --epsilon 0.5 --pipeline-root /data/tfx --metadata-path /data/mlmd.db \\
        --output-dir $AIRFLOW_HOME/dags
    # -> $AIRFLOW_HOME/dags/gate_stats_dag.py

The ledger URL defaults to ``$SAGE_LEDGER_URL``; with several pods or workers it must be a
shared PostgreSQL ledger. It is never embedded with a password: ``--ledger`` with one is
refused; a password-bearing ``$SAGE_LEDGER_URL`` becomes the reference ``env:SAGE_LEDGER_URL``,
which Airflow workers resolve from their environment and Kubeflow pods from the Secret given by
``--ledger-secret``. ``--beam-arg`` (repeatable) passes one standard Beam pipeline option to
every Beam-backed component.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import flags, secrets
from sage_tfx.pipelines import orchestration


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sage-tfx compile", description=(
        "Compile a sage-tfx pipeline for Kubeflow Pipelines (v2 IR JSON) or Airflow (a DAG file)."))
    p.add_argument("--target", choices=(orchestration.KUBEFLOW, orchestration.AIRFLOW),
                   required=True, help="the orchestrator")
    p.add_argument("pipeline", choices=sorted(orchestration.PIPELINES))
    p.add_argument("--output-dir", default=".", help="where the JSON / DAG file is written")
    p.add_argument("--image", default="sage-tfx:latest",
                   help="kubeflow: the container image of every pod (see Dockerfile)")
    p.add_argument("--pipeline-name", help="default: the pipeline's name ([a-z0-9-], KFP rule)")
    p.add_argument("--pipeline-root", required=True)
    p.add_argument("--metadata-path", help="ML Metadata SQLite file (Airflow; unused by KFP, "
                                           "which keeps its own)")
    flags.add_ledger_argument(
        p, default=None, dest="ledger_url", deprecated=("--ledger-url",),
        help="the shared block ledger, without a password (default $SAGE_LEDGER_URL, "
                        "as the reference env:SAGE_LEDGER_URL if it holds a password)")
    p.add_argument("--ledger-secret", metavar="NAME:KEY",
                   help="kubeflow: a Kubernetes Secret key holding the ledger URL, set as "
                        "$SAGE_LEDGER_URL in every pod; the pipeline refers to it as "
                        "env:SAGE_LEDGER_URL")
    p.add_argument("--token-secret", metavar="NAME:KEY",
                   help="kubeflow: a Kubernetes Secret key holding the pipeline principal's "
                        "token, set as $SAGE_LEDGER_TOKEN in every pod")
    p.add_argument("--stream", required=True)
    p.add_argument("--window-last", type=int)
    p.add_argument("--blocks", help="comma-separated block ids instead of --window-last")
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, default=None)
    p.add_argument("--quality-target", type=float, help="flights-dp: ACCEPT target (min²)")
    p.add_argument("--serving-dir", help="flights-dp: where Pusher pushes ACCEPTed models")
    p.add_argument("--no-transform", action="store_true", help="flights-dp: skip DP Transform")
    p.add_argument("--beam-arg", action="append", default=[], metavar="FLAG",
                   help="one Beam pipeline option, e.g. --beam-arg=--runner=PortableRunner "
                        "(repeatable)")
    return p


def ledger_url_of(args: argparse.Namespace, environ=os.environ) -> Optional[str]:
    """The ledger URL the compiled pipeline holds: never one with a password.

    Raises:
      InvalidRequestError: ``--ledger`` holds a password, or conflicts with
        ``--ledger-secret``; a Secret for Airflow.
    """
    kfp = args.target == orchestration.KUBEFLOW
    if (args.ledger_secret or args.token_secret) and not kfp:
        raise InvalidRequestError(
            "--ledger-secret / --token-secret map Kubernetes Secrets into Kubeflow pods; Airflow "
            "workers read $SAGE_LEDGER_URL and $SAGE_LEDGER_TOKEN(_FILE) from their environment")
    if args.ledger_secret:
        if args.ledger_url not in (None, orchestration.LEDGER_URL_REF):
            raise InvalidRequestError(
                f"--ledger-secret sets $SAGE_LEDGER_URL in every pod, and the pipeline refers to "
                f"it as {orchestration.LEDGER_URL_REF}: leave out --ledger")
        return orchestration.LEDGER_URL_REF
    if args.ledger_url:
        try:
            return secrets.check_no_password(args.ledger_url, orchestration.SPECS)
        except InvalidRequestError as exc:
            hint = (" (Kubeflow: --ledger-secret NAME:KEY sets it in every pod from a Kubernetes "
                    "Secret)") if kfp else ""
            raise InvalidRequestError(f"{exc}{hint}") from None
    url = orchestration.ledger_url_from_env(environ)
    if url == orchestration.LEDGER_URL_REF:
        print(f"sage-tfx compile: $SAGE_LEDGER_URL holds a password: the pipeline refers to it "
              f"as {url}, resolved by every " + ("pod (give --ledger-secret NAME:KEY)" if kfp
                                                 else "Airflow worker from its environment"),
              file=sys.stderr)
    return url


def config_from_args(args: argparse.Namespace, environ=os.environ) -> dict:
    """The :func:`orchestration.build` config of parsed arguments (unset options left out)."""
    config = {
        "pipeline_name": args.pipeline_name,
        "pipeline_root": args.pipeline_root,
        "metadata_path": args.metadata_path or os.path.join(args.pipeline_root, "metadata.db"),
        "ledger_url": ledger_url_of(args, environ),
        "stream": args.stream,
        "window_last": args.window_last,
        "blocks": args.blocks.split(",") if args.blocks else None,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "beam_pipeline_args": orchestration.parse_beam_args(args.beam_arg),
    }
    if args.pipeline == "flights-dp":
        config.update(target=args.quality_target, serving_model_dir=args.serving_dir,
                      use_transform=not args.no_transform)
    return {k: v for k, v in config.items() if v is not None}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        if args.target == orchestration.KUBEFLOW:
            k8s = orchestration.token_env_secret(args.token_secret)
            if args.ledger_secret:
                k8s[orchestration.LEDGER_URL_ENV] = orchestration.parse_secret_ref(
                    args.ledger_secret)
            path = orchestration.compile_kubeflow(
                orchestration.build(args.pipeline, config, orchestration.KUBEFLOW),
                args.output_dir, image=args.image, k8s_secrets=k8s)
            if k8s:
                path += "\n" + os.path.splitext(path)[0] + ".yaml"
        else:
            orchestration.build(args.pipeline, config, orchestration.AIRFLOW)  # fails early
            os.makedirs(args.output_dir, exist_ok=True)
            name = config.get("pipeline_name") or args.pipeline
            path = os.path.join(args.output_dir, f"{name.replace('-', '_')}_dag.py")
            with open(path, "w") as f:
                f.write(orchestration.airflow_dag_file(args.pipeline, config))
    except ValueError as exc:
        print(f"sage-tfx compile: error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
