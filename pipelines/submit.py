"""``sage-tfx submit``: start a run of a compiled pipeline on a Kubeflow Pipelines endpoint.

::

    sage-tfx compile --target kubeflow gate-stats ... --output-dir out/   # out/gate-stats.yaml
    sage-tfx submit out/gate-stats.yaml --host https://kfp.example.com/pipeline \\
        --param epsilon=0.25 --param window_last=5 --kfp-token env:KFP_TOKEN \\
        --ledger-secret sage-ledger:url --token-secret sage-etl:token
    # -> the run id; the run's gate requests its grant with ε = 0.25 over the last 5 blocks

The package (the ``<name>.yaml`` ``sage-tfx compile`` writes: pipeline spec, platform spec) is
sent as the run's pipeline spec through KFP's v2beta1 REST API (``kfp-server-api``, the API
client of the KFP SDK; the SDK itself pins a kfp-pipeline-spec that TFX 1.15 cannot use).
``--param NAME=VALUE`` sets a runtime parameter of the compiled pipeline (``sage-tfx compile
--help`` lists them per pipeline), checked against the package's types and, for ε, δ and the
window, as the ledger checks them; parameters left out keep their compiled defaults.

Secrets stay references: the KFP API token is ``--kfp-token env:NAME`` or ``file:/path``
(default ``$KFP_TOKEN`` when set), never a literal on the command line; ``--ledger-secret`` /
``--token-secret NAME:KEY`` map Kubernetes Secrets to ``$SAGE_LEDGER_URL`` /
``$SAGE_LEDGER_TOKEN`` in every pod. Nothing secret is printed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any, Dict, Optional, Sequence

from sage_tfx.errors import InvalidRequestError, SageError
from sage_tfx.pipelines import kfp_package

KFP_TOKEN_ENV = "KFP_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sage-tfx submit", description=(
        "Start a Kubeflow Pipelines run of a package compiled by sage-tfx compile."))
    p.add_argument("package", help="the KFP package <name>.yaml written by sage-tfx compile")
    p.add_argument("--host", required=True,
                   help="the KFP API endpoint, e.g. https://kfp.example.com/pipeline")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a runtime parameter of the pipeline (repeatable), e.g. epsilon=0.25")
    p.add_argument("--run-name", help="the run's display name (default <pipeline>-<UTC time>)")
    p.add_argument("--experiment-id", help="default: KFP's default experiment")
    p.add_argument("--pipeline-root", help="override the compiled pipeline root")
    p.add_argument("--service-account", help="the Kubernetes service account of the pods")
    p.add_argument("--kfp-token", metavar="REF",
                   help="bearer token of the KFP API as a reference, env:NAME or file:/path "
                        f"(default env:{KFP_TOKEN_ENV} when ${KFP_TOKEN_ENV} is set)")
    p.add_argument("--ledger-secret", metavar="NAME:KEY",
                   help="a Kubernetes Secret key set as $SAGE_LEDGER_URL in every pod")
    p.add_argument("--token-secret", metavar="NAME:KEY",
                   help="a Kubernetes Secret key set as $SAGE_LEDGER_TOKEN in every pod")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per API request")
    return p


def parse_params(values: Sequence[str]) -> Dict[str, str]:
    """``--param NAME=VALUE`` values as ``{name: text}`` (typed later, against the package)."""
    out: Dict[str, str] = {}
    for text in values:
        name, sep, value = text.partition("=")
        if not sep or not name.isidentifier():
            raise InvalidRequestError(f"--param takes NAME=VALUE, got {text!r}")
        if name in out:
            raise InvalidRequestError(f"--param {name} given twice")
        out[name] = value
    return out


def kfp_token(ref: Optional[str], environ=os.environ) -> Optional[str]:
    """The KFP API token from a reference (``env:NAME`` / ``file:/path``), or None.

    Raises:
      InvalidRequestError: a literal token (it would sit in the shell history and ``ps``).
    """
    from sage_tfx.ledger import secrets

    if ref is None:
        return environ.get(KFP_TOKEN_ENV) or None
    if not ref.startswith((secrets.ENV_PREFIX, secrets.FILE_PREFIX)):
        raise InvalidRequestError(
            "--kfp-token takes a reference, env:NAME or file:/path, never the token itself")
    return secrets.resolve(ref)


def run_body(args: argparse.Namespace) -> Dict[str, Any]:
    """The run to create (KFP v2beta1 ``Run`` fields), from the parsed arguments.

    Raises:
      InvalidRequestError (ValueError): a bad package, parameter or Secret reference.
    """
    spec, platform = kfp_package.read_package(args.package)
    params = kfp_package.check_parameters(spec, parse_params(args.param))
    k8s = {}
    if args.ledger_secret:
        k8s["SAGE_LEDGER_URL"] = kfp_package.parse_secret_ref(args.ledger_secret)
    if args.token_secret:
        k8s["SAGE_LEDGER_TOKEN"] = kfp_package.parse_secret_ref(args.token_secret)
    platform = kfp_package.with_secrets(spec, platform, k8s)
    name = spec["pipelineInfo"]["name"]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    runtime_config = {"parameters": params}
    if args.pipeline_root:
        runtime_config["pipeline_root"] = args.pipeline_root
    return {"display_name": args.run_name or f"{name}-{stamp}",
            "experiment_id": args.experiment_id,
            "service_account": args.service_account,
            "pipeline_spec": kfp_package.run_pipeline_spec(spec, platform),
            "runtime_config": runtime_config}


def create_run(host: str, body: Dict[str, Any], *, token: Optional[str] = None,
               timeout: float = 60.0):
    """Creates the run through the KFP v2beta1 API; returns the created ``V2beta1Run``."""
    import kfp_server_api

    config = kfp_server_api.Configuration(host=host.rstrip("/"))
    if token:
        config.api_key["authorization"] = token
        config.api_key_prefix["authorization"] = "Bearer"
    runtime = kfp_server_api.V2beta1RuntimeConfig(**body["runtime_config"])
    run = kfp_server_api.V2beta1Run(**{k: v for k, v in body.items() if k != "runtime_config"},
                                    runtime_config=runtime)
    with kfp_server_api.ApiClient(config) as client:
        return kfp_server_api.RunServiceApi(client).run_service_create_run(
            run, _request_timeout=timeout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        body = run_body(args)
        token = kfp_token(args.kfp_token)
    except (ValueError, SageError) as exc:
        print(f"sage-tfx submit: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sage-tfx submit: error: cannot read {exc.filename}: {exc.strerror}",
              file=sys.stderr)
        return 2
    import kfp_server_api
    import urllib3

    try:
        run = create_run(args.host, body, token=token, timeout=args.timeout)
    except kfp_server_api.ApiException as exc:
        detail = (exc.body or b"")[:500] if isinstance(exc.body, bytes) else str(exc.body)[:500]
        print(f"sage-tfx submit: error: the KFP API at {args.host} answered {exc.status} "
              f"{exc.reason}: {detail}", file=sys.stderr)
        return 1
    except urllib3.exceptions.HTTPError as exc:
        print(f"sage-tfx submit: error: cannot reach the KFP API at {args.host}: "
              f"{type(exc).__name__}", file=sys.stderr)
        return 1
    print(f"run {run.run_id} ({body['display_name']}): {args.host.rstrip('/')}"
          f"/#/runs/details/{run.run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
