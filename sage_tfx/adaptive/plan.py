"""A pipeline run's privacy plan: what each DP stage will spend, charged once by the gate.

Sage List. 1 / §3.1: a training pipeline is DP as a whole — its DP Transform analyzers, its DP
training and its DP validation all read the same granted blocks, so their costs compose and the
gate charges the composition once, before any data is released. Each DP component then reads
*its own part* of the plan from the grant artifact and calibrates its noise to exactly that part.

A part's cost is an (ε, δ) pair (``basic`` streams) or a dp_accounting ``DpEvent`` (``rdp``
streams). Well-known part names: ``transform``, ``train``, ``validate``.

In ``basic`` mode the plan's cost is the exact decimal sum of the parts (basic composition); in
``rdp`` mode it is the ``ComposedDpEvent`` of the parts' events. :func:`check_grant_matches`
re-derives that cost and compares it with what the ledger charged, so a component never runs on
a plan that differs from the charge.

A DP-SGD part in ``rdp`` mode is the Poisson-sampled Gaussian event itself (sampling
probability, noise multiplier and steps fixed up front, independent of the dataset size); in
``basic`` mode it is an (ε, δ) share and the trainer calibrates the noise multiplier from the real
number of examples (:mod:`sage_tfx.dp.dpsgd`).
"""
from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any, Optional

import dp_accounting
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.ledger import accounting
from sage_tfx.errors import AccountingModeError, InvalidRequestError, MissingGrantError

TRANSFORM = "transform"
TRAIN = "train"
VALIDATE = "validate"


@dataclasses.dataclass(frozen=True)
class PlanPart:
    """One DP stage's cost: (epsilon, delta) in basic mode, or a DpEvent in rdp mode."""

    name: str
    epsilon: Optional[float] = None
    delta: Optional[float] = None
    event: Optional[dp_event_lib.DpEvent] = None
    params: tuple = ()  # (key, value) pairs for the stage, e.g. (("batch_size", 256),)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InvalidRequestError(f"a plan part needs a name, got {self.name!r}")
        if self.event is None:
            if self.epsilon is None:
                raise InvalidRequestError(f"plan part {self.name!r} needs epsilon or a DpEvent")
            accounting.check_epsilon(self.epsilon, f"{self.name}.epsilon")
            if self.delta is None:
                object.__setattr__(self, "delta", 0.0)  # pure ε-DP: an explicit δ of zero
            accounting.check_delta(self.delta, f"{self.name}.delta")
        else:
            if self.epsilon is not None or self.delta is not None:
                raise InvalidRequestError(
                    f"plan part {self.name!r}: give (epsilon, delta) or a DpEvent, not both")
            accounting.check_event(self.event)

    @property
    def mode(self) -> str:
        """``rdp`` if the part is a DpEvent, else ``basic``."""
        return accounting.RDP if self.event is not None else accounting.BASIC

    def param(self, key: str, default: Any = None) -> Any:
        """The stage parameter ``key`` (from ``params``), or ``default``."""
        return dict(self.params).get(key, default)

    def to_dict(self) -> dict:
        """A JSON-able dict of the part (the event serialized by the ledger's accounting)."""
        return {"name": self.name, "epsilon": self.epsilon,
                "delta": self.delta,
                "event": accounting.event_to_dict(self.event) if self.event is not None else None,
                "params": [list(p) for p in self.params]}

    @classmethod
    def from_dict(cls, d: dict) -> "PlanPart":
        """Inverse of :meth:`to_dict`."""
        return cls(d["name"], d.get("epsilon"), d.get("delta"),
                   accounting.event_from_dict(d["event"]) if d.get("event") else None,
                   tuple(tuple(p) for p in d.get("params", ())))


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """The parts a pipeline run will spend; all in one accounting mode."""

    parts: tuple[PlanPart, ...]

    def __post_init__(self):
        if not self.parts:
            raise InvalidRequestError("a privacy plan needs at least one part")
        names = [p.name for p in self.parts]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"plan part names must be distinct: {names}")
        modes = {p.mode for p in self.parts}
        if len(modes) != 1:
            raise AccountingModeError("a plan mixes (epsilon, delta) parts and DpEvent parts")

    @classmethod
    def of(cls, *parts: PlanPart) -> "PrivacyPlan":
        """The plan of ``parts``, in order."""
        return cls(tuple(parts))

    @property
    def mode(self) -> str:
        """The accounting mode all parts share."""
        return self.parts[0].mode

    def part(self, name: str) -> PlanPart:
        """The named part. Raises MissingGrantError if the plan has none (the stage may not run)."""
        for p in self.parts:
            if p.name == name:
                return p
        raise MissingGrantError(
            f"the privacy plan has no {name!r} part (parts: "
            f"{', '.join(p.name for p in self.parts)});"
            f" the {name} stage cannot run without budget charged for it")

    def cost(self) -> dict:
        """What the gate charges: ``{"epsilon", "delta"}`` (basic) or ``{"event"}`` (rdp)."""
        if self.mode == accounting.BASIC:
            eps = sum((accounting.exact(p.epsilon) for p in self.parts), Decimal(0))
            dlt = sum((accounting.exact(p.delta or 0.0) for p in self.parts), Decimal(0))
            return {"epsilon": float(eps), "delta": float(dlt)}
        events = [p.event for p in self.parts]
        return {"event": events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)}

    def to_json(self) -> str:
        """Canonical JSON of the plan (sorted keys), as the gate's exec property carries it."""
        return json.dumps({"parts": [p.to_dict() for p in self.parts]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PrivacyPlan":
        """Inverse of :meth:`to_json`."""
        return cls(tuple(PlanPart.from_dict(d) for d in json.loads(text)["parts"]))


def check_grant_matches(plan: PrivacyPlan, grant: Any) -> None:
    """Raises MissingGrantError unless ``grant`` charged exactly the plan's cost.

    Args:
      plan: the run's plan.
      grant: a ``sage_tfx.ledger.Grant`` (or anything with epsilon, delta, event, status).
    """
    if getattr(grant, "status", None) != "released":
        raise MissingGrantError(f"grant is {getattr(grant, 'status', None)!r}, not released")
    cost = plan.cost()
    if plan.mode == accounting.BASIC:
        if grant.event is not None or grant.epsilon is None:
            raise MissingGrantError("the grant charged a DpEvent but the plan is (epsilon, delta)")
        ok = (accounting.exact(grant.epsilon) == accounting.exact(cost["epsilon"])
              and accounting.exact(grant.delta or 0.0) == accounting.exact(cost["delta"]))
        charged = f"epsilon={grant.epsilon}, delta={grant.delta}"
    else:
        ok = grant.event is not None and (accounting.event_to_json(grant.event)
                                          == accounting.event_to_json(cost["event"]))
        charged = accounting.event_to_json(grant.event) if grant.event is not None else "nothing"
    if not ok:
        raise MissingGrantError(
            f"the grant charged {charged}, but the privacy plan costs {cost}: refusing to run a "
            "stage whose budget was not charged")
