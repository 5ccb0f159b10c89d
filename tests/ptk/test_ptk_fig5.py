"""The Fig. 5 harness on a tiny synthetic transfer task (source and target share key effects)."""
import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.eval import fig5

CFG = {"label": "y", "features": {"k": {"domain": list(range(40))}}}


def task(n, seed, effects):
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 40, n)
    y = (rng.random(n) < effects[k]).astype(np.int64)
    return {"k": k, "x": rng.normal(size=n), "y": y}


def run(**kw):
    effects = np.random.default_rng(0).uniform(0.05, 0.95, 40)
    args = dict(dataset="synthetic", source=task(4000, 1, effects),
                target_train=task(600, 2, effects), target_test=task(2000, 3, effects),
                label="y", kernel="sage_tfx.ptk.kernels.counts", kernel_config=CFG,
                base_features=lambda c: c["x"][:, None],
                model_factory=lambda s: LogisticRegression(max_iter=200),
                metric="log_loss", fractions=(0.05, 1.0), epsilons=(0.1, 1.0), seeds=(0, 1))
    args.update(kw)
    return fig5.run_fig5(**args)


def test_rows_shape_and_ptk_features_help_with_little_target_data(tmp_path):
    rows = run()
    assert set(rows[0]) == set(fig5.FIELDS)
    # per seed and fraction: no_ptk, nonprivate_ptk, dp_ptk at two eps -> 4 rows
    assert len(rows) == 2 * 2 * 4
    assert {r["variant"] for r in rows} == set(fig5.VARIANTS)
    assert all(math.isnan(r["eps"]) == (r["variant"] != "dp_ptk") for r in rows)
    s = {(r["variant"], r["eps"] if r["variant"] == "dp_ptk" else None, r["fraction"]): r["mean"]
         for r in fig5.summarize(rows)}
    # the key carries the signal only through the PTK: every PTK variant beats no-PTK
    assert s[("nonprivate_ptk", None, 0.05)] < s[("no_ptk", None, 0.05)] - 0.05
    assert s[("dp_ptk", 1.0, 0.05)] < s[("no_ptk", None, 0.05)] - 0.05
    # and DP at eps = 1 is close to non-private
    assert abs(s[("dp_ptk", 1.0, 1.0)] - s[("nonprivate_ptk", None, 1.0)]) < 0.02
    fig5.write_csv(rows, str(tmp_path / "r.csv"))
    fig5.plot(rows, str(tmp_path / "r.png"), "synthetic")
    assert (tmp_path / "r.png").stat().st_size > 1000
    assert len((tmp_path / "r.csv").read_text().splitlines()) == len(rows) + 1


@pytest.mark.parametrize("bad", [dict(metric="r2"), dict(fractions=(0.0,)),
                                 dict(epsilons=(0.0,)), dict(seeds=()), dict(label="nope"),
                                 dict(kernel="no.such.kernel")])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(InvalidRequestError):
        run(**bad)


def test_headline_statements():
    def row(v, eps, frac, value):
        return {"dataset": "d", "kernel": "k", "variant": v, "eps": eps, "fraction": frac,
                "n_train": 1, "metric": "log_loss", "value": value, "seed": 0}
    nan = math.nan
    rows = [row("no_ptk", nan, 0.1, 1.0), row("no_ptk", nan, 1.0, 0.5),
            row("nonprivate_ptk", nan, 0.1, 0.6), row("nonprivate_ptk", nan, 1.0, 0.4),
            row("dp_ptk", 1.0, 0.1, 0.8), row("dp_ptk", 1.0, 1.0, 0.45)]
    (h,) = fig5.headline(rows)
    assert h["improvement_small"] == pytest.approx(0.2)
    assert h["improvement_full"] == pytest.approx(0.1)
    assert h["np_gap_full"] == pytest.approx(0.125)   # 0.45 is 12.5 % worse than 0.4
    assert h["match_fraction"] == 1.0                 # 0.8 at 10 % does not reach 0.5
