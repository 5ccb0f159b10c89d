"""Count selection (Pyramid §III.B.4, App. A.3): which feature groups to count, chosen under DP.

For every candidate pair ``(a, b)`` of base features the score is the *gain* of counting the pair
over its better member: ``n·I((a, b); L) − max(n·I(a; L), n·I(b; L))`` (§III.B.4: groups "that
together exhibit higher MI with the label than x_i alone"). Each ``n·I`` term moves by at most
``ln(N + 1) + 2`` when one of ≤ N observations is added or removed
(:func:`sage_tfx.dp.count_selection.mi_score_sensitivity`), and so does a max of such terms, so the
gain's sensitivity is twice that. The ``n_select`` best gains are released with OpenDP's noisy
top-k at ε (:func:`sage_tfx.dp.count_selection.private_top_k`).

The paper leaves private count selection as a proposal (sample-and-aggregate with the center of
attention); noisy top-k over scores of bounded sensitivity is a simpler, standard ε-DP selection.
The hot window this reads must be charged (:meth:`select_groups` charges the ledger first), and
the choice is released once: it is recorded against the grant (release
:data:`SELECTION_RELEASE`) before it is returned, and a replay of the run id returns the
recorded choice without drawing new noise.
"""
from __future__ import annotations

import itertools
import json
from typing import Optional, Sequence

import pandas as pd

from sage_tfx.dp.count_selection import mi_score, mi_score_sensitivity, private_top_k
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon
from sage_tfx.ledger.releases import release_value_once
from sage_tfx.pyramid.featurize import check_frame, group_keys

__all__ = ["pair_gains", "select_groups", "gain_sensitivity", "SELECTION_RELEASE"]

SELECTION_RELEASE = "pyramid/select_groups"


def gain_sensitivity(max_records: int) -> float:
    """Sensitivity of a pair's MI gain: twice the MI score's (a gain is a difference of two MI
    scores, :func:`pair_gains`)."""
    return 2.0 * mi_score_sensitivity(max_records)


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
                  epsilon: float, *, max_records: int, ledger=None, stream: Optional[str] = None,
                  blocks: Sequence[str] = (), run_id: Optional[str] = None
                  ) -> list[tuple[str, str]]:
    """ε-DP choice of ``n_select`` feature pairs to count, from the hot window ``frame``.

    With a ``ledger``, ε is charged to ``blocks`` under ``run_id`` before anything is computed,
    and the choice is recorded against the grant; a replay of ``run_id`` returns the recorded
    choice (no new noise, no new charge).

    Raises:
      InvalidRequestError: fewer than two features, more observations than ``max_records``,
        ``n_select`` larger than the number of pairs; a denied charge.
    """
    epsilon = check_epsilon(epsilon)
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
        return [pairs[i] for i in private_top_k(gains, n_select, gain_sensitivity(max_records),
                                                epsilon)]

    if ledger is None:
        return draw()
    if not (stream and blocks and run_id):
        raise InvalidRequestError("a charged selection needs stream, blocks and run_id")
    decision = ledger.request(stream, run_id=run_id, blocks=list(blocks), epsilon=epsilon,
                              delta=0.0)
    if not decision.granted:
        raise InvalidRequestError(f"ledger refused count selection: {decision.reason}")
    out = release_value_once(ledger, decision.grant.grant_id, SELECTION_RELEASE,
                             lambda: json.dumps([list(p) for p in draw()]).encode("utf-8"))
    return [tuple(p) for p in json.loads(out.value)]
