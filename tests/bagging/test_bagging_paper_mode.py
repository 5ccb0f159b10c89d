"""Paper mode: an explicit non-DP opt-in, a stop before the query that would cross ε, and no
unpaid data-dependent figure (ε̂, the answer count) in anything it publishes."""
import json
import logging
import re

import numpy as np
import pytest

from sage_tfx.bagging import (BaggingConfig, PersonalisedMomentsAccountant, chunk_assignment,
                              fit_dp_bagging, label_public, plan_labels, train_teachers)
from sage_tfx.bagging.accounting import moments_epsilon
from sage_tfx.bagging.eval.grid import paper_answer_count
from sage_tfx.bagging.purchase import LABELS_RELEASE, cursor_name
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import BlockSpec, open_ledger

K, N, LAM, EPS, DELTA = 4, 10, 0.05, 2.0, 1e-5
SALT = b"paper"
PAPER = BaggingConfig(k=K, n=N, lam=LAM, mode="paper", accept_not_differentially_private=True)


def data(seed, N_rows=600, P=400):
    """Weak signal: teachers often disagree, so the paper's answer count varies with the data."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_rows, 2))
    y = (X[:, 0] + 5.0 * rng.normal(size=N_rows) > 0).astype(int)
    return X, y, np.arange(N_rows) // 2, np.random.default_rng(99).normal(size=(P, 2))


def test_paper_mode_needs_the_explicit_opt_in():
    X, y, units, Xp = data(0)
    ch = chunk_assignment(np.unique(units).tolist(), k=K, n=N, salt=SALT)
    ens = train_teachers(X, y, ch[units], n=N)
    refusals = (lambda: BaggingConfig(k=K, n=N, lam=LAM, mode="paper"),
                lambda: label_public(ens, Xp, epsilon=EPS, delta=DELTA, lam=LAM, mode="paper",
                                     unit_chunks=ch))
    for refused in refusals:
        with pytest.raises(InvalidRequestError, match="NOT differentially private"):
            refused()
    with pytest.raises(InvalidRequestError, match="applies to mode='paper' only"):
        BaggingConfig(k=K, n=N, lam=LAM, accept_not_differentially_private=True)
    for not_a_bool in (1, "yes", None):
        with pytest.raises(InvalidRequestError, match="True or False"):
            BaggingConfig(k=K, n=N, lam=LAM, mode="paper",
                          accept_not_differentially_private=not_a_bool)


def _independent_trajectory(X, y, units, Xp, salt):
    """max(max_u S(u), S(∗)) after each public query, recomputed from scratch."""
    uniq, inverse = np.unique(units, return_inverse=True)
    ch = chunk_assignment(uniq.tolist(), k=K, n=N, salt=salt)
    ens = train_teachers(X, y, ch[inverse], n=N)
    pma = PersonalisedMomentsAccountant(ch, n=N, lam=LAM, delta=DELTA)
    running = np.concatenate([pma.trajectory(pred, 2) for _, pred in ens.predict_batches(Xp)])
    return running, ens, ch


def _numbers(text):
    return [float(t) for t in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]


def test_paper_mode_stops_before_crossing_and_publishes_no_data_dependent_figure(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ledger = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    ledger.create_stream("s", epsilon_g=100.0, delta_g=1e-3)
    ledger.add_blocks("s", [BlockSpec("b1", str(tmp_path / "b1"))])
    plan = plan_labels(PAPER, epsilon=EPS, delta=DELTA, public_size=400)
    assert plan.queries is None and plan.epsilon == EPS and not plan.formally_dp  # whole grant
    published, counts = [], []
    for seed in (0, 1):        # two private windows, each under its own grant
        X, y, units, Xp = data(seed)
        g = ledger.request("s", run_id=f"paper-{seed}", blocks=["b1"], epsilon=plan.epsilon,
                           delta=plan.delta).grant.grant_id
        caplog.clear()
        res = fit_dp_bagging(X, y, units, Xp, config=PAPER, salt=SALT + bytes([seed]),
                             public_declared=True, ledger=ledger, grant_id=g)
        answered = res.labelling.queries
        counts.append(answered)

        # the crossing query is not answered (independent recomputation of the accountant)
        running, ens, ch = _independent_trajectory(X, y, units, Xp, SALT + bytes([seed]))
        hat = moments_epsilon(running, lam=LAM, delta=DELTA)
        assert 0 < answered < len(Xp)
        assert hat[answered - 1] <= EPS < hat[answered]
        assert paper_answer_count(running, epsilon=EPS, delta=DELTA, lam=LAM, max_order=32) \
            == answered + 1                      # Alg. 1 would have answered it (and crossed ε)

        # what was published: the report (also inside the ledger's release) and the logs
        value = json.loads(ledger.recorded_release(g, LABELS_RELEASE).value)
        assert value["report"] == res.report and len(value["labels"]) == answered
        text = json.dumps(res.report, sort_keys=True) + caplog.text
        assert not [key for key in res.report if "hat" in key] and res.report["queries"] is None
        assert res.report["not_differentially_private"] is True and res.report[
            "formally_dp"] is False
        check = PersonalisedMomentsAccountant(ch, n=N, lam=LAM, delta=DELTA)
        assert sum(check.answer(p, EPS, 2) for _, p in ens.predict_batches(Xp)) >= answered
        for secret in (hat[answered - 1], float(hat[answered]), check.epsilon_hat_worst_star()):
            assert all(abs(v - secret) > 1e-6 for v in _numbers(text)), secret
        assert str(answered) not in re.findall(r"\d+", text.replace(g, ""))
        # the cursor moved by the reservation (the whole public set), not by the answer count
        cursor = cursor_name(stream="s", blocks=["b1"], config=PAPER, salt=SALT + bytes([seed]),
                             settings={"l2": PAPER.l2, "n_classes": 2})
        assert ledger.counter(cursor) == len(Xp)
        published.append(json.dumps(res.report, sort_keys=True))
    # the power of the checks above: the answer count does depend on the private data, yet the
    # reports of the two windows are identical
    assert counts[0] != counts[1]
    assert published[0] == published[1]


def test_paper_mode_max_labels_reserves_a_public_number(tmp_path):
    ledger = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    ledger.create_stream("s", epsilon_g=100.0, delta_g=1e-3)
    ledger.add_blocks("s", [BlockSpec("b1", str(tmp_path / "b1"))])
    X, y, units, Xp = data(0)
    kw = dict(config=PAPER, salt=SALT, public_declared=True, ledger=ledger, max_labels=10)
    starts = []
    for run in ("a", "b"):
        g = ledger.request("s", run_id=run, blocks=["b1"], epsilon=EPS, delta=DELTA).grant.grant_id
        res = fit_dp_bagging(X, y, units, Xp, grant_id=g, **kw)
        assert res.labelling.queries <= 10 and res.report["public_reserved"] == 10
        starts.append(res.report["public_start"])
    assert starts == [0, 10]
