"""The Draw-and-Discard demo: learning under model-level local DP, on scikit-learn's digits.

Ten-class logistic regression on 8×8 digit images (650 weights; chance accuracy 0.10). Every
update a client sends is (ε, δ)-DP for the whole model (the gaussian unit: the gradient clipped in
L2, Gaussian noise on every weight). What it does (notebook 05 walks through the same steps with
more explanation):

1. A ledger (embedded SQLite under ``--out``) whose clients live in 8 hash-bucket blocks, each with
   a budget of ``1.5 × ε`` (so one run fits and a second does not).
2. The served run: :func:`~sage_tfx.dnd.server.build_service` charges every block (ε, δ) × passes
   (one update per client) *before* the first update, and opens the run's state in the ledger's
   database.
3. ``--served`` clients (10 digits each, sampled from the training set: digits is a stand-in for
   a population of users) each draw an instance, run Alg. 1 with the float-safe sampler and return
   it through the service (grant, pass counting, spam check, slot swap); a second update of the
   same client is refused; the run's average is released once (recorded against the grant).
4. The long curve: the same algorithm in process (:func:`~sage_tfx.dnd.eval.batched.run_batched`,
   16 clients in flight, numpy noise at the secure sampler's std; fresh noise every run) up to
   ``--updates``, beside the Laplace model unit at the same ε and the noise-free protocol.
5. Prints the accuracies, what the ledger charged (read back) and writes a picture.

At the defaults it takes ~7 min on a 2-core host shared with other jobs (6 min 50 s at a load
of ~7: the service 36 s, the curves 112 s, 157 s and 84 s), printing where it is at least every
~15 s when an evaluation point is due (the last stretch of a curve, 260,000 updates, runs
20-40 s); one run gave 0.854 (gaussian), 0.687 (Laplace), 0.954 (no noise) at 10⁶ updates.

    python -m sage_tfx.pipelines.dnd_demo [--out out/dnd] [--served 2000] [--updates 1000000]
        [--epsilon 8] [--delta 1e-6]
"""
from __future__ import annotations

import os
import time

import numpy as np

from sage_tfx.pipelines.demo_cli import log as _log
from sage_tfx.pipelines.demo_cli import fresh_out, parser, save_figure, timed_main

GAMMA = 0.002      # learning rate γ of the Laplace unit: small, so the noise the instances carry
                   # (∝ γ) averages out; the gaussian unit's γ and C₂ come from its step rule
L1_CLIP = 10.0     # C₁ of the Laplace model unit (digits' gradients at w = 0: L1 ≈ 20)
K = 10             # model instances on the server
CLIENT_ROWS = 10   # N_c: examples per client
BLOCKS = 8
IN_FLIGHT = 16
PROGRESS_SECONDS = 15.0  # a curve prints where it is at least this often (when a point is due)


def marks_up_to(updates: int, points: int = 24) -> list[int]:
    """Roughly log-spaced evaluation points from 1,000 updates to ``updates``."""
    return sorted({int(round(v)) for v in np.geomspace(1000, updates, points)})


def configs(epsilon: float, delta: float, updates: int) -> dict:
    """The three client configurations compared: the gaussian unit at (ε, δ) per update (γ, C₂
    by :mod:`sage_tfx.dnd.steprule` for ``updates``), the Laplace model unit at ε per update,
    and no noise at the gaussian unit's γ, C₂ (not private, a reference only)."""
    from sage_tfx.dnd import ClientConfig
    from sage_tfx.dnd.eval import digits
    from sage_tfx.dnd.steprule import gaussian_config
    gauss = gaussian_config(epsilon=epsilon, delta=delta, dim=digits.SPEC.dim, k=K,
                            updates=updates)
    return {f"gaussian unit, eps={epsilon:g}, delta={delta:g}": gauss,
            f"Laplace model unit, eps={epsilon:g}":
            ClientConfig(GAMMA, l1_norm_clip=L1_CLIP, epsilon=epsilon),
            "no noise (not private)":
            ClientConfig(gauss.gamma, epsilon=None, unit="gaussian",
                         l2_norm_clip=gauss.l2_norm_clip)}


def served_run(url: str, cfg, data, *, clients: int, run_id: str = "digits-1") -> dict:
    """``clients`` clients send one update each through the service of a run charged to the
    ledger at ``url`` (stream ``clients``); returns the released average's accuracy, counts and
    the refusal of a second update."""
    from sage_tfx.dnd import client_update
    from sage_tfx.dnd.budget import UpdateRefused
    from sage_tfx.dnd.eval import digits
    from sage_tfx.dnd.server import build_service
    from sage_tfx.streams import HashBucketScheme

    xtr, ytr, xte, yte = data
    scheme = HashBucketScheme("client_id", BLOCKS, "dnd-demo")
    svc = build_service(ledger_url=url, stream="clients", run_id=run_id, spec=digits.SPEC,
                        config=cfg, k=K, passes=1, window_last=BLOCKS, block_scheme=scheme)
    if svc.budget is None:
        return {"granted": False, "reason": svc.refusal}
    rng = np.random.default_rng()  # which images each simulated client holds
    accepted = 0
    t0 = last = time.time()
    for i in range(clients):
        if time.time() - last >= PROGRESS_SECONDS:
            last = time.time()
            _log(f"      served run: {i:,} of {clients:,} clients ({last - t0:.0f}s)")
        cid = f"user-{i}"
        rows = rng.choice(len(ytr), CLIENT_ROWS, replace=False)
        ticket, w = svc.draw(cid)  # admitted by the grant; one pass per client
        accepted += svc.discard(cid, ticket, client_update(digits.SPEC, w, xtr[rows],
                                                           ytr[rows], cfg))
    try:
        svc.draw("user-0")
        refusal = None
    except UpdateRefused as exc:
        refusal = str(exc)
    avg = svc.release()
    return {"granted": True, "grant_id": svc.grant_id, "accepted": accepted,
            "rejected": clients - accepted, "refusal": refusal, "final": avg.final,
            "accuracy": float(digits.SPEC.accuracy(avg.weights, xte, yte))}


def curves(data, cfgs: dict, updates: int, every: float = PROGRESS_SECONDS) -> dict:
    """Test accuracy of the averaged model against updates, one fresh-noise run per config;
    a progress line at the first evaluation point after each ``every`` seconds."""
    from sage_tfx.dnd.eval import digits
    from sage_tfx.dnd.eval.batched import run_batched
    out = {}
    for n, (label, cfg) in enumerate(cfgs.items(), start=1):
        t = time.time()
        last = [t]

        def progress(done: int, accuracy: float, n=n, t=t, last=last) -> None:
            if time.time() - last[0] >= every and done < updates:
                last[0] = time.time()
                _log(f"      curve {n}/{len(cfgs)}: {done:,} of {updates:,} updates, accuracy "
                     f"{accuracy:.3f} ({last[0] - t:.0f}s)")

        c = run_batched(digits.SPEC, cfg, K, *data, updates=updates, marks=marks_up_to(updates),
                        clients_of=CLIENT_ROWS, in_flight=IN_FLIGHT, seed=None, label=label,
                        progress=progress)
        out[label] = c
        _log(f"      {label}: accuracy {c.test_accuracy[-1]:.3f} at {c.updates[-1]:,} updates "
             f"(noise std {c.noise_std:.4f} per weight; {time.time() - t:.0f}s)")
    return out


def run(out: str, *, served: int = 2000, updates: int = 1_000_000, epsilon: float = 8.0,
        delta: float = 1e-6, plot: bool = True) -> dict:
    """Runs the demo into ``out`` (recreated); returns the accuracies, the ledger's charges and
    the picture's path."""
    from sage_tfx.dnd.eval import digits
    from sage_tfx.ledger import BlockSpec, open_ledger

    if served < 1 or updates < 1000:
        raise ValueError(f"need served >= 1 and updates >= 1000, got {served}, {updates}")
    cfgs = configs(epsilon, delta, updates)  # refuses a bad ε or δ before anything is written
    gauss = next(iter(cfgs.values()))
    budget_eps, budget_delta = 1.5 * epsilon, 1.5 * delta
    out = fresh_out(out)
    data = digits.load()
    url = f"sqlite:///{os.path.abspath(out)}/ledger.db"
    _log(f"[1/5] digits: {len(data[1])} training / {len(data[3])} test images, "
         f"{digits.SPEC.dim} weights; ledger with {BLOCKS} client blocks (epsilon_g = "
         f"{budget_eps:g}, delta_g = {budget_delta:g} each) at {out}/ledger.db")
    ledger = open_ledger(url)
    ledger.create_stream("clients", epsilon_g=budget_eps, delta_g=budget_delta,
                         granularity=f"hash:client_id:{BLOCKS}:dnd-demo")
    ledger.add_blocks("clients", [BlockSpec(f"bucket-{i}", os.path.join(out, "clients", str(i)))
                                  for i in range(BLOCKS)])
    _log(f"[2/5] served run: gaussian unit, (epsilon, delta) = ({epsilon:g}, {delta:g}) per "
         f"update, one update per client, k = {K}, gamma = {gauss.gamma:.4g}, L2 clip "
         f"{gauss.l2_norm_clip:g} (step rule for {updates:,} updates); noise "
         f"std {gauss.sampler_std(digits.SPEC.dim):.4f} per weight")
    t = time.time()
    first = served_run(url, gauss, data, clients=served)
    _log(f"[3/5] {served} clients through the service ({time.time() - t:.0f}s): accepted "
         f"{first['accepted']}, rejected by the spam check {first['rejected']}; released "
         f"average's test accuracy {first['accuracy']:.3f}")
    _log(f"      a second update: refused: {first['refusal']}")
    second = served_run(url, gauss, data, clients=1, run_id="digits-2")
    _log(f"      second run granted: {second['granted']}")
    _log(f"[4/5] the long curve, in process, up to {updates:,} updates (fresh noise)")
    from sage_tfx.dnd.budget import client_epsilon
    passes = -(-updates // (len(data[1]) // CLIENT_ROWS))
    per_client = client_epsilon(gauss, digits.SPEC.dim, passes, delta)
    _log(f"      {updates:,} updates over {len(data[1]) // CLIENT_ROWS} clients = {passes:,} "
         f"passes each: per-client epsilon {per_client:,.0f}"
         f" at delta = {delta:g} (RDP, dp_accounting), beside epsilon = {epsilon:g} per update")
    runs = curves(data, cfgs, updates)
    charged = {b: {k: round(v, 12) for k, v in ledger.remaining("clients", b).items()}
               for b in (f"bucket-{i}" for i in range(BLOCKS))}
    spent = {b: (round(budget_eps - r["epsilon"], 9), round(budget_delta - r["delta"], 15))
             for b, r in charged.items()}
    _log(f"[5/5] (epsilon, delta) charged per block (ledger): {spent}")
    _log(f"      audit chain intact: {ledger.verify_audit().ok}")
    ledger.close()
    final = {label: c.test_accuracy[-1] for label, c in runs.items()}
    png = draw(runs, first, served, os.path.join(out, "dnd_demo.png")) if plot else None
    if png:
        _log(f"plot: {png}")
    return {"served": first, "second_granted": second["granted"], "final": final,
            "curves": {label: (c.updates, c.test_accuracy) for label, c in runs.items()},
            "spent": spent, "png": png}


def draw(runs: dict, first: dict, served: int, path: str) -> str:
    """Test accuracy against updates (log axis) per configuration, the served run's released
    model, and chance."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for label, c in runs.items():
        ax.plot(c.updates, c.test_accuracy, marker="o", ms=3, label=label,
                ls="--" if label.startswith("no noise") else "-")
    ax.plot([served], [first["accuracy"]], "k*", ms=11, label="served run (released model)")
    ax.axhline(0.1, color="grey", ls=":", label="chance (10 classes)")
    ax.set(xscale="log", xlabel="client updates", ylabel="test accuracy (averaged model)",
           ylim=(0, 1), title="Draw-and-Discard on digits, local DP per update")
    ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", default="out/dnd", help="output directory (recreated)")
    ap.add_argument("--served", type=int, default=2000,
                    help="clients sending one update each through the service")
    ap.add_argument("--updates", type=int, default=1_000_000,
                    help="updates of the in-process curve (>= 1000)")
    ap.add_argument("--epsilon", type=float, default=8.0, help="epsilon per update")
    ap.add_argument("--delta", type=float, default=1e-6, help="delta per update")
    return timed_main(ap, argv, lambda a: run(a.out, served=a.served, updates=a.updates,
                                              epsilon=a.epsilon, delta=a.delta))


if __name__ == "__main__":
    raise SystemExit(main())
