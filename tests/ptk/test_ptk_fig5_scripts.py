"""The Fig. 5 benchmark scripts on tiny configs (the full runs are the scripts' defaults)."""
import importlib.util
import math
import os

import numpy as np

from sage_tfx.ptk.eval import fig5, fig5_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", "ptk",
                                                                     f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_outputs(rows, out, stem, kernels):
    assert {r["kernel"] for r in rows} == set(kernels)
    assert {r["variant"] for r in rows} == set(fig5.VARIANTS)
    assert all(math.isfinite(r["value"]) for r in rows)
    for suffix in (".csv", "_summary.csv", "_headline.csv", ".png"):
        assert (out / f"{stem}{suffix}").stat().st_size > 100


def test_flights_script_tiny(tmp_path):
    rows = script("fig5_flights").main([
        "--seeds", "0", "--eps", "1", "--fractions", "1", "--max-source", "6000",
        "--max-target", "3000", "--trees", "2", "--depth", "2", "--max-iter", "10",
        "--out", str(tmp_path)])
    check_outputs(rows, tmp_path, "fig5_flights", ("counts", "trees"))
    assert len(rows) == 2 * 3          # kernels x (no PTK, DP at one eps, non-private)


def test_movielens_script_tiny(tmp_path):
    rows = script("fig5_movielens_hpf").main([
        "--seeds", "0", "--eps", "1", "--fractions", "1", "--max-source", "3000",
        "--max-target", "2000", "--k", "3", "--iterations", "5", "--max-iter", "10",
        "--out", str(tmp_path)])
    check_outputs(rows, tmp_path, "fig5_movielens_hpf", ("hpf",))
    assert {r["metric"] for r in rows} == {"mse"}


def test_declared_domains_come_from_public_tables_not_the_flights():
    cfg = fig5_data.flights_counts()
    assert len(cfg["features"]["date"]["domain"]) == 365
    cols = fig5_data.flights_columns()
    # some flown tail numbers are not in the public registry: the domain was not read from data
    assert not set(np.unique(cols["tailnum"])) <= set(cfg["features"]["tailnum"]["domain"])
    hpf_cfg = fig5_data.movielens_hpf()
    assert len(hpf_cfg["items"]["domain"]) == len(fig5_data.GENRES) * 3
