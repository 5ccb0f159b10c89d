"""Pulls the model of a live Draw-and-Discard server (``sage-tfx dnd serve``) into a SavedModel.

``GET /v1/spec`` gives the model (family, number of features) and the run's public parameters;
``POST /v1/release`` (binary float64) closes the run and returns its released model: the mean of
the k instances, recorded against the run's grant before it is returned, so a re-executed export
gets the same bytes (``release=False`` exports the live ``GET /v1/average`` instead and leaves the
run open). Either is a DP output, post-processing of the clients' noisy updates: exporting it
costs no budget. The server authenticates the caller: a ``pipeline`` principal's bearer token
(``token``, else ``$SAGE_LEDGER_TOKEN`` / ``$SAGE_LEDGER_TOKEN_FILE``: the server checks tokens
against the ledger's principals). The SavedModel is the one DnDTrainer writes
(:func:`sage_tfx.components.dnd_trainer.export.export_glm`).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Optional, Sequence

from sage_tfx.components.dnd_trainer.protocol import SERVED_FAMILIES, FeatureSpec
from sage_tfx.errors import InvalidRequestError

SERVER_FILE = "dnd_server.json"   # the server's /v1/spec at export time


def export_from_server(server_url: str, path: str, features: Sequence[FeatureSpec], *,
                       token: Optional[str] = None, release: bool = True,
                       timeout: float = 30.0) -> dict:
    """Writes the server's released model (or, with ``release=False``, its live average) to
    ``path``; returns the server's spec with ``final`` (a recorded release) and
    ``model_sha256`` (of the float64 weights).

    ``features`` are the model's features in the server's order with the public bounds its
    clients normalise with (the server publishes only their number).

    Raises:
      InvalidRequestError: a family without one prediction per example, or features that do
        not match the server's model.
      httpx.HTTPError: the server cannot be reached or answers with an error.
    """
    import httpx

    from sage_tfx.components.dnd_trainer.export import export_glm
    from sage_tfx.dnd.server import BINARY, decode
    from sage_tfx.ledger import access

    features = list(features)
    token = token or access.token_from_env()
    if not token:
        raise InvalidRequestError("the D&D server authenticates its callers: give a pipeline "
                                  "principal's token (or $SAGE_LEDGER_TOKEN)")
    with httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout,
                      headers={"authorization": f"Bearer {token}"}) as c:
        r = c.get("/v1/spec")
        r.raise_for_status()
        served = r.json()
        model = served["model"]
        if model["family"] not in SERVED_FAMILIES:
            raise InvalidRequestError(f"the server trains a {model['family']} model; only "
                                      f"{SERVED_FAMILIES} export to a one-output SavedModel")
        if int(model["n_features"]) != len(features):
            raise InvalidRequestError(f"the server's model has {model['n_features']} features, "
                                      f"{len(features)} given")
        if release:
            r = c.post("/v1/release", headers={"accept": BINARY})
        else:
            r = c.get("/v1/average", headers={"accept": BINARY})
        r.raise_for_status()
        weights = decode(r.content, int(served["dim"]))
        served["final"] = r.headers.get("x-dnd-final") == "true"
        served["model_sha256"] = hashlib.sha256(r.content).hexdigest()
    export_glm(model["family"], weights, features, path)
    from tfx.dsl.io import fileio
    with fileio.open(os.path.join(path, SERVER_FILE), "w") as f:
        f.write(json.dumps({"server_url": server_url, "spec": served}, indent=2, sort_keys=True))
    return served
