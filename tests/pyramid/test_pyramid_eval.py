"""The Pyramid evaluation harness on a tiny slice of the real Chicago taxi workload (the full runs
are benchmarks/pyramid/*.py)."""
import numpy as np
import pytest
from sklearn.metrics import log_loss

from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import taxi as T
from sage_tfx.pyramid.eval.flights import time_split


def test_taxi_workload_loads_with_declared_columns_and_windows():
    d = T.load_taxi()
    assert set(T.FEATURES) | {T.LABEL, "month"} == set(d.columns)
    assert sorted(d["month"].unique()) == list(range(1, 13))
    assert set(d[T.LABEL].unique()) <= {0, 1}


def test_run_workload_normalises_by_raw_lr_on_all_data():
    d = T.load_taxi().iloc[::4].reset_index(drop=True)   # ~3,700 trips, still 12 windows
    train, test = time_split(d)
    lines = []
    df = E.run_workload(train, test, T.FEATURES[:3], (), fractions=(0.2,),
                        configs=[(E.NO_NOISE_EPSILON, "none", "count_median"),
                                 (1.0, "none", "count_min")], seeds=[0, 1], width=2 ** 8,
                        log=lines.append)
    base = E.raw_lr_loss(train, test, T.FEATURES[:3])
    assert df["baseline"].unique().tolist() == [pytest.approx(base)]
    assert df["constant"].iloc[0] == pytest.approx(
        log_loss(test.y, np.full(len(test), train.y.mean())))
    assert np.allclose(df["normalized"], df["loss"] / base)
    # one raw-LR row; the noise-free config once, the noisy one per seed; two models each
    assert len(df) == 1 + 2 * (1 + 2) and len(lines) == 1 + len(df)
    assert set(df[df.epsilon == 1.0].seed) == {0, 1}
