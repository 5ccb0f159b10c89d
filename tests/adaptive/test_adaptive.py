"""Privacy-adaptive training (Sage §3.3): the even allocator, the conserve / aggressive search."""
import math

import dp_accounting
import pytest

from sage_tfx.adaptive import (AGGRESSIVE, FCFS, UNITS_PER_BLOCK, AdaptiveSearch, AllocationError,
                               Allocator, IterationPlan, SearchConfig, conserve_waste_bound)
from sage_tfx.errors import AccountingModeError, InvalidRequestError, GrantStateError
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.dp.mechanisms import analytic_gaussian_sigma
from sage_tfx.dp.validation import Outcome

UNIT = 1.0 / UNITS_PER_BLOCK


@pytest.fixture
def ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.create_stream("r", epsilon_g=1.0, delta_g=1e-6, mode="rdp")
    yield led
    led.close()


def _add(led, alloc, ids, stream="s"):
    led.add_blocks(stream, [BlockSpec(b, f"/store/{b}", records=100) for b in ids])
    alloc.add_blocks(ids)


def _plan(pid, k, blocks, eps, delta=0.0):
    return IterationPlan(pid, k, f"{pid}.manual{k}", tuple(blocks), eps, delta, None, eps)


def _gaussian(delta):
    return lambda eps: dp_accounting.GaussianDpEvent(analytic_gaussian_sigma(eps, delta))


# --- allocator --------------------------------------------------------------------------------


def test_new_block_is_divided_evenly_among_waiting_pipelines(ledger):
    alloc = Allocator(ledger, "s")
    for pid in ("p1", "p2", "p3"):
        alloc.admit(pid)
    _add(ledger, alloc, ["b0"])
    shares = [alloc.allocation(p)["b0"] for p in ("p1", "p2", "p3")]
    assert all(math.isclose(x, 1 / 3, abs_tol=2 * UNIT) for x in shares)
    assert math.fsum(shares) == pytest.approx(1.0, abs=1e-15)
    assert alloc.unallocated() == {}
    alloc.admit("p4")  # a later arrival gets nothing of b0 ...
    _add(ledger, alloc, ["b1"])  # ... and a quarter of b1
    assert "b0" not in alloc.allocation("p4")
    assert all(alloc.allocation(p)["b1"] == pytest.approx(0.25) for p in ("p1", "p2", "p3", "p4"))


def test_budget_nobody_waited_for_goes_to_the_next_arrivals(ledger):
    alloc = Allocator(ledger, "s")
    _add(ledger, alloc, ["b0", "b1"])
    assert alloc.unallocated() == {"b0": 1.0, "b1": 1.0}
    alloc.admit("p1")
    assert alloc.allocation("p1") == {"b0": 1.0, "b1": 1.0}
    assert alloc.unallocated() == {}


def test_accept_returns_unused_allocation_evenly_to_the_still_waiting(ledger):
    alloc = Allocator(ledger, "s")
    searches = [AdaptiveSearch(alloc, p, SearchConfig(epsilon0=0.125)) for p in ("p1", "p2", "p3")]
    _add(ledger, alloc, ["b0"])
    plan, _ = searches[0].start(now=0)
    assert (plan.blocks, plan.epsilon) == (("b0",), 0.125)
    assert alloc.allocation("p1")["b0"] == pytest.approx(1 / 3 - 0.125)
    searches[0].report(Outcome.ACCEPT, now=0)
    assert alloc.waiting() == ("p2", "p3")
    for p in ("p2", "p3"):
        assert alloc.allocation(p)["b0"] == pytest.approx(1 / 3 + (1 / 3 - 0.125) / 2)
    assert alloc.block_total("b0") == pytest.approx(1 - 0.125)
    assert alloc.problems() == []


def test_reject_and_timeout_also_return_the_allocation(ledger):
    alloc = Allocator(ledger, "s")
    a = AdaptiveSearch(alloc, "a", SearchConfig(epsilon0=0.1, timeout=5))
    b = AdaptiveSearch(alloc, "b", SearchConfig(epsilon0=0.1))
    _add(ledger, alloc, ["b0"])
    assert not a.check_timeout(4) and a.check_timeout(5)
    assert a.outcome == Outcome.TIMEOUT and a.records == ()
    assert alloc.allocation("b") == {"b0": 1.0}
    b.start(now=6)
    b.report(Outcome.REJECT, now=6)
    assert alloc.waiting() == () and alloc.unallocated() == {"b0": pytest.approx(0.9)}


def test_charge_above_allocation_is_refused_before_the_ledger(ledger):
    alloc = Allocator(ledger, "s")
    alloc.admit("p1")
    alloc.admit("p2")
    _add(ledger, alloc, ["b0"])
    with pytest.raises(AllocationError, match="less allocated"):
        alloc.charge("p1", _plan("p1", 0, ["b0"], 0.6))
    assert ledger.grants("s") == []
    with pytest.raises(AllocationError, match="not waiting"):
        alloc.charge("nobody", _plan("nobody", 0, ["b0"], 0.1))


def test_allocations_never_exceed_what_the_ledger_has_left(ledger):
    alloc = Allocator(ledger, "s")
    searches = {p: AdaptiveSearch(alloc, p, SearchConfig(epsilon0=1 / 64)) for p in "abcde"}
    for step in range(12):
        _add(ledger, alloc, [f"b{step}"])
        if step == 3:
            searches["f"] = AdaptiveSearch(alloc, "f", SearchConfig(epsilon0=1 / 64))
        for pid, s in list(searches.items()):
            started = s.start(now=step)
            if started:
                # Accept whoever reached eps 1/8 on at least 2 blocks.
                plan = started[0]
                ok = plan.epsilon >= 0.125 and plan.window >= 2
                s.report(Outcome.ACCEPT if ok else Outcome.RETRY, now=step)
                if s.done:
                    del searches[pid]
        assert alloc.problems() == []
    assert ledger.check_consistency("s") == []
    for b in ledger.blocks("s"):
        assert b.epsilon_spent <= 1.0 and b.delta_spent <= 1e-6
        assert alloc.block_total(b.block_id) <= 1.0 - b.epsilon_spent + 1e-12


def test_charges_by_someone_else_are_caught_by_the_ledger_and_resynced(ledger):
    alloc = Allocator(ledger, "s")
    alloc.admit("p1")
    _add(ledger, alloc, ["b0"])
    assert ledger.request("s", run_id="outsider", blocks=["b0"], epsilon=0.7).granted
    assert alloc.problems()  # the allocator's view is stale ...
    d = alloc.charge("p1", _plan("p1", 0, ["b0"], 0.5))
    assert not d.granted and alloc.denials == 1  # ... the ledger refuses, nothing is charged
    assert alloc.problems() == []
    assert alloc.allocation("p1")["b0"] <= 0.3
    assert ledger.check_consistency("s") == []


def test_fcfs_pool_is_shared_first_come_first_served(ledger):
    alloc = Allocator(ledger, "s", policy=FCFS)
    first = AdaptiveSearch(alloc, "p1", SearchConfig(epsilon0=0.25, policy=AGGRESSIVE))
    second = AdaptiveSearch(alloc, "p2", SearchConfig(epsilon0=0.25, policy=AGGRESSIVE))
    _add(ledger, alloc, ["b0"])
    plan, _ = first.start(now=0)
    assert plan.epsilon == 1.0  # takes everything
    assert second.propose() is None


# --- the search -------------------------------------------------------------------------------


def test_conserve_doubles_epsilon_while_the_allocation_allows_then_the_window(ledger):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=0.125, min_blocks=1))
    AdaptiveSearch(alloc, "other", SearchConfig(epsilon0=0.125))  # halves every block
    _add(ledger, alloc, ["b0"])
    trail = []
    for step in range(6):
        if step:
            _add(ledger, alloc, [f"b{step}"])
        while (started := s.start(now=step)) is not None:
            plan = started[0]
            trail.append((step, plan.epsilon, plan.blocks))
            s.report(Outcome.ACCEPT if plan.window == 2 else Outcome.RETRY, now=step)
    assert trail == [
        (0, 0.125, ("b0",)),        # (ε0, min window)
        (0, 0.25, ("b0",)),         # RETRY: 2ε fits p's 0.5 on b0 (0.125 + 0.25 used)
        (1, 0.5, ("b1",)),          # 4ε fits no block until b1 brings a fresh 0.5
        (3, 0.5, ("b2", "b3")),     # 1.0 never fits: wait for 2 blocks affording 0.5
    ]
    assert s.outcome == Outcome.ACCEPT and s.finished_at == 3
    assert [r.outcome for r in s.records] == [Outcome.RETRY] * 3 + [Outcome.ACCEPT]
    assert [r.window for r in s.records] == [1, 1, 1, 2]


def test_conserve_epsilon_is_capped_at_max_epsilon(ledger):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=0.1, max_epsilon=0.3))
    _add(ledger, alloc, ["b0"])
    levels = []
    while (started := s.start(now=0)) is not None:
        levels.append(started[0].epsilon)
        s.report(Outcome.RETRY, now=0)
    assert levels == [0.1, 0.2]  # 0.4 > max_epsilon; b0 has 0.7 left but no second block


@pytest.mark.parametrize("lower_epsilon, expect", [(False, None), (True, (1 / 16, 16))])
def test_lower_epsilon_trades_epsilon_for_data_at_a_doubled_budget(ledger, lower_epsilon, expect):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=1 / 16, lower_epsilon=lower_epsilon))
    _add(ledger, alloc, ["b0"])
    while s.start(now=0) is not None:  # alone: climbs to ε = 1/2 on b0
        s.report(Outcome.RETRY, now=0)
    assert (s.epsilon, s.window) == (0.5, 1)
    for k in range(9):  # a crowd arrives: new blocks now give p a tenth each, never 1/2
        alloc.admit(f"crowd{k}")
    _add(ledger, alloc, [f"b{k}" for k in range(1, 17)])
    plan = s.propose()
    assert (None if plan is None else (plan.epsilon, plan.window)) == expect
    if plan is not None:  # the iteration's budget ε × window still doubled (1/2 × 1 -> 1/16 × 16)
        assert plan.epsilon * plan.window >= 2 * 0.5 * 1


def test_aggressive_spends_the_whole_allocation_on_its_window(ledger):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=0.01, policy=AGGRESSIVE))
    AdaptiveSearch(alloc, "q", SearchConfig(epsilon0=0.01))
    _add(ledger, alloc, ["b0"])
    plan, _ = s.start(now=0)
    assert plan.epsilon == 0.5 and plan.blocks == ("b0",)
    assert "b0" not in alloc.allocation("p")
    s.report(Outcome.RETRY, now=0)
    assert s.propose() is None  # needs twice the ε on one block or a 2-block window
    _add(ledger, alloc, ["b1", "b2"])
    plan = s.propose()
    assert plan.window == 2 and plan.epsilon == 0.5


def test_iteration_is_charged_before_its_data_is_released(ledger):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=0.25, delta=1e-8))
    _add(ledger, alloc, ["b0", "b1"])
    plan, grant = s.start(now=3, release=False)
    assert plan.blocks == ("b1",)  # the newest block(s)
    assert grant.status == "reserved"
    with pytest.raises(GrantStateError):
        grant.locations  # nothing to read before the gate releases it
    assert ledger.block("s", "b1").epsilon_spent == 0.25  # already charged
    released = ledger.release(grant.grant_id)
    assert released.locations == ("/store/b1",)
    record = s.report(Outcome.RETRY, now=4)
    assert (record.grant_id, record.run_id, record.blocks, record.epsilon, record.delta) == (
        grant.grant_id, "p.it0", ("b1",), 0.25, 1e-8)
    assert (record.charged_at, record.finished_at, record.cost) == (3.0, 4.0, 0.25)
    assert record.to_dict()["outcome"] == "RETRY"
    assert s.pending is None and s.records == (record,)
    with pytest.raises(AllocationError):
        s.report(Outcome.RETRY, now=5)


def test_abort_cancels_an_unreleased_reservation_and_refunds_it(ledger):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=0.25))
    other = AdaptiveSearch(alloc, "q", SearchConfig(epsilon0=0.25))
    _add(ledger, alloc, ["b0"])
    _, grant = s.start(now=0, release=False)
    s.abort(now=1)
    assert ledger.grant(grant.grant_id).status == "cancelled"
    assert ledger.block("s", "b0").epsilon_spent == 0.0
    assert s.outcome == Outcome.TIMEOUT
    assert alloc.allocation("q") == {"b0": 1.0}
    assert alloc.problems() == []
    assert other.propose() is not None


def test_rdp_stream_doubles_the_level_and_charges_its_event(ledger):
    alloc = Allocator(ledger, "r")
    assert alloc.reference_order == 40.0  # argmax cap(α)/α for ε_g = 1, δ_g = 1e-6
    event_for = _gaussian(1e-8)
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=1 / 16), event_for=event_for)
    _add(ledger, alloc, ["b0"], stream="r")
    costs = []
    for _ in range(3):
        plan, grant = s.start(now=0)
        assert plan.delta is None and plan.event == event_for(plan.epsilon)
        assert grant.event == plan.event
        costs.append(plan.cost)
        s.report(Outcome.RETRY, now=0)
    assert [r.epsilon for r in s.records] == [1 / 16, 1 / 8, 1 / 4]
    # Gaussian RDP ∝ 1/σ² ≈ ε²: doubling the level costs about 4x the block budget ...
    assert 3.5 < costs[1] / costs[0] < 4.5 and 3.5 < costs[2] / costs[1] < 4.5
    # ... and far less than basic composition would charge for the same levels.
    assert sum(costs) < 0.15 < 1 / 16 + 1 / 8 + 1 / 4
    assert ledger.check_consistency("r") == [] and alloc.problems() == []


def test_rdp_cost_is_sound_for_the_ledger_filter(ledger):
    alloc = Allocator(ledger, "r")
    event = dp_accounting.GaussianDpEvent(20.0)
    units = alloc.cost_units(event=event)
    alloc.admit("p")
    _add(ledger, alloc, ["b0"], stream="r")
    fits = UNITS_PER_BLOCK // units
    for k in range(fits):
        plan = IterationPlan("p", k, f"p.{k}", ("b0",), 1.0, None, event, units * UNIT)
        assert alloc.charge("p", plan).granted
    state = ledger.remaining("r", "b0")["headroom"]
    assert state[40.0] >= 0  # everything the allocator admitted fits at its reference order
    assert alloc.allocation("p").get("b0", 0.0) < units * UNIT
    assert any(h >= 0 for h in state.values())


def test_mode_mismatch_and_bad_configs_are_rejected(ledger):
    basic, rdp = Allocator(ledger, "s"), Allocator(ledger, "r")
    with pytest.raises(AccountingModeError):
        AdaptiveSearch(basic, "p", SearchConfig(epsilon0=0.1), event_for=_gaussian(1e-8))
    with pytest.raises(AccountingModeError):
        AdaptiveSearch(rdp, "p", SearchConfig(epsilon0=0.1))
    with pytest.raises(AccountingModeError):
        Allocator(ledger, "s", reference_order=32.0)
    with pytest.raises(InvalidRequestError):
        Allocator(ledger, "r", reference_order=2.0)  # cap(2) < 0
    AdaptiveSearch(basic, "p", SearchConfig(epsilon0=0.1))
    with pytest.raises(AllocationError):
        AdaptiveSearch(basic, "p", SearchConfig(epsilon0=0.1))


@pytest.mark.parametrize("kwargs", [
    {"epsilon0": 0.0}, {"epsilon0": float("nan")}, {"epsilon0": 0.1, "delta": 1.0},
    {"epsilon0": 0.1, "min_blocks": 0}, {"epsilon0": 0.1, "min_blocks": True},
    {"epsilon0": 0.5, "max_epsilon": 0.25}, {"epsilon0": 0.1, "policy": "greedy"},
    {"epsilon0": 0.1, "timeout": -1}, {"epsilon0": 0.1, "growth": 1},
])
def test_search_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        SearchConfig(**kwargs)


def test_waste_ratio_of_a_doubling_search_is_at_most_two(ledger):
    alloc = Allocator(ledger, "s")
    s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=1 / 64, min_blocks=2))
    _add(ledger, alloc, ["b0", "b1"])
    while (started := s.start(now=0)) is not None:
        s.report(Outcome.ACCEPT if started[0].epsilon >= 0.3 else Outcome.RETRY, now=0)
    assert s.epsilon == 0.5 and s.outcome == Outcome.ACCEPT
    assert conserve_waste_bound(s.records) <= 2.0
    assert s.budget_spent() == pytest.approx(2 * (1 / 64 + 1 / 32 + 1 / 16 + 1 / 8 + 1 / 4 + 1 / 2))
