"""``sage-tfx compile``: a pipeline of ``pipelines/`` as a Kubeflow Pipelines job or an Airflow DAG.

::

    sage-tfx compile --target kubeflow flights-dp --image registry/sage-tfx:0.1 \\
        --ledger-url postgresql://sage@ledger:5432/sage --stream flights --window-last 10 \\
        --epsilon 1 --delta 1e-6 --quality-target 500 --pipeline-root gs://bucket/tfx \\
        --serving-dir gs://bucket/serving --beam-arg=--runner=DataflowRunner \\
        --beam-arg=--project=my-project --output-dir out/
    # -> out/flights-dp.json (KFP v2 IR; submit with the KFP client or Vertex AI Pipelines)

    sage-tfx compile --target airflow gate-stats --ledger-url postgresql://... --stream flights \\
        --window-last 3 --epsilon 0.5 --pipeline-root /data/tfx --metadata-path /data/mlmd.db \\
        --output-dir $AIRFLOW_HOME/dags
    # -> $AIRFLOW_HOME/dags/gate_stats_dag.py

The ledger URL defaults to ``$SAGE_LEDGER_URL``; with several pods or workers it must be a
shared PostgreSQL ledger. ``--beam-arg`` (repeatable) passes one standard Beam pipeline option
to every Beam-backed component.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence

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
    p.add_argument("--ledger-url", default=os.environ.get("SAGE_LEDGER_URL"),
                   help="the shared block ledger (default $SAGE_LEDGER_URL)")
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


def config_from_args(args: argparse.Namespace) -> dict:
    """The :func:`orchestration.build` config of parsed arguments (unset options left out)."""
    config = {
        "pipeline_name": args.pipeline_name,
        "pipeline_root": args.pipeline_root,
        "metadata_path": args.metadata_path or os.path.join(args.pipeline_root, "metadata.db"),
        "ledger_url": args.ledger_url,
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
            path = orchestration.compile_kubeflow(
                orchestration.build(args.pipeline, config, orchestration.KUBEFLOW),
                args.output_dir, image=args.image)
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
