"""The DP sample-complexity profiler (PTK paper §5.2, Fig. 3).

For one PTK, one training budget ε_train and one estimation budget ε (Fig. 3's ε):

* T = ⌊log2 n_max⌋, δ*_n = sqrt(ln(100 T) / (2 n)), m = ⌈2 (τ⁻² + (ε τ)⁻¹) ln(100 T)⌉;
* draw a validation set V_m; for j = 0..T: n = 2^j, draw a fresh S_n, f_n = ERM(S_n),
  f'_n = train_dp(S_n, ε_train); L_n = R_n(f_n) - δ*_n + Lap(1/(ε n)) - ln(2T)/(ε n);
  U_n = R^val_m(f'_n) + Lap(1/(ε m)) + τ/4; return n if U_n ≤ 2τ; return "R* > τ" if L_n > τ.

Privacy statement. As printed, Fig. 3 runs ERM, EM and the L_n release on the same S_n, and
the paper states the whole procedure is max{ℰ + ε, J ε}-DP — more than ℰ for any ε > 0, so a
profile could not be charged to blocks whose cap is ℰ. We apply the modification the paper
names ("using different iid samples in Steps 3 and 4"): train_dp runs on S_n and the ERM / L_n
release on a disjoint S'_n of the same size. All of V_m, S_n, S'_n are disjoint record sets:

* a record of S_n is in one train_dp call: its declared (ε_train, δ_train);
* a record of S'_n is in one Laplace release of R_n(f_n) with scale 1/(ε n): sensitivity 1/n
  for [0, 1] losses because f_n is the exact ERM (min over F of an average moves by ≤ 1/n), ε;
* a record of V_m is in at most T + 1 Laplace releases of R^val_m with scale 1/(ε m): (T + 1) ε
  (the paper writes J ≤ log2 n_max, but j runs over 0..⌊log2 n_max⌋, so up to T + 1 steps).

By parallel composition one menu entry is (max(ε_train, ε, (T + 1) ε), δ_train)-DP, and a menu
profiled on disjoint slices costs the maximum over entries (:func:`profile_cost`), which the
store charges to the profile blocks before it reads them. A PTK type with no exact ERM gets no
lower bound (no S'_n, no L_n release; it can then never be declared "R* > τ").
"""
from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from typing import Optional, Sequence

import numpy as np

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ptk.abstraction import PTKType, batches_of, hash_positions, record_keys

FOUND, ABOVE_TARGET, EXHAUSTED = "found", "above_target", "exhausted"


@dataclasses.dataclass(frozen=True)
class ProfileParams:
    """Fig. 3's inputs besides the PTK: ε (estimation budget), n_max, and τ."""

    epsilon: float
    n_max: int
    tau: float

    def __post_init__(self):
        if not (isinstance(self.epsilon, (int, float)) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise InvalidPrivacyParameterError(
                f"profiler epsilon must be > 0, got {self.epsilon!r}")
        if not isinstance(self.n_max, int) or self.n_max < 2:
            raise InvalidRequestError(f"n_max must be an integer >= 2, got {self.n_max!r}")
        if not (isinstance(self.tau, (int, float)) and 0 < self.tau <= 1):
            raise InvalidRequestError(f"tau must lie in (0, 1], got {self.tau!r}")
        self.m  # noqa: B018 - refuses a tau or epsilon whose validation set cannot exist


    @property
    def T(self) -> int:  # noqa: N802 - the paper's name
        """Number of doubling steps, ⌊log2 n_max⌋ (Fig. 3's T)."""
        return int(math.floor(math.log2(self.n_max)))

    @property
    def m(self) -> int:
        """Size of the validation set V_m (Fig. 3's m). Raises InvalidRequestError if unbounded."""
        t = self.tau
        try:
            m = 2 * (t ** -2 + 1 / (self.epsilon * t)) * math.log(100 * self.T)
        except (OverflowError, ZeroDivisionError):
            m = math.inf
        if not m < 2 ** 53:
            raise InvalidRequestError(
                f"tau={t!r} with profiler epsilon={self.epsilon!r} needs a validation set of "
                f"{m:.3g} records (Fig. 3's m): no profile can hold it")
        return int(math.ceil(m))

    def delta_star(self, n: int) -> float:
        """The confidence radius δ*_n = sqrt(ln(100 T) / (2 n)) at n samples."""
        return math.sqrt(math.log(100 * self.T) / (2 * n))

    def records_needed(self, with_erm: bool = True) -> int:
        """Records one menu entry reads: V_m, S_1 … S_{2^T} and (with an ERM) S'_1 … S'_{2^T}."""
        return self.m + (2 ** (self.T + 1) - 1) * (2 if with_erm else 1)


@dataclasses.dataclass(frozen=True)
class ProfileStep:
    """One profiling step: n and the loss bounds found there."""

    n: int
    lower: Optional[float]
    upper: float


@dataclasses.dataclass(frozen=True)
class MenuEntry:
    """One (ε_j, n_j) option: n_j is None when the profile did not reach τ."""

    epsilon: float
    delta: float
    n: Optional[int]
    outcome: str
    steps: tuple = ()


def profile_cost(ptk_type: PTKType, config: dict, menu_eps: Sequence[float],
                 params: ProfileParams) -> tuple[Decimal, float]:
    """The (ε, δ) one profile of ``menu_eps`` costs the profile records (module docstring)."""
    worst, delta = Decimal(0), 0.0
    e = Decimal(repr(float(params.epsilon)))
    for eps in menu_eps:
        charge = ptk_type.charge(eps, config)
        worst = max(worst, Decimal(repr(float(charge.epsilon))), e * (params.T + 1))
        delta = max(delta, charge.delta)
    return worst, delta


def _risk_sum(ptk_type, columns, state, config, n: int) -> float:
    """Σ losses / n with the FIXED public size n (not the slice's random size): adding or
    removing one record moves it by at most 1/n, also for min_f (the ERM's risk)."""
    losses = ptk_type.eval(batches_of(columns), state, config=config)
    return float(losses.sum()) / n


def _slice_index(u: np.ndarray, sizes: Sequence[int], expected_rows: float) -> list:
    bounds = np.cumsum(sizes) / expected_rows
    lo = np.r_[0.0, bounds[:-1]]
    return [np.flatnonzero((u >= a) & (u < b)) for a, b in zip(lo, bounds)]


def profile_entry(ptk_type: PTKType, config: dict, data: dict, epsilon_train: float,
                  params: ProfileParams, noise=None, positions: Optional[np.ndarray] = None,
                  expected_rows: Optional[float] = None, start: int = 0) -> MenuEntry:
    """Runs Fig. 3 for one ε_train on ``data`` (a dict of columns), doubling n from 2^start
    (:func:`profile_menu` starts where a larger budget's search stopped; a start past T reads
    nothing and releases nothing).

    The samples V_m, S_n and S'_n are not positional slices: each record goes to a slice by its
    own hash position in [0, 1) (``positions``; default a salted SHA-256 of the record's
    values), with slice widths size / ``expected_rows`` (a public count, default ``len(data)``).
    Adding or removing one record therefore changes exactly one slice — the disjointness the
    parallel composition of the privacy statement needs; positional slicing would shift every
    later slice. Slice sizes are then random with the right means (n, m); every released risk
    divides by the fixed n or m.
    """
    noise = noise or dp_noise.SECURE
    charge = ptk_type.charge(epsilon_train, config)
    rows = len(next(iter(data.values()))) if data else 0
    expected_rows = float(rows if expected_rows is None else expected_rows)
    with_erm = ptk_type.has_erm
    if expected_rows < params.records_needed(with_erm):
        raise InvalidRequestError(
            f"the profile slice has {expected_rows:.0f} records; Fig. 3 with m={params.m}, "
            f"n_max={params.n_max} needs {params.records_needed(with_erm)}")
    u = (hash_positions(record_keys(data), "ptk-profile") if positions is None
         else np.asarray(positions, dtype=float))
    eps, tau, T, m = params.epsilon, params.tau, params.T, params.m
    sizes = [m]
    for j in range(T + 1):
        sizes += [2 ** j, 2 ** j] if with_erm else [2 ** j]
    index = _slice_index(u, sizes, expected_rows)
    take = lambda idx: {k: np.asarray(v)[idx] for k, v in data.items()}  # noqa: E731
    val = take(index[0])
    steps = []
    per_step = 2 if with_erm else 1
    for j in range(start, T + 1):
        n = 2 ** j
        s_n = take(index[1 + per_step * j])
        private = ptk_type.train_dp(batches_of(s_n), epsilon_train, None, None, config=config,
                                    noise=noise)
        lower = None
        if with_erm:
            s2_n = take(index[2 + per_step * j])
            erm_state = ptk_type.erm(batches_of(s2_n), config=config)
            lower = (float(noise.laplace(_risk_sum(ptk_type, s2_n, erm_state, config, n),
                                         1 / (eps * n)))
                     - params.delta_star(n) - math.log(2 * T) / (eps * n))
        upper = float(noise.laplace(_risk_sum(ptk_type, val, private, config, m),
                                    1 / (eps * m))) + tau / 4
        steps.append(ProfileStep(n, lower, upper))
        if upper <= 2 * tau:
            return MenuEntry(epsilon_train, charge.delta, n, FOUND, tuple(steps))
        if lower is not None and lower > tau:
            return MenuEntry(epsilon_train, charge.delta, None, ABOVE_TARGET, tuple(steps))
    return MenuEntry(epsilon_train, charge.delta, None, EXHAUSTED, tuple(steps))


def profile_menu(ptk_type: PTKType, config: dict, data: dict, menu_eps: Sequence[float],
                 params: ProfileParams, noise=None) -> list[MenuEntry]:
    """Profiles every ε_j of the menu on its own disjoint share of ``data`` (shares and slices
    by record hash, see :func:`profile_entry`), so the cost is :func:`profile_cost`, the
    maximum over entries, not the sum.

    The menu is monotone in ε by construction: a larger budget never needs more samples.
    Searched independently, each entry is one noisy witness (one DP training run per n that
    lands under 2τ or not), so a lucky run at a small ε could report fewer samples than an
    unlucky one at a larger ε (a profiled menu read [(0.1, 4), (0.25, 256), (0.5, 1)]). The
    budgets are therefore searched from the largest down, each smaller ε doubling n from where
    the largest found n so far stopped: a smaller budget's answer is at least every larger
    one's. If a larger budget reaches no n ≤ n_max (EXHAUSTED), no smaller one is searched
    (EXHAUSTED too, nothing read). An ABOVE_TARGET entry (its ERM lower bound exceeded τ: a
    noisy claim about R*, false with probability up to about 1/(4T) per step) ends only that
    entry, as in Fig. 3 per entry; the smaller budgets go on from the same start. Starting
    later only drops steps (fewer releases on V_m, never more), so the privacy statement and
    :func:`profile_cost` are unchanged; the released entries stay in the order of ``menu_eps``."""
    if not menu_eps or len(set(menu_eps)) != len(menu_eps):
        raise InvalidRequestError(f"the epsilon menu must be non-empty and distinct: {menu_eps!r}")
    need = params.records_needed(ptk_type.has_erm)
    rows = len(next(iter(data.values()))) if data else 0
    J = len(menu_eps)
    if rows < need * J:
        raise InvalidRequestError(
            f"profiling {J} budgets needs {need * J} records "
            f"({need} each), the profile set has {rows}")
    u = hash_positions(record_keys(data), "ptk-profile")
    share = np.minimum((u * J).astype(int), J - 1)
    out: dict = {}
    start, stop = 0, None
    for i in sorted(range(J), key=lambda i: -menu_eps[i]):
        eps = menu_eps[i]
        if stop is not None:
            out[i] = MenuEntry(eps, ptk_type.charge(eps, config).delta, None, stop)
            continue
        mine = np.flatnonzero(share == i)
        part = {k: np.asarray(v)[mine] for k, v in data.items()}
        entry = profile_entry(ptk_type, config, part, eps, params, noise,
                              positions=u[mine] * J - i, expected_rows=rows / J, start=start)
        out[i] = entry
        if entry.outcome == FOUND:
            start = int(entry.n).bit_length() - 1
        elif entry.outcome == EXHAUSTED:
            stop = EXHAUSTED
    return [out[i] for i in range(J)]
