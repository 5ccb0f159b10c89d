"""PTKTrainer executor: a gated PTK training run (PTK paper §5.4 inside a TFX pipeline).

The run's SageGrant must be a released grant the ledger recorded (re-verified like
BlockExampleGen does), and its (ε, δ) must equal the PTK type's declared charge at that ε: the
PTK is trained with exactly the budget the ledger charged. The Examples are the granted blocks
(all splits: a PTK has no use for an eval split). The new state goes to the PTK lake with its
lineage (window, blocks, ε, δ, grant id, run id), the subscribers are notified, and a PTKState
artifact holds the version.

The PTK's type comes from the registry (:func:`sage_tfx.ptk.registry.default_registry`: the
built-in kernels and the operator's ``$SAGE_PTK_TYPES``), never from an import path in the lake.
The trained state is released once against the grant (``ptk/trainer/<ptk id>/w<window>``): a
retried or re-executed pod with the same grant gets the recorded state back byte for byte and
draws no noise.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.components.artifacts import is_granted, read_grant
from sage_tfx.components.block_example_gen.executor import verify_grant
from sage_tfx.components.gate.spec import GRANT_KEY
from sage_tfx.components.ptk_trainer import examples_io, spec
from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import MissingGrantError
from sage_tfx.ledger import open_ledger
from sage_tfx.ledger.releases import release_value_once
from sage_tfx.ptk.abstraction import UnknownPTKError, batches_of, canonical_json
from sage_tfx.ptk.lake import Lake
from sage_tfx.ptk.notify import Notifier
from sage_tfx.ptk.registry import default_registry
from sage_tfx.ptk.results import PTKVersion


def write_state(artifact, version: PTKVersion) -> None:
    os.makedirs(artifact.uri, exist_ok=True)
    with open(os.path.join(artifact.uri, spec.STATE_FILE), "w") as f:
        json.dump(version.state, f)
    row = version.to_dict()
    lineage = {k: row[k] for k in ("ptk_id", "version", "window_index", "blocks", "epsilon",
                                   "delta", "event", "grant_id", "run_id", "stream",
                                   "n_used", "oldest_window", "newest_window")}
    with open(os.path.join(artifact.uri, spec.LINEAGE_FILE), "w") as f:
        json.dump(lineage, f, indent=1)
    artifact.set_string_custom_property(spec.PTK_ID_KEY, version.ptk_id)
    artifact.set_int_custom_property(spec.VERSION_KEY, int(version.version))
    artifact.set_string_custom_property("grant_id", version.grant_id)


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        url = exec_properties[spec.LEDGER_URL_KEY]
        ptk_id = exec_properties[spec.PTK_ID_KEY]
        window = int(exec_properties[spec.WINDOW_INDEX_KEY])
        grant_artifact = artifact_utils.get_single_instance(input_dict[GRANT_KEY])
        if not is_granted(grant_artifact):
            raise MissingGrantError("PTKTrainer needs a granted SageGrant")
        grant = read_grant(grant_artifact)
        lake = Lake(url)
        try:
            with open_ledger(url) as ledger:
                grant = verify_grant(grant, ledger, url)
                rec = lake.ptk(ptk_id)
                if rec is None or rec.status != "active":
                    raise UnknownPTKError(f"no registered PTK {ptk_id!r} in the PTK lake")
                ptype = default_registry().get(rec.ptk_type)
                if grant.epsilon is None:
                    raise MissingGrantError("PTKTrainer runs on basic-mode grants (epsilon, delta)")
                charge = ptype.charge(grant.epsilon, rec.config)
                if (charge.epsilon, charge.delta) != (grant.epsilon, grant.delta):
                    raise MissingGrantError(
                        f"grant {grant.grant_id} charged (eps={grant.epsilon}, "
                        f"delta={grant.delta}) but {ptk_id} at eps={grant.epsilon} spends "
                        f"(eps={charge.epsilon}, delta={charge.delta}): the gate must charge "
                        "exactly what the PTK spends")
                examples = artifact_utils.get_single_instance(input_dict[spec.EXAMPLES_KEY])
                if examples.get_string_custom_property("grant_id") != grant.grant_id:
                    raise MissingGrantError("the Examples were not read under this grant")
                prev = next((v for v in reversed(lake.versions(ptk_id))
                             if v.window_index < window), None)

                def produce() -> bytes:
                    data = _columns(examples)
                    state = ptype.train_dp(batches_of(data), grant.epsilon,
                                           prev.state if prev else None,
                                           prev.config if prev else None,
                                           config=rec.config, noise=dp_noise.SECURE)
                    n_used = len(next(iter(data.values()))) if data else 0
                    return canonical_json({"state": state, "n_used": n_used})

                released = json.loads(release_value_once(
                    ledger, grant.grant_id, f"ptk/trainer/{ptk_id}/w{window}", produce).value)
            version = lake.add_version({
                "ptk_id": ptk_id, "window_index": window,
                "state_json": canonical_json(released["state"]).decode("utf-8"),
                "config": rec.config, "epsilon": grant.epsilon, "delta": grant.delta,
                "event": repr(charge.event), "grant_id": grant.grant_id, "run_id": grant.run_id,
                "stream": grant.stream, "blocks": list(grant.block_ids),
                "n_used": released["n_used"], "partition_index": 0,
                "oldest_window": prev.oldest_window if prev else window,
                "newest_window": window})
            lake.enqueue(ptk_id, version.version)
            notifier = Notifier(lake)
            notifier.deliver()
            notifier.close()
            write_state(artifact_utils.get_single_instance(output_dict[spec.PTK_STATE_KEY]),
                        version)
        finally:
            lake.close()


def _columns(examples) -> dict:
    """All splits of the granted Examples as numpy columns."""
    import numpy as np
    cols: dict = {}
    for split in artifact_utils.decode_split_names(examples.split_names):
        _, c = examples_io.read_split(examples.uri, split)
        for k, v in c.items():
            cols.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in cols.items()}
