"""Pulls the average of a live Draw-and-Discard server (``sage-tfx dnd serve``) into a SavedModel.

``GET /v1/spec`` gives the model (family, number of features) and the run's public parameters;
``GET /v1/average`` (binary float64) the mean of the k instances — a DP output, post-processing
of the clients' noisy updates, so exporting it costs no budget. The SavedModel is the one
DnDTrainer writes (:func:`sage_tfx.components.dnd_trainer.export.export_glm`).
"""
from __future__ import annotations

import json
import os
from typing import Sequence

from sage_tfx.components.dnd_trainer.protocol import SERVED_FAMILIES, FeatureSpec
from sage_tfx.errors import InvalidRequestError

SERVER_FILE = "dnd_server.json"   # the server's /v1/spec at export time


def export_from_server(server_url: str, path: str, features: Sequence[FeatureSpec], *,
                       timeout: float = 30.0) -> dict:
    """Writes the server's current average to ``path``; returns the server's spec.

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

    features = list(features)
    with httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout) as c:
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
        r = c.get("/v1/average", headers={"accept": BINARY})
        r.raise_for_status()
        weights = decode(r.content, int(served["dim"]))
    export_glm(model["family"], weights, features, path)
    from tfx.dsl.io import fileio
    with fileio.open(os.path.join(path, SERVER_FILE), "w") as f:
        f.write(json.dumps({"server_url": server_url, "spec": served}, indent=2, sort_keys=True))
    return served
