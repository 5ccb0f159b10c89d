"""The privacy plan inside a SageGrant artifact: written by SageGate, read by every DP component.

* File: ``{grant uri}/plan.json`` — ``sage_tfx.adaptive.plan.PrivacyPlan.to_json()``, present when
  the gate was given a plan. Its composed cost equals what the ledger charged (checked on read).
"""
from __future__ import annotations

import os

from tfx.dsl.io import fileio
from tfx.types.artifact import Artifact

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components import artifacts
from sage_tfx.errors import MissingGrantError

PLAN_FILE_NAME = "plan.json"


def write_plan(artifact: Artifact, plan: plan_lib.PrivacyPlan) -> None:
    """Stores the run's plan beside its grant."""
    with fileio.open(os.path.join(artifact.uri, PLAN_FILE_NAME), "w") as f:
        f.write(plan.to_json())


def read_plan(artifact: Artifact) -> plan_lib.PrivacyPlan:
    """The plan of a granted run, verified against the grant's charged cost.

    Raises:
      MissingGrantError: denied or missing grant, no plan, or a plan whose cost differs from the
        charge (so no DP stage can spend budget that was not charged).
    """
    grant = artifacts.read_grant(artifact)
    path = os.path.join(artifact.uri, PLAN_FILE_NAME)
    if not fileio.exists(path):
        raise MissingGrantError(
            f"grant {grant.grant_id} carries no privacy plan ({PLAN_FILE_NAME}); give SageGate a "
            "plan so DP components know their share")
    with fileio.open(path, "r") as f:
        plan = plan_lib.PrivacyPlan.from_json(f.read())
    plan_lib.check_grant_matches(plan, grant)
    return plan
