"""The block ledger on SQLite and PostgreSQL: charging, denial, idempotency, bad input, audit."""

import dp_accounting
import pytest

from sage_tfx.ledger import accounting
from sage_tfx.errors import (AccountingModeError, GrantStateError, InvalidPrivacyParameterError,
                             InvalidRequestError, RetiredBlockError, UnknownBlockError,
                             UnknownStreamError)
from sage_tfx.ledger import BlockSpec, Grant, Window, open_ledger


def _blocks(n, prefix="d"):
    return [BlockSpec(f"{prefix}{i:03d}", f"/store/{prefix}{i:03d}", records=10) for i in range(n)]


@pytest.fixture
def ledger(ledger_url):
    led = open_ledger(ledger_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", _blocks(10))
    yield led
    led.close()


def _snapshot(led, stream="s"):
    """Everything a request could change: budgets, grants and the audit head."""
    ctxs = led.stream(stream).contexts
    return ([b for c in ctxs for b in led.blocks(stream, c)],
            [g.to_dict() for g in led.grants(stream)], len(led.audit_log()))


def test_grant_charges_exactly_the_requested_blocks(ledger):
    d = ledger.request("s", run_id="r1", blocks=["d001", "d003"], epsilon=0.25, delta=1e-7)
    assert d.granted and d.grant.status == "released"
    assert d.grant.block_ids == ("d001", "d003")
    assert d.grant.locations == ("/store/d001", "/store/d003")
    spent = {b.block_id: (b.epsilon_spent, b.delta_spent) for b in ledger.blocks("s")}
    assert spent["d001"] == spent["d003"] == (0.25, 1e-7)
    assert all(v == (0.0, 0.0) for k, v in spent.items() if k not in ("d001", "d003"))


def test_budget_runs_out_exactly_at_the_cap(ledger):
    for i, eps in enumerate([0.1, 0.2, 0.3, 0.4]):  # sums to exactly 1.0 (0.1+0.2 > 0.3 in floats)
        assert ledger.request("s", run_id=f"r{i}", blocks=["d000"], epsilon=eps).granted
    assert ledger.block("s", "d000").status == "retired"
    for i, eps in enumerate([0.1, 0.2, 0.3]):
        assert ledger.request("s", run_id=f"q{i}", blocks=["d001"], epsilon=eps).granted
    before = _snapshot(ledger)
    d = ledger.request("s", run_id="over", blocks=["d001"], epsilon=0.4000001)
    assert not d.granted and d.grant is None
    assert "d001" in d.reason and "requested epsilon=0.4000001" in d.reason
    assert "short by epsilon=1E-7" in d.reason
    after = _snapshot(ledger)
    assert after[:2] == before[:2]  # a denial charges nothing ...
    assert ledger.audit_log()[-1].kind == "deny"  # ... and is recorded


def test_all_or_nothing(ledger):
    assert ledger.request("s", run_id="a", blocks=["d005"], epsilon=0.9).granted
    d = ledger.request("s", run_id="b", blocks=["d004", "d005", "d006"], epsilon=0.2)
    assert not d.granted
    spent = {b.block_id: b.epsilon_spent for b in ledger.blocks("s")}
    assert spent["d004"] == 0.0 and spent["d006"] == 0.0 and spent["d005"] == 0.9


def test_delta_is_capped_too(ledger):
    assert ledger.request("s", run_id="a", blocks=["d000"], epsilon=0.1, delta=6e-7).granted
    d = ledger.request("s", run_id="b", blocks=["d000"], epsilon=0.1, delta=5e-7)
    assert not d.granted and "delta" in d.reason


def test_repeated_run_id_returns_same_grant_without_charging_twice(ledger):
    d1 = ledger.request("s", run_id="r", window=Window(last=3), epsilon=0.3)
    ledger.add_blocks("s", _blocks(2, prefix="n"))  # the window would now resolve differently
    d2 = ledger.request("s", run_id="r", window=Window(last=3), epsilon=0.3)
    assert d2.replayed and d2.grant == d1.grant
    assert sum(b.charges for b in ledger.blocks("s")) == 3


def test_run_id_reused_for_a_different_request_is_an_error(ledger):
    ledger.request("s", run_id="r", blocks=["d000"], epsilon=0.3)
    before = _snapshot(ledger)
    with pytest.raises(InvalidRequestError, match="different request"):
        ledger.request("s", run_id="r", blocks=["d000"], epsilon=0.4)
    assert _snapshot(ledger) == before


def test_window_takes_most_recent_blocks_with_budget(ledger):
    assert ledger.request("s", run_id="x", blocks=["d008"], epsilon=0.95).granted
    d = ledger.request("s", run_id="w", window=Window(last=3), epsilon=0.1)
    assert d.grant.block_ids == ("d006", "d007", "d009")  # d008 lacks budget, so it is skipped
    d = ledger.request("s", run_id="w2", window=Window(last=20, min_blocks=5), epsilon=0.1)
    assert d.granted and len(d.grant.block_ids) == 9
    d = ledger.request("s", run_id="w3", window=Window(last=20), epsilon=0.1)
    assert not d.granted and "only 9 block(s)" in d.reason


def test_blocks_retire_when_no_charge_can_fit(ledger_url):
    led = open_ledger(ledger_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, retire_epsilon=0.05)
    led.add_blocks("s", _blocks(2))
    assert led.request("s", run_id="a", blocks=["d000"], epsilon=0.96).granted
    assert led.block("s", "d000").status == "retired"
    assert led.block("s", "d001").status == "active"
    kinds = [e.kind for e in led.audit_log()]
    assert kinds[-2:] == ["grant", "retire"]
    with pytest.raises(RetiredBlockError):
        led.request("s", run_id="b", blocks=["d000"], epsilon=0.01)
    # Windows skip retired blocks; new blocks arrive with a full budget.
    led.add_blocks("s", _blocks(1, prefix="new"))
    d = led.request("s", run_id="c", window=Window(last=2), epsilon=0.5)
    assert d.grant.block_ids == ("d001", "new000")


def test_operator_retirement(ledger):
    ledger.retire_block("s", "d002", reason="retention policy")
    with pytest.raises(RetiredBlockError):
        ledger.request("s", run_id="r", blocks=["d002"], epsilon=0.1)
    assert ledger.audit_log()[-1].payload["reason"] == "retention policy"


BAD_COSTS = [
    dict(epsilon=-0.1), dict(epsilon=0.0), dict(epsilon=float("nan")), dict(epsilon=float("inf")),
    dict(epsilon=0.1, delta=1.0), dict(epsilon=0.1, delta=-1e-9),
    dict(epsilon=0.1, delta=float("nan")),
    dict(epsilon="0.1"), dict(delta=1e-6),
]


@pytest.mark.parametrize("cost", BAD_COSTS)
def test_bad_privacy_parameters_change_nothing(ledger, cost):
    before = _snapshot(ledger)
    with pytest.raises(ValueError):
        ledger.request("s", run_id="r", blocks=["d000"], **cost)
    assert _snapshot(ledger) == before


@pytest.mark.parametrize("kwargs,error", [
    (dict(blocks=["nope"]), UnknownBlockError),
    (dict(blocks=["d000", "nope"]), UnknownBlockError),
    (dict(blocks=[]), InvalidRequestError),
    (dict(blocks=["d000", "d000"]), InvalidRequestError),
    (dict(blocks="d000"), InvalidRequestError),
    (dict(), InvalidRequestError),
    (dict(blocks=["d000"], window=Window(last=1)), InvalidRequestError),
    (dict(blocks=["d000"], context="eu"), InvalidRequestError),
    (dict(blocks=["d000"], event=dp_accounting.GaussianDpEvent(1.0)), AccountingModeError),
])
def test_bad_requests_change_nothing(ledger, kwargs, error):
    before = _snapshot(ledger)
    with pytest.raises(error):
        ledger.request("s", run_id="r", epsilon=0.1, **kwargs)
    assert _snapshot(ledger) == before


def test_unknown_stream(ledger):
    with pytest.raises(UnknownStreamError):
        ledger.request("nope", run_id="r", blocks=["d000"], epsilon=0.1)
    with pytest.raises(UnknownStreamError):
        ledger.add_blocks("nope", _blocks(1))


@pytest.mark.parametrize("last", [0, -1, 1.5, True])
def test_bad_window(last):
    with pytest.raises(InvalidRequestError):
        Window(last=last)


@pytest.mark.parametrize("config", [
    dict(epsilon_g=0), dict(epsilon_g=float("nan")), dict(delta_g=1.0), dict(delta_g=-1),
    dict(mode="zcdp"), dict(mode="rdp", delta_g=0.0), dict(contexts=()),
    dict(contexts=("a", "a")), dict(retire_epsilon=2.0), dict(orders=[0.5, 2.0]),
])
def test_bad_stream_configuration(ledger_url, config):
    led = open_ledger(ledger_url)
    args = dict(epsilon_g=1.0, delta_g=1e-6) | config
    with pytest.raises(ValueError):
        led.create_stream("bad", **args)
    assert led.streams() == []


def test_duplicate_blocks_and_streams_rejected(ledger):
    with pytest.raises(InvalidRequestError):
        ledger.add_blocks("s", _blocks(1))
    with pytest.raises(InvalidRequestError):
        ledger.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    with pytest.raises(InvalidRequestError):
        ledger.add_blocks("s", [BlockSpec("x", "/a"), BlockSpec("x", "/b")])
    assert len(ledger.blocks("s")) == 10


def test_reservation_charges_first_and_only_then_releases(ledger):
    d = ledger.request("s", run_id="r", blocks=["d000"], epsilon=0.4, release=False)
    assert d.grant.status == "reserved"
    assert ledger.block("s", "d000").epsilon_spent == 0.4  # charged before any release
    with pytest.raises(GrantStateError):
        d.grant.locations  # no location handed out yet
    g = ledger.release(d.grant.grant_id)
    assert g.locations == ("/store/d000",)
    with pytest.raises(GrantStateError, match="released data stays charged"):
        ledger.cancel(g.grant_id)
    assert ledger.block("s", "d000").epsilon_spent == 0.4


def test_cancel_refunds_an_unreleased_reservation(ledger):
    ledger.request("s", run_id="keep", blocks=["d000"], epsilon=0.1)
    d = ledger.request("s", run_id="r", blocks=["d000", "d001"], epsilon=0.4, release=False)
    g = ledger.cancel(d.grant.grant_id)
    assert g.status == "cancelled"
    assert ledger.block("s", "d000").epsilon_spent == 0.1
    assert ledger.block("s", "d001").epsilon_spent == 0.0
    with pytest.raises(GrantStateError):
        ledger.release(g.grant_id)
    with pytest.raises(GrantStateError):
        ledger.cancel(g.grant_id)
    assert ledger.check_consistency("s") == []


def test_contexts_have_separate_budget_lists(ledger_url):
    led = open_ledger(ledger_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, contexts=("us", "eu"))
    led.add_blocks("s", _blocks(1))
    assert led.request("s", run_id="a", blocks=["d000"], epsilon=0.6, context="us").granted
    assert not led.request("s", run_id="b", blocks=["d000"], epsilon=0.5, context="us").granted
    assert led.request("s", run_id="c", blocks=["d000"], epsilon=1.0, context="eu").granted
    assert led.block("s", "d000", context="us").epsilon_spent == 0.6
    assert led.block("s", "d000", context="eu").status == "retired"
    with pytest.raises(InvalidRequestError):
        led.request("s", run_id="d", blocks=["d000"], epsilon=0.5)  # "default" not configured


def test_rdp_mode_charges_events_and_reports_dp_accounting_epsilon(ledger_url):
    led = open_ledger(ledger_url)
    led.create_stream("r", epsilon_g=1.0, delta_g=1e-6, mode="rdp")
    led.add_blocks("r", _blocks(3))
    event = dp_accounting.GaussianDpEvent(25.0)
    n = 0
    while led.request("r", run_id=f"g{n}", blocks=["d000", "d001"], event=event).granted:
        n += 1
    caps = accounting.rdp_caps(1.0, 1e-6, accounting.DEFAULT_RDP_ORDERS)
    curve = accounting.rdp_curve(event, accounting.DEFAULT_RDP_ORDERS)
    expected = max(k for k in range(1000) if any(k * c <= cap for c, cap in zip(curve, caps)))
    assert n == expected > 5
    acc = dp_accounting.rdp.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
    acc.compose(event, n)
    block = led.block("r", "d000")
    assert block.epsilon_spent == pytest.approx(acc.get_epsilon(1e-6))
    assert block.epsilon_spent <= 1.0
    assert led.block("r", "d002").epsilon_spent == 0.0
    grant = led.grant_for_run("r", "g0")
    assert grant.event == event and grant.epsilon is None
    with pytest.raises(AccountingModeError):
        led.request("r", run_id="x", blocks=["d002"], epsilon=0.1, delta=1e-7)
    with pytest.raises(InvalidPrivacyParameterError):
        led.request("r", run_id="x", blocks=["d002"], event=dp_accounting.GaussianDpEvent(0.0))
    assert led.check_consistency("r") == []


def test_grant_json_round_trip(ledger_url):
    led = open_ledger(ledger_url)
    led.create_stream("r", epsilon_g=2.0, delta_g=1e-6, mode="rdp")
    led.add_blocks("r", _blocks(2))
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(2.0)), 100)
    g = led.request("r", run_id="a", blocks=["d000", "d001"], event=event).grant
    assert Grant.from_json(g.to_json()) == g


def test_audit_chain_verifies_and_detects_tampering(ledger):
    for i in range(5):
        ledger.request("s", run_id=f"r{i}", blocks=["d000"], epsilon=0.1)
    report = ledger.verify_audit()
    assert report.ok and report.entries == 2 + 5  # create_stream, add_blocks, 5 grants
    ledger._q("UPDATE audit SET payload = ? WHERE seq = 4", ('{"forged":true}',))
    bad = ledger.verify_audit()
    assert not bad.ok and bad.first_bad_seq == 4


def test_audit_detects_a_deleted_tail(ledger):
    ledger.request("s", run_id="r", blocks=["d000"], epsilon=0.1)
    last = ledger.audit_log()[-1].seq
    ledger._q("DELETE FROM audit WHERE seq = ?", (last,))
    assert not ledger.verify_audit().ok


def test_consistency_check_finds_a_tampered_budget(ledger):
    ledger.request("s", run_id="r", blocks=["d000"], epsilon=0.5)
    assert ledger.check_consistency("s") == []
    ledger._q("UPDATE budgets SET eps_spent = '0' WHERE block_id = 'd000'")
    assert any("d000" in p for p in ledger.check_consistency("s"))


def test_state_survives_reopening(ledger_url):
    led = open_ledger(ledger_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", _blocks(2))
    g = led.request("s", run_id="r", blocks=["d001"], epsilon=0.7).grant
    led.close()
    led = open_ledger(ledger_url)
    assert led.block("s", "d001").epsilon_spent == 0.7
    assert led.grant(g.grant_id) == g
    assert led.verify_audit().ok


def test_bad_url():
    with pytest.raises(InvalidRequestError):
        open_ledger("mysql://x")
