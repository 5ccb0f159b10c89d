"""DnDTrainer executor: Draw-and-Discard over the granted window, the average as a SavedModel.

Privacy. The run spends exactly what the gate charged for it: the plan's ``train`` part if the
gate stored a plan (the rest pays e.g. DPModelValidator), else the whole grant, and that charge
must *equal* :func:`~sage_tfx.components.dnd_trainer.protocol.dnd_train_part` of the exec
properties (``passes × (ε_update, δ_update)`` basic, the composed Laplace or Gaussian event rdp:
the same charge as a served run's); anything else is refused before a record is read. Every unit
(``client_key``) sends exactly ``passes`` updates, admitted by a
:class:`~sage_tfx.dnd.budget.RunBudget` of that charge; noise is the unit's float-safe sampler
(:func:`sage_tfx.dnd.client.add_noise`), server coins a CSPRNG,
the spam check (post-processing) is on by default. Only the average model and an aggregate report
leave: no instance, draw, slot or per-client value is written or logged.

Release once. The model directory (SavedModel, ``dnd_model.json``, ``privacy_report.json``) is
recorded against the grant as ``train/model`` (``grant/model`` without a plan), after the plan
part is claimed for DnDTrainer (``releases.claim_part``: a DPTrainer on the same part fails;
:func:`sage_tfx.ledger.releases.release_tree_once`) before it is published: a re-executed
trainer (a retried pod or task, a re-run with the same run id) receives the replayed grant, finds
the record and writes the recorded model byte for byte without reading a record or running the
protocol again.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Dict, List

import numpy as np
from absl import logging
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import path_utils

from sage_tfx.components import artifacts
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dnd_trainer import export, protocol, spec
from sage_tfx.dnd.budget import RunBudget
from sage_tfx.errors import InvalidRequestError, MissingGrantError

__all__ = ["Executor", "settings_from_exec_properties"]


def settings_from_exec_properties(props: Dict[str, Any]) -> tuple:
    features = protocol.features_from_json(props.get(spec.FEATURES_KEY))
    settings = protocol.RunSettings(
        family=props.get(spec.FAMILY_KEY), n_features=len(features), k=props.get(spec.K_KEY),
        gamma=props.get(spec.GAMMA_KEY), l1_norm_clip=props.get(spec.CLIP_KEY),
        epsilon=props.get(spec.EPSILON_KEY), unit=props.get(spec.UNIT_KEY),
        passes=props.get(spec.PASSES_KEY), n_c=props.get(spec.N_C_KEY),
        delta=props.get(spec.DELTA_KEY), l2_norm_clip=props.get(spec.L2_CLIP_KEY))
    for name in (spec.CLIENT_KEY, spec.LABEL_KEY):
        if not isinstance(props.get(name), str) or not props.get(name):
            raise InvalidRequestError(f"{name} must be a non-empty string")
    return settings, features



def _train_charge(grant_artifact, grant):
    """(ε, δ, event, what, part name) charged for this trainer: the plan's train part, else
    the grant (part ``releases.WHOLE_GRANT``)."""
    from sage_tfx.adaptive import plan as plan_lib
    from sage_tfx.components import plan_io
    from sage_tfx.ledger.releases import WHOLE_GRANT
    if fileio.exists(os.path.join(grant_artifact.uri, plan_io.PLAN_FILE_NAME)):
        part = plan_io.read_plan(grant_artifact).part(plan_lib.TRAIN)   # verified against the grant
        return part.epsilon, part.delta, part.event, "the plan's train part", part.name
    return grant.epsilon, grant.delta, grant.event, f"grant {grant.grant_id}", WHOLE_GRANT


def _files(examples: types.Artifact, split: str) -> List[str]:
    names = artifact_utils.decode_split_names(examples.split_names) if examples.split_names else []
    if split not in names:
        raise InvalidRequestError(f"the Examples artifact {examples.uri} has no split {split!r} "
                                  f"(splits: {names})")
    return sorted(fileio.glob(os.path.join(artifact_utils.get_split_uri([examples], split), "*")))


def _first(ex, key):
    if key not in ex.features.feature:
        return None
    f = ex.features.feature[key]
    kind = f.WhichOneof("kind")
    vals = getattr(f, kind).value if kind else []
    return vals[0] if len(vals) else None


_KINDS = {"float": "float_list", "int": "int64_list"}


def read_rows(files, features, label_key: str, client_key: str):
    """(x (n, p) raw, y (n,), units) of every record; a missing feature takes its midpoint."""
    import tensorflow as tf
    from sage_tfx.components.block_example_gen.executor import read_gzip_tfrecords
    xs, ys, units = [], [], []
    for path in files:
        for record in read_gzip_tfrecords(path):
            ex = tf.train.Example.FromString(record)
            label, unit = _first(ex, label_key), _first(ex, client_key)
            if label is None or unit is None:
                raise InvalidRequestError(f"every example needs its label ({label_key!r}) and "
                                          f"privacy unit ({client_key!r})")
            for f in features:   # the served model parses each feature with its declared type
                if f.key in ex.features.feature and ex.features.feature[f.key].WhichOneof("kind") \
                        not in (None, _KINDS[f.dtype]):
                    raise InvalidRequestError(f"feature {f.key!r} is declared {f.dtype} but stored "
                                              f"as {ex.features.feature[f.key].WhichOneof('kind')}")
            row = [_first(ex, f.key) for f in features]
            xs.append([f.midpoint if v is None else float(v) for f, v in zip(features, row)])
            ys.append(float(label))
            units.append(unit.decode("utf-8") if isinstance(unit, bytes) else unit)
    return np.asarray(xs, dtype=np.float64).reshape(len(xs), len(features)), np.asarray(ys), units


# The one artifact of a channel; zero or several is a clear error.
_one = functools.partial(artifacts.single_artifact, component="DnDTrainer")


class Executor(base_executor.BaseExecutor):
    """Checks the charge, runs Draw-and-Discard over the window, exports the average — once per
    grant: a re-execution returns the recorded model byte for byte."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        from sage_tfx.ledger import open_ledger
        from sage_tfx.ledger.releases import (check_part_claim, claim_part, part_release_name,
                                              release_tree_once)
        grant_artifact = _one(input_dict, spec.GRANT_INPUT_KEY, what="SageGrant (from SageGate)")
        grant = artifacts.read_grant(grant_artifact)  # a denial raises with the ledger's reason
        settings, features = settings_from_exec_properties(exec_properties)
        eps, dlt, event, what, part = _train_charge(grant_artifact, grant)
        charge = protocol.check_train_cost(eps, dlt, event, settings, what)
        examples = _one(input_dict, spec.EXAMPLES_KEY, what="Examples")
        recorded = (examples.get_string_custom_property(EXAMPLES_GRANT_ID)
                    if examples.has_custom_property(EXAMPLES_GRANT_ID) else "")
        if recorded != grant.grant_id:
            raise MissingGrantError(f"the examples were read under grant {recorded or 'none'}, not "
                                    f"{grant.grant_id}: read them with BlockExampleGen from this "
                                    "grant")
        model = _one(output_dict, spec.MODEL_KEY, what="Model output")

        def produce_into(out_dir: str) -> None:   # runs only if the grant released no model yet
            budget = RunBudget(dataclasses.replace(grant, epsilon=eps, delta=dlt, event=event),
                               settings.client, settings.spec.dim, settings.passes)
            x, y, units = read_rows(_files(examples, exec_properties.get(spec.SPLIT_KEY)
                                           or spec.DEFAULT_SPLIT),
                                    features, exec_properties[spec.LABEL_KEY],
                                    exec_properties[spec.CLIENT_KEY])
            if settings.family == "logistic" and not np.all((y == 0) | (y == 1)):
                raise InvalidRequestError("logistic labels must be 0 or 1")
            x01 = protocol.bounds_of(features).normalize(x)
            spam = exec_properties.get(spec.SPAM_CHECK_KEY, 1) != 0
            result = protocol.run_protocol(settings, x01, y, units, budget, spam_check=spam)
            del x, x01, y, units
            export.export_glm(settings.family, result.weights, features,
                              path_utils.serving_model_path(out_dir))
            with open(os.path.join(out_dir, spec.PRIVACY_REPORT_FILE), "w") as f:
                f.write(json.dumps(_report(grant, settings, charge, spam, result), indent=2,
                                   sort_keys=True))
            logging.info("DnDTrainer: %d updates (%d accepted) at epsilon=%s, delta=%s per "
                         "update (%s unit), %d pass(es)", result.updates, result.accepted,
                         settings.client.update_epsilon(settings.spec.dim),
                         settings.client.update_delta(settings.spec.dim), settings.client.unit,
                         settings.passes)

        with open_ledger(
            grant_artifact.get_string_custom_property(artifacts.LEDGER_URL_KEY)) as led:
            # One spender per plan part: refused here if another trainer claimed the part,
            # claimed after the run and before its model is recorded.
            check_part_claim(led, grant.grant_id, part, spec.COMPONENT)

            def produce_and_claim(out_dir: str) -> None:
                produce_into(out_dir)
                claim_part(led, grant.grant_id, part, spec.COMPONENT)

            outcome = release_tree_once(led, grant.grant_id,
                                        part_release_name(part, spec.RELEASE_OUTPUT), model.uri,
                                        produce_and_claim)
        if outcome.replayed:
            logging.info("DnDTrainer: grant %s already released its model; returned the recorded "
                         "one (no new run, no new noise)", grant.grant_id)
        with open(os.path.join(model.uri, spec.PRIVACY_REPORT_FILE)) as f:
            report = json.load(f)
        model.set_string_custom_property(spec.GRANT_ID_PROPERTY, grant.grant_id)
        model.set_int_custom_property(spec.UPDATES_PROPERTY, int(report["updates_accepted"]))
        model.set_int_custom_property(spec.REPLAYED_PROPERTY, int(outcome.replayed))
        model.set_string_custom_property(spec.RELEASE_DIGEST_PROPERTY, outcome.release.digest)


_NOISE = {"gaussian": "sage_tfx.dnd.noise discrete Gaussian (CDT)",
          "laplace": "sage_tfx.dnd.laplace discrete Laplace"}


def _report(grant, settings, charge: dict, spam: bool, result) -> dict:
    from sage_tfx.ledger import accounting
    client, dim = settings.client, settings.spec.dim
    return {"grant_id": grant.grant_id, "stream": grant.stream, "family": settings.family,
            "k": settings.k, "gamma": client.gamma, "unit": client.unit,
            "l1_norm_clip": None if client.gaussian else client.l1_norm_clip,
            "l2_norm_clip": client.l2_norm_clip,
            "epsilon_per_weight_or_update": client.epsilon,
            "epsilon_per_update": client.update_epsilon(dim),
            "delta_per_update": client.update_delta(dim),
            "update_event": accounting.event_to_dict(client.update_event(dim)),
            "noise_scale": client.noise_scale, "noise_std": client.sampler_std(dim),
            "passes": settings.passes,
            "n_c": settings.n_c, "charged": charge, "spam_check": spam,
            "updates": result.updates, "updates_accepted": result.accepted,
            "updates_rejected": result.rejected_spam, "noise": _NOISE[client.noise_kind],
            # the update counts are exact (not DP): passes x the number of units
            "counts_are_not_dp": True,
            "blocks": list(grant.block_ids)}
