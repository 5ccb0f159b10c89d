"""Per-block budget arithmetic of the two accounting modes (rules in
:mod:`sage_tfx.ledger.accounting`).

A block's spent budget is stored as text so nothing is rounded: ``basic`` streams keep the exact
decimal sums (ε, δ) of their charges; ``rdp`` streams keep the block's summed RDP curve on the
stream's order grid (JSON). This module holds every rule that depends on the mode — does a charge
fit, the state after a charge, when a block retires, how a denial is explained, and the state
recomputed from the grants — so the ledger's transactions stay mode-agnostic.
"""
from __future__ import annotations

import functools
import json
import math
from decimal import Decimal
from typing import Iterable, Optional, Sequence

from sage_tfx.ledger import accounting
from sage_tfx.ledger.values import Stream

# A block's derived state: (ε spent, δ spent, RDP curve, number of charges).
Derived = tuple[Decimal, Decimal, list, int]


def zero_curve(s: Stream) -> Optional[str]:
    """The stored RDP curve of a fresh block (None in basic mode)."""
    return json.dumps([0.0] * len(s.orders)) if s.mode == accounting.RDP else None


def reported(s: Stream, eps_text: str, delta_text: str, rdp_text: Optional[str],
             charges: int) -> tuple[float, float]:
    """(ε, δ) spent as reported: exact sums (basic) or dp_accounting's ε at δ_g (rdp)."""
    if s.mode == accounting.RDP:
        return (accounting.rdp_epsilon(json.loads(rdp_text), s.orders, s.delta_g),
                s.delta_g if charges else 0.0)
    return float(Decimal(eps_text)), float(Decimal(delta_text))


@accounting.in_ledger_context
def remaining(s: Stream, eps_text: str, delta_text: str, rdp_text: Optional[str]) -> dict:
    """What is left: (ε, δ) in basic mode, the per-order headroom under the filter in rdp."""
    if s.mode == accounting.BASIC:
        cap_e, cap_d = s.exact_caps
        return {"epsilon": float(cap_e - Decimal(eps_text)),
                "delta": float(cap_d - Decimal(delta_text))}
    spent = json.loads(rdp_text)
    return {"headroom": {a: cap - x for a, cap, x in zip(s.orders, s.caps, spent)}}


def fits(s: Stream, eps_text: str, delta_text: str, rdp_text: Optional[str],
         eps: Optional[Decimal], dlt: Optional[Decimal], charge: Optional[Sequence[float]]) -> bool:
    """Whether a block with this spent state admits the charge (ε, δ) or RDP curve ``charge``."""
    if s.mode == accounting.BASIC:
        return _basic_fits(eps_text, delta_text, eps, dlt, *s.exact_caps)
    return accounting.rdp_fits(json.loads(rdp_text), charge, s.caps)


# Pure functions of their (hashable) arguments, memoized: the blocks of a request, and of a
# stream's busy region, mostly share a few spent states, so a request's 30 blocks cost a few
# decimal parses instead of 90.
@functools.lru_cache(maxsize=8192)
@accounting.in_ledger_context
def _basic_fits(eps_text: str, delta_text: str, eps: Decimal, dlt: Decimal, cap_e: Decimal,
                cap_d: Decimal) -> bool:
    return Decimal(eps_text) + eps <= cap_e and Decimal(delta_text) + dlt <= cap_d


@functools.lru_cache(maxsize=8192)
@accounting.in_ledger_context
def _basic_after(eps_text: str, delta_text: str, eps: Decimal, dlt: Decimal, retire: Decimal,
                 cap_e: Decimal) -> tuple[str, str, None, bool]:
    new_e = Decimal(eps_text) + eps
    return str(new_e), str(Decimal(delta_text) + dlt), None, new_e + retire <= cap_e


def retire_probe(s: Stream):
    """What decides retirement: the RDP curve of an ε=retire_epsilon Laplace charge (rdp mode),
    or retire_epsilon as an exact decimal (basic mode)."""
    if s.mode != accounting.RDP:
        return accounting.exact(s.retire_epsilon)
    return accounting.rdp_curve(accounting.laplace_event(s.retire_epsilon), s.orders)


def after_charge(s: Stream, eps_text: str, delta_text: str, rdp_text: Optional[str],
                 dec_cost: tuple[Optional[Decimal], Optional[Decimal]],
                 charge: Optional[Sequence[float]], probe
                 ) -> tuple[str, str, Optional[str], bool]:
    """The stored state after a charge, and whether the block still admits a retire_epsilon charge.

    Returns ``(eps_text, delta_text, rdp_text or None if unchanged, still_active)``.
    """
    if s.mode == accounting.BASIC:
        return _basic_after(eps_text, delta_text, dec_cost[0], dec_cost[1], probe,
                            s.exact_caps[0])
    curve = [x + c for x, c in zip(json.loads(rdp_text), charge)]
    return eps_text, delta_text, json.dumps(curve), accounting.rdp_fits(curve, probe, s.caps)


@accounting.in_ledger_context
def shortfall(s: Stream, short: Sequence[tuple[str, str, str]], eps: Optional[Decimal],
              dlt: Optional[Decimal]) -> str:
    """The denial reason for blocks ``(block_id, eps_text, delta_text)`` that do not fit."""
    names = ", ".join(b[0] for b in short[:5]) + (" ..." if len(short) > 5 else "")
    if s.mode == accounting.BASIC:
        worst = max(short, key=lambda b: (Decimal(b[1]), Decimal(b[2])))
        rem_e = s.exact_caps[0] - Decimal(worst[1])
        rem_d = s.exact_caps[1] - Decimal(worst[2])
        return (f"insufficient budget on {len(short)} block(s) ({names}): requested "
                f"epsilon={eps}, delta={dlt}; block {worst[0]} has epsilon={rem_e}, "
                f"delta={rem_d} left (short by epsilon={max(Decimal(0), eps - rem_e)}, "
                f"delta={max(Decimal(0), dlt - rem_d)})")
    return (f"insufficient budget on {len(short)} block(s) ({names}): the charge exceeds the "
            f"RDP cap at every order (epsilon_g={s.epsilon_g}, delta_g={s.delta_g})")


def fresh(s: Stream) -> Derived:
    """The derived state of a block never charged."""
    return Decimal(0), Decimal(0), [0.0] * len(s.orders), 0


@accounting.in_ledger_context
def derive(s: Stream, grants: Iterable[tuple]) -> dict[str, Derived]:
    """Every charged block's state recomputed from grant rows ``(ε, δ, event_json, blocks_json)``.
    """
    out: dict[str, Derived] = {}
    for e, d, ev, blocks in grants:
        curve = accounting.rdp_curve(accounting.event_from_json(ev), s.orders) if ev else None
        for b in json.loads(blocks):
            eps, dlt, acc, n = out.get(b) or fresh(s)
            if s.mode == accounting.BASIC:
                eps, dlt = eps + accounting.exact(e), dlt + accounting.exact(d)
            else:
                acc = [x + y for x, y in zip(acc, curve)]
            out[b] = (eps, dlt, acc, n + 1)
    return out


def stored(s: Stream, derived: Derived) -> tuple[str, str, Optional[str], int]:
    """A derived state as the stored ``(eps_text, delta_text, rdp_text, charges)``."""
    eps, dlt, curve, n = derived
    return str(eps), str(dlt), json.dumps(curve) if s.mode == accounting.RDP else None, n


def problems(s: Stream, label: str, cached: tuple[str, str, Optional[str], int],
             derived: Derived) -> list[str]:
    """Differences between a block's cached and derived state, and cap violations."""
    e, d, rdp, charges = cached
    eps, dlt, curve, n = derived
    out = []
    if s.mode == accounting.BASIC:
        if Decimal(e) != eps or Decimal(d) != dlt or charges != n:
            out.append(f"{label}: cached ({e}, {d}, {charges}) != derived ({eps}, {dlt}, {n})")
        if eps > s.exact_caps[0] or dlt > s.exact_caps[1]:
            out.append(f"{label}: over cap ({eps}, {dlt})")
        return out
    if charges != n or any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                           for a, b in zip(json.loads(rdp), curve)):
        out.append(f"{label}: cached RDP != derived RDP")
    if n and not any(x <= cap for x, cap in zip(curve, s.caps)):
        out.append(f"{label}: over the RDP cap at every order")
    return out
