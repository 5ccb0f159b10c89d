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

All six pipelines of ``pipelines/catalog.py`` compile (``--help`` lists what each needs; options
without a flag are ``--set KEY=VALUE``). On Kubeflow, the window and, where the gate charges it
directly, ε are runtime parameters of the compiled pipeline, set per run by ``sage-tfx submit``.
Compiling reads no data and needs no ledger; paths are only recorded.

A user's own pipeline compiles with ``--pipeline module:function`` instead of a name: the
function gets the same keyword arguments (``pipeline_name``, ``pipeline_root``,
``metadata_path``, ``ledger_url``, ``stream``, ``beam_pipeline_args``, the flags given and every
``--set``) and returns the ``tfx.dsl.Pipeline``. Compile it inside the pipeline image (with the
module installed there), so that its import path, module files and schema paths are the ones
the pods see; a component's ``module_file`` is compiled as its import path, so no wheel is
built or uploaded to the pipeline root.

The ledger URL defaults to ``$SAGE_LEDGER_URL``; with several pods or workers it must be a
shared PostgreSQL ledger. It is never embedded with a password: ``--ledger`` with one is
refused; a password-bearing ``$SAGE_LEDGER_URL`` becomes the reference ``env:SAGE_LEDGER_URL``,
which Airflow workers resolve from their environment and Kubeflow pods from the Secret given by
``--ledger-secret``. ``--beam-arg`` (repeatable) passes one standard Beam pipeline option to
every Beam-backed component.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Optional, Sequence

# Before TensorFlow is imported (lazily, after the arguments are parsed): no C++ log lines.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from sage_tfx.errors import InvalidRequestError, SageError  # noqa: E402
from sage_tfx.ledger import flags  # noqa: E402
from sage_tfx.pipelines import catalog  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sage-tfx compile", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compile a sage-tfx pipeline for Kubeflow Pipelines (v2 IR JSON and the "
                    "KFP package YAML, for sage-tfx submit) or Airflow (a DAG file).",
        epilog="pipelines (options not covered by a flag: --set KEY=VALUE):\n"
               + catalog.help_text(option_of)
               + "\n  --pipeline module:function: your own pipeline (function(**config) -> "
                 "tfx.dsl.Pipeline;\n    compile it inside the image: README, \"Run on "
                 "Kubeflow / Airflow\")")
    p.add_argument("--target", choices=(catalog.KUBEFLOW, catalog.AIRFLOW),
                   required=True, help="the orchestrator")
    p.add_argument("pipeline", nargs="?", choices=sorted(catalog.PIPELINES),
                   help="a pipeline of the catalog (below), or --pipeline")
    p.add_argument("--pipeline", dest="reference", metavar="MODULE:FUNCTION",
                   help="your own pipeline: the function of an importable module that builds "
                        "it from the config (default name: the module's last part)")
    p.add_argument("--output-dir", default=".", help="where the JSON / DAG file is written")
    p.add_argument("--image", default="sage-tfx:latest",
                   help="kubeflow: the container image of every pod (see Dockerfile)")
    p.add_argument("--pipeline-name", help="default: the pipeline's name ([a-z0-9-], KFP rule)")
    p.add_argument("--pipeline-root", required=True)
    p.add_argument("--metadata-path",
                   help="ML Metadata SQLite file. Airflow: a path on the workers (default "
                        "PIPELINE_ROOT/metadata.db when that is a local path). Kubeflow keeps "
                        "its own; nothing is created there")
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
    p.add_argument("--window-last", type=int,
                   help="the window (kubeflow: a runtime parameter, this its default)")
    p.add_argument("--blocks", help="comma-separated block ids instead of --window-last")
    p.add_argument("--epsilon", type=float,
                   help="the run's ε (kubeflow: a runtime parameter where the gate charges it "
                        "directly, see below)")
    p.add_argument("--delta", type=float, default=None)
    p.add_argument("--quality-target", type=float,
                   help="flights-dp, dnd: the validator's ACCEPT target")
    p.add_argument("--serving-dir", help="flights-dp, dnd, pyramid: where Pusher pushes models")
    p.add_argument("--no-transform", action="store_true", help="flights-dp: skip DP Transform")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="one more create_pipeline option (VALUE as JSON, else a string), "
                        "e.g. --set ptk_id=ptk-1 --set 'count_blocks=[\"d1\",\"d2\"]' "
                        "(repeatable)")
    p.add_argument("--beam-arg", action="append", default=[], metavar="FLAG",
                   help="one Beam pipeline option, e.g. --beam-arg=--runner=PortableRunner "
                        "(repeatable)")
    return p


# Config keys (catalog.PIPELINES) set by a flag of this command; the others are --set KEY=VALUE.
OPTIONS = {"ledger_url": "--ledger (or $SAGE_LEDGER_URL)", "pipeline_root": "--pipeline-root",
           "metadata_path": "--metadata-path", "stream": "--stream",
           "window_last": "--window-last", "epsilon": "--epsilon", "delta": "--delta",
           "target": "--quality-target", "serving_model_dir": "--serving-dir",
           "serving_dir": "--serving-dir"}


def option_of(key: str) -> str:
    """How this command sets config key ``key``: its flag, or ``--set key=VALUE``."""
    return OPTIONS.get(key, f"--set {key}=VALUE")


def pipeline_of(args: argparse.Namespace) -> str:
    """The catalog name or ``module:function`` reference the arguments name (exactly one).

    Raises:
      InvalidRequestError: both or neither.
    """
    if bool(args.pipeline) == bool(args.reference):
        raise InvalidRequestError("name one pipeline: a catalog name (PIPELINE) or your own "
                                  "with --pipeline module:function")
    return args.pipeline or args.reference


def parse_settings(values: Sequence[str]) -> dict:
    """``--set KEY=VALUE`` values as a dict (VALUE parsed as JSON when it is JSON).

    Raises:
      InvalidRequestError: not KEY=VALUE, or a key twice.
    """
    out: dict = {}
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not key.isidentifier():
            raise InvalidRequestError(f"--set takes KEY=VALUE with KEY a create_pipeline "
                                      f"option name, got {text!r}")
        if key in out:
            raise InvalidRequestError(f"--set {key} given twice")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def metadata_path_of(args: argparse.Namespace) -> str:
    """``--metadata-path``, else a local default: Kubeflow keeps its own ML Metadata (the path
    is never opened), Airflow needs one its workers share.

    Raises:
      InvalidRequestError: Airflow without --metadata-path and a remote pipeline root.
    """
    if args.metadata_path:
        return args.metadata_path
    name = args.pipeline_name or catalog.default_name(pipeline_of(args))
    if args.target == catalog.KUBEFLOW:
        return os.path.join(os.path.abspath(args.output_dir), f"{name}.mlmd.db")
    if "://" in args.pipeline_root:
        raise InvalidRequestError(
            f"Airflow keeps ML Metadata in a SQLite file its workers share; the pipeline root "
            f"{args.pipeline_root} is not a local path: give --metadata-path")
    return os.path.join(args.pipeline_root, "metadata.db")


def ledger_url_of(args: argparse.Namespace, environ=os.environ) -> Optional[str]:
    """The ledger URL the compiled pipeline holds: never one with a password.

    Raises:
      InvalidRequestError: ``--ledger`` holds a password, or conflicts with
        ``--ledger-secret``; a Secret for Airflow.
    """
    from sage_tfx.ledger import secrets
    from sage_tfx.pipelines import orchestration

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
    from sage_tfx.pipelines import orchestration

    name = pipeline_of(args)
    config = {
        "pipeline_name": args.pipeline_name,
        "pipeline_root": args.pipeline_root,
        "metadata_path": metadata_path_of(args),
        "ledger_url": ledger_url_of(args, environ),
        "stream": args.stream,
        "window_last": args.window_last,
        "blocks": args.blocks.split(",") if args.blocks else None,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "beam_pipeline_args": orchestration.parse_beam_args(args.beam_arg),
    }
    if name in ("flights-dp", "dnd") or catalog.is_reference(name):
        config.update(target=args.quality_target, serving_model_dir=args.serving_dir)
    if name == "flights-dp":
        config.update(use_transform=not args.no_transform)
    if name == "pyramid":
        config.update(serving_dir=args.serving_dir)
    settings = parse_settings(args.settings)
    clash = sorted(k for k in settings if config.get(k) is not None)
    if clash:
        raise InvalidRequestError(f"--set {', '.join(clash)}: given by a flag already")
    config.update(settings)
    config = {k: v for k, v in config.items() if v is not None}
    missing = catalog.missing_keys(name, config)
    if missing:
        raise InvalidRequestError(f"pipeline {name} needs {', '.join(map(option_of, missing))}")
    return config


def _note_files(pipeline) -> None:
    """Names on stderr the files of this machine the compiled pipeline will open in its pods."""
    from sage_tfx.pipelines import orchestration

    found = orchestration.local_files(pipeline)
    if found:
        print("sage-tfx compile: note: the pipeline opens these files of this machine; its pods "
              "must find them at the same paths (compile inside the image: README):\n"
              + "\n".join(f"  {node}.{key}: {path}" for node, key, path in found),
              file=sys.stderr)


def _is_tf_error(exc: BaseException) -> bool:
    """A TensorFlow I/O error (e.g. a gs:// path without credentials or network)."""
    return any(c.__module__.startswith("tensorflow.") and c.__name__ == "OpError"
               for c in type(exc).__mro__)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
    fresh = not os.path.exists(args.output_dir)
    code = _compile(args)
    if code and fresh and os.path.isdir(args.output_dir) and not os.listdir(args.output_dir):
        os.rmdir(args.output_dir)  # made by TFX's ML Metadata config for the default path
    return code


def _compile(args: argparse.Namespace) -> int:
    """Compiles what the parsed arguments name; returns the exit code."""
    try:
        from sage_tfx.pipelines import orchestration

        name = pipeline_of(args)
        config = config_from_args(args)
        pipeline = orchestration.build(name, config, args.target)  # fails before any write
        _note_files(pipeline)
        if args.target == orchestration.KUBEFLOW:
            k8s = orchestration.token_env_secret(args.token_secret)
            if args.ledger_secret:
                k8s[orchestration.LEDGER_URL_ENV] = orchestration.parse_secret_ref(
                    args.ledger_secret)
            path = orchestration.compile_kubeflow(pipeline, args.output_dir, image=args.image,
                                                  k8s_secrets=k8s)
            path += "\n" + os.path.splitext(path)[0] + ".yaml"
        else:
            os.makedirs(args.output_dir, exist_ok=True)
            dag = pipeline.pipeline_info.pipeline_name.replace("-", "_")
            path = os.path.join(args.output_dir, f"{dag}_dag.py")
            with open(path, "w") as f:
                f.write(orchestration.airflow_dag_file(name, config))
    except (ValueError, SageError) as exc:  # bad arguments: nothing was written
        print(f"sage-tfx compile: error: {exc}", file=sys.stderr)
        return 2
    except TypeError as exc:  # an option the pipeline does not take (--set)
        print(f"sage-tfx compile: error: {args.pipeline or args.reference}: {exc}",
              file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sage-tfx compile: error: cannot write or read a file: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 -- only TensorFlow's file system errors
        if not _is_tf_error(exc):
            raise
        print(f"sage-tfx compile: error: {type(exc).__name__}: {exc.message} (the pipeline "
              f"root or an output path is not reachable from here; compile paths are only "
              f"recorded, so give paths this machine can reach or --metadata-path)",
              file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
