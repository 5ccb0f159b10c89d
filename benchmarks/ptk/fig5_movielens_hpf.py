"""PTK paper Fig. 5 (e)/(f) shape on MovieLens (dslabs/movielens): DP HPF user embeddings
trained on ratings of action-group movies, consumed by a rating model for the other movies, vs
the fraction of target training data, for no PTK, DP PTKs (ε ∈ {0.1, 1}) and a non-private PTK.

    .venv/bin/python benchmarks/ptk/fig5_movielens_hpf.py [--seeds 0 1 2] [--eps 0.1 1]
        [--fractions 0.02 0.05 0.1 0.25 0.5 1] [--max-source N] [--max-target N] [--k 8]
        [--iterations 60] [--max-iter 200] [--out benchmarks/results/ptk]

Writes fig5_movielens_hpf.csv, fig5_movielens_hpf_summary.csv and fig5_movielens_hpf.png.
"""
from __future__ import annotations

import argparse
import time

from sage_tfx.ptk.eval import fig5, fig5_data


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0])
    p.add_argument("--fractions", type=float, nargs="+", default=[0.02, 0.05, 0.1, 0.25, 0.5, 1.0])
    p.add_argument("--max-source", type=int, default=None)
    p.add_argument("--max-target", type=int, default=None)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--max-iter", type=int, default=200)
    p.add_argument("--out", default="benchmarks/results/ptk")
    a = p.parse_args(argv)
    t0 = time.time()
    task = fig5_data.movielens_task(a.max_source, a.max_target)
    rows = fig5.run_and_write(
        "MovieLens", task,
        {"hpf": ("sage_tfx.ptk.kernels.hpf", fig5_data.movielens_hpf(a.k, a.iterations))},
        out_dir=a.out, stem="fig5_movielens_hpf", metric="mse", fractions=a.fractions,
        epsilons=a.eps, seeds=a.seeds,
        model_factory=fig5_data.model_factory(task["n_ids"], "regression", a.max_iter))
    print(f"source {len(task['source']['user'])} ratings, target train "
          f"{len(task['target_train']['user'])}, test {len(task['target_test']['user'])}; "
          f"{time.time() - t0:.0f} s")
    fig5.print_summary(rows)
    return rows


if __name__ == "__main__":
    main()
