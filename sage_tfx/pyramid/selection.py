"""Count selection (Pyramid §III.B.4, App. A.3): which feature groups to count, chosen under DP.

For every candidate pair ``(a, b)`` of base features the score is the *gain* of counting the pair
over its better member: ``n·I((a, b); L) − max(n·I(a; L), n·I(b; L))`` (§III.B.4: groups "that
together exhibit higher MI with the label than x_i alone"). Each ``n·I`` term moves by at most
``ln(N + 1) + 2`` when one of ≤ N observations is added or removed
(:func:`sage_tfx.dp.count_selection.mi_score_sensitivity`), and so does a max of such terms, so the
gain's sensitivity is twice that. **Per user:** neighbours differ in the ≤ ``k`` observations of
one user (Pyramid's ``k``, as for the counts and the weight quantiles); adding them one at a
time passes through windows of ≤ N observations, so a gain moves by at most
``Δ_k = 2k (ln(N + 1) + 2)`` (:func:`gain_sensitivity`). The ``n_select`` best gains are
released with OpenDP's noisy top-k calibrated at that L∞ distance, ε-DP per user
(:func:`sage_tfx.dp.count_selection.private_top_k`: the exponential mechanism peeled
``n_select`` times, scale ``2 · n_select · Δ_k / ε`` by OpenDP's map). With ``k = 1`` the
guarantee is per observation only.

The paper leaves private count selection as a proposal (sample-and-aggregate with the center of
attention); noisy top-k over scores of bounded sensitivity is a simpler, standard ε-DP selection.
The hot window this reads must be charged (:meth:`select_groups` charges the ledger first), and
the choice is released once: it is recorded against the grant (release
:data:`SELECTION_RELEASE`), with the request it answers (features, label, ``n_select``, ε,
``max_records``, ``k``), before it is returned. A replay of the run id with the same request
returns the recorded choice without drawing new noise; another request under the grant raises
``ReleaseConflictError``.
"""
from __future__ import annotations

import itertools
import json
from typing import Optional, Sequence

import pandas as pd

from sage_tfx.dp.count_selection import mi_score, mi_score_sensitivity, private_top_k
from sage_tfx.errors import InvalidRequestError, ReleaseConflictError
from sage_tfx.ledger.accounting import check_epsilon
from sage_tfx.ledger.releases import release_value_once
from sage_tfx.pyramid.featurize import check_frame, group_keys

__all__ = ["pair_gains", "select_groups", "gain_sensitivity", "SELECTION_RELEASE"]

SELECTION_RELEASE = "pyramid/select_groups"


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidRequestError(f"k (observations per user) must be an int >= 1, got {k!r}")
    return k


def gain_sensitivity(max_records: int, k: int = 1) -> float:
    """L∞ sensitivity of the pairs' MI gains between windows of ≤ ``max_records`` observations
    that differ in the ≤ ``k`` observations of one user: ``k`` times twice the MI score's (a gain
    is a difference of two MI scores, :func:`pair_gains`)."""
    return 2.0 * _check_k(k) * mi_score_sensitivity(max_records)


def pair_gains(frame: pd.DataFrame, features: Sequence[str], label: str
               ) -> tuple[list[tuple[str, str]], list[float]]:
    """Candidate pairs and their exact (non-DP) MI gains on ``frame``."""
    check_frame(frame, features, label, n_labels=int(frame[label].max()) + 1 if len(frame) else 2)
    lab = frame[label].to_numpy()
    single = {f: mi_score(group_keys(frame, (f,)), lab) for f in features}
    pairs = list(itertools.combinations(features, 2))
    gains = [mi_score(group_keys(frame, p), lab) - max(single[p[0]], single[p[1]]) for p in pairs]
    return pairs, gains


def select_groups(frame: pd.DataFrame, features: Sequence[str], label: str, n_select: int,
                  epsilon: float, *, max_records: int, k: int = 1, ledger=None,
                  stream: Optional[str] = None, blocks: Sequence[str] = (),
                  run_id: Optional[str] = None) -> list[tuple[str, str]]:
    """ε-DP (per user of ≤ ``k`` observations) choice of ``n_select`` feature pairs to count,
    from the hot window ``frame``.

    With a ``ledger``, ε is charged to ``blocks`` under ``run_id`` before anything is computed,
    and the choice is recorded against the grant with its request; a replay of ``run_id`` with
    the same request returns the recorded choice (no new noise, no new charge).

    Args:
      k: observations one user contributes at most (the spec's ``k``); the noise grows with it.
    Raises:
      InvalidRequestError: fewer than two features, more observations than ``max_records``,
        ``n_select`` larger than the number of pairs, ``k`` not an int >= 1; a denied charge.
      ReleaseConflictError: the grant already recorded a choice for another request.
    """
    epsilon = check_epsilon(epsilon)
    k = _check_k(k)
    features = list(dict.fromkeys(features))
    if len(features) < 2:
        raise InvalidRequestError("count selection needs at least two features")
    if len(frame) > max_records:
        raise InvalidRequestError(f"{len(frame)} observations exceed max_records={max_records}")
    n_pairs = len(features) * (len(features) - 1) // 2
    if isinstance(n_select, bool) or not isinstance(n_select, int) or not 1 <= n_select <= n_pairs:
        raise InvalidRequestError(f"n_select must be an int in [1, {n_pairs}], got {n_select!r}")
    check_frame(frame, features, label, n_labels=int(frame[label].max()) + 1 if len(frame) else 2)

    def draw() -> list[tuple[str, str]]:
        pairs, gains = pair_gains(frame, features, label)
        return [pairs[i] for i in private_top_k(gains, n_select,
                                                gain_sensitivity(max_records, k), epsilon)]

    if ledger is None:
        return draw()
    request = {"features": features, "label": label, "n_select": n_select, "epsilon": epsilon,
               "max_records": int(max_records), "k": k}
    if not (stream and blocks and run_id):
        raise InvalidRequestError("a charged selection needs stream, blocks and run_id")
    decision = ledger.request(stream, run_id=run_id, blocks=list(blocks), epsilon=epsilon,
                              delta=0.0)
    if not decision.granted:
        raise InvalidRequestError(f"ledger refused count selection: {decision.reason}")
    out = release_value_once(ledger, decision.grant.grant_id, SELECTION_RELEASE,
                             lambda: json.dumps({"pairs": [list(p) for p in draw()],
                                                 "request": request}, sort_keys=True
                                                ).encode("utf-8"))
    recorded = json.loads(out.value)
    if isinstance(recorded, list):      # recorded before releases carried their request
        return [tuple(p) for p in recorded]
    if recorded["request"] != request:
        differ = sorted(f for f in request if recorded["request"].get(f) != request[f])
        raise ReleaseConflictError(
            f"grant {decision.grant.grant_id} already released a count selection for another "
            f"request (differs in {differ}): one charge buys one selection; a new question "
            "needs a new grant")
    return [tuple(p) for p in recorded["pairs"]]
