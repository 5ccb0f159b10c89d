"""The Draw-and-Discard run of DnDTrainer, without TFX: settings, cost, clients, the protocol.

* :class:`FeatureSpec`: a feature's public bounds (from the schema) and its tf.Example type.
* :class:`RunSettings`: the run's Alg. 1 / Alg. 2 parameters; :func:`dnd_train_part` is the
  plan part the gate charges for them, :func:`check_train_cost` refuses any other charge.
* :func:`make_clients`: a privacy unit's examples become ⌈n_u / N_c⌉ clients of at most N_c
  examples (never mixing units); a unit takes part in exactly ``passes`` updates in all, one per
  pass, with client ``p mod #clients`` of the unit in pass p. One update is ε-DP for the unit's
  whole data (the adjacency of :mod:`sage_tfx.dnd.client` is a client's whole local data set,
  here a subset of one unit's), so a unit costs ``passes`` updates however many examples it has.
* :func:`run_protocol`: Alg. 2 over those clients, in-process, under a :class:`RunBudget`.
"""
from __future__ import annotations

import dataclasses
import secrets
from typing import Optional, Sequence

import numpy as np

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.dnd import ClientConfig, DnDState, FeatureBounds, GLMSpec, SpamCheck, client_update, \
    initial_instances
from sage_tfx.dnd.budget import RunBudget, run_delta, run_epsilon, run_event
from sage_tfx.dnd.client import check_update_matches_ledger_epsilon
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import accounting

SERVED_FAMILIES = ("logistic", "linear", "poisson")  # one prediction per example
DTYPES = ("float", "int")


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One model feature: its tf.Example key, public bounds and stored type (``float``/``int``)."""

    key: str
    lower: float
    upper: float
    dtype: str = "float"

    def __post_init__(self):
        if not isinstance(self.key, str) or not self.key:
            raise InvalidRequestError("a feature needs a non-empty key")
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"feature {self.key!r}: dtype must be one of {DTYPES}")
        FeatureBounds.of([self.lower], [self.upper])

    @property
    def midpoint(self) -> float:
        return 0.5 * (float(self.lower) + float(self.upper))


def features_from_json(text: str) -> list[FeatureSpec]:
    import json
    try:
        items = json.loads(text or "[]")
        feats = [
            FeatureSpec(d["key"], float(d["lower"]), float(d["upper"]), d.get("dtype", "float"))
                 for d in items]
    except (TypeError, KeyError, ValueError) as exc:
        raise InvalidRequestError(
            f"features must be a JSON list of {{key, lower, upper, dtype}}: {exc}")
    if not feats or len({f.key for f in feats}) != len(feats):
        raise InvalidRequestError("features must be a non-empty list of distinct keys")
    return feats


def features_to_json(features: Sequence[FeatureSpec]) -> str:
    import json
    return json.dumps([dataclasses.asdict(f) for f in features])


def bounds_of(features: Sequence[FeatureSpec]) -> FeatureBounds:
    return FeatureBounds.of([f.lower for f in features], [f.upper for f in features])


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A DnDTrainer run: the model, Alg. 1's client and Alg. 2's server parameters.

    ``unit="gaussian"`` needs ``delta`` (δ per update) and ``l2_norm_clip`` (C₂), and then ignores
    ``l1_norm_clip``; the Laplace units (``model``, ``feature``) refuse both
    (:class:`~sage_tfx.dnd.client.ClientConfig`).
    """

    family: str
    n_features: int
    k: int
    gamma: float
    l1_norm_clip: float
    epsilon: float
    unit: str = "model"
    passes: int = 1
    n_c: int = 1
    delta: Optional[float] = None
    l2_norm_clip: Optional[float] = None

    def __post_init__(self):
        if self.family not in SERVED_FAMILIES:
            raise InvalidRequestError(f"family must be one of {SERVED_FAMILIES} (one served "
                                      f"prediction per example), got {self.family!r}")
        for name in ("k", "passes", "n_c"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequestError(f"{name} must be an integer >= 1, got {v!r}")
        if self.epsilon is None:
            raise InvalidRequestError("a DnDTrainer run must add noise: epsilon is required")
        self.client  # validates gamma, the clips, epsilon, delta and unit

    @property
    def spec(self) -> GLMSpec:
        return GLMSpec(self.family, self.n_features)

    @property
    def client(self) -> ClientConfig:
        def opt(v):
            return None if v is None else float(v)
        return ClientConfig(gamma=float(self.gamma), l1_norm_clip=float(self.l1_norm_clip),
                            epsilon=float(self.epsilon), unit=self.unit, delta=opt(self.delta),
                            l2_norm_clip=opt(self.l2_norm_clip))


def dnd_train_part(settings: RunSettings, *, rdp: bool = False) -> plan_lib.PlanPart:
    """The ``train`` plan part of a run: ``passes × (ε_update, δ_update)`` (δ = 0 for the Laplace
    units) or the composed event of :func:`sage_tfx.dnd.budget.run_event` (Laplace, or
    ``GaussianDpEvent(m)`` for the gaussian unit) — what the served path charges
    (:func:`sage_tfx.dnd.budget.request_run`), fixed before any data is read."""
    dim = settings.spec.dim
    if rdp:
        return plan_lib.PlanPart(plan_lib.TRAIN,
                                 event=run_event(settings.client, dim, settings.passes))
    return plan_lib.PlanPart(plan_lib.TRAIN,
                             epsilon=run_epsilon(settings.client, dim, settings.passes),
                             delta=run_delta(settings.client, dim, settings.passes))


def check_train_cost(epsilon: Optional[float], delta: Optional[float], event, settings: RunSettings,
                     what: str) -> dict:
    """Refuses unless (epsilon, delta) / event is exactly what the run spends; returns the charge.

    Raises:
      MissingGrantError: a charge that differs (more or less) from the run's cost.
    """
    dim = settings.spec.dim
    if event is None:
        need = run_epsilon(settings.client, dim, settings.passes)
        need_delta = run_delta(settings.client, dim, settings.passes)
        if (epsilon is None or accounting.exact(epsilon) != accounting.exact(need)
                or accounting.exact(delta or 0.0) != accounting.exact(need_delta)):
            raise MissingGrantError(
                f"{what} charged epsilon={epsilon}, delta={delta}; this run spends "
                f"epsilon={need}, delta={need_delta} ({settings.passes} pass(es) x "
                f"({settings.client.update_epsilon(dim)}, {settings.client.update_delta(dim)}) "
                "per update)")
        return {"epsilon": need, "delta": need_delta}
    need_json = accounting.event_to_json(run_event(settings.client, dim, settings.passes))
    if accounting.event_to_json(event) != need_json:
        raise MissingGrantError(f"{what} charged {accounting.event_to_json(event)}; this run "
                                f"spends {need_json}")
    return {"event": accounting.event_to_dict(event)}


def make_clients(units: Sequence, n_c: int, rng) -> dict:
    """{unit: [index arrays of its clients]}: each unit's rows, shuffled, cut into ⌈n_u/N_c⌉
    clients of at most N_c rows. ``units`` is the unit of every row."""
    by_unit: dict = {}
    for i, u in enumerate(units):
        by_unit.setdefault(u, []).append(i)
    out = {}
    for u, rows in by_unit.items():
        rows = list(rows)
        rng.shuffle(rows)
        out[u] = [np.asarray(rows[j:j + n_c]) for j in range(0, len(rows), n_c)]
    return out


@dataclasses.dataclass(frozen=True)
class ProtocolResult:
    weights: np.ndarray
    updates: int
    accepted: int
    rejected_spam: int
    units: int


def run_protocol(settings: RunSettings, x: np.ndarray, y: np.ndarray, units: Sequence,
                 budget: RunBudget, *, spam_check: bool = True, rng=None,
                 noise=None) -> ProtocolResult:
    """Alg. 2 in-process: every unit sends one update per pass (order shuffled per pass).

    Args:
      x: features (n, p) already mapped to [0, 1] with the public bounds (:func:`bounds_of`).
      budget: admits each (unit, pass) draw; refuses beyond the grant's passes.
      rng: server coins (CSPRNG unless a test injects a seeded ``random.Random``).
      noise: client noise (the unit's float-safe sampler unless an experiment injects a seeded
        source; never in a component).
    """
    spec, config = settings.spec, settings.client
    check_update_matches_ledger_epsilon(config, spec.dim)
    if len(x) == 0:
        raise InvalidRequestError("the granted window holds no examples")
    rng = rng if rng is not None else secrets.SystemRandom()
    clients = make_clients(units, settings.n_c, rng)
    check = SpamCheck.for_config(config) if spam_check and settings.k >= 2 else None
    inst = initial_instances(np.zeros(spec.dim), settings.k, config.noise_variance,
                             rng=None if isinstance(rng, secrets.SystemRandom) else
                             np.random.default_rng(rng.getrandbits(64)))
    state = DnDState(inst, spam_check=check, rng=rng)
    order = list(clients)
    updates = 0
    for p in range(settings.passes):
        rng.shuffle(order)
        for u in order:
            budget.admit(str(u), list(budget.blocks))
            rows = clients[u][p % len(clients[u])]
            ticket, w = state.draw()
            state.discard(ticket, client_update(spec, w, x[rows], y[rows], config, noise=noise))
            updates += 1
    return ProtocolResult(state.average(), updates, state.accepted, state.rejected, len(order))
