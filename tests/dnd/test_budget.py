"""A Draw-and-Discard run under the ledger: charged before any update, enforced on every draw."""
import pytest
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dnd import ClientConfig
from sage_tfx.dnd.budget import RunBudget, UpdateRefused, request_run, run_epsilon, run_event
from sage_tfx.errors import MissingGrantError
from sage_tfx.ledger import BlockSpec, Window, accounting, open_ledger
from sage_tfx.streams import HashBucketScheme

CFG = ClientConfig(gamma=0.01, l1_norm_clip=1.0, epsilon=0.25)
DIM = 387
SCHEME = HashBucketScheme("client_id", 4, "dnd")


def _ledger(url, mode="basic"):
    led = open_ledger(url)
    led.create_stream("clients", epsilon_g=1.0, delta_g=1e-6, mode=mode,
                      granularity="hash:client_id:4:dnd")
    led.add_blocks("clients", [BlockSpec(f"bucket-{i}", f"/b/{i}") for i in range(4)])
    return led


def _block(client):
    return SCHEME.block_of(client).block_id


def test_grant_charges_passes_times_epsilon_and_passes_are_enforced(sqlite_url):
    with _ledger(sqlite_url) as led:
        d = request_run(led, "clients", run_id="r1", config=CFG, dim=DIM, passes=2,
                        window=Window(last=4))
        assert d.granted and d.grant.epsilon == pytest.approx(0.5)
        assert all(b.epsilon_spent == pytest.approx(0.5) for b in led.blocks("clients"))
        budget = RunBudget(d.grant, CFG, DIM, passes=2)
        assert budget.admit("alice", [_block("alice")]) == 1
        assert budget.admit("alice", [_block("alice")]) == 0
        with pytest.raises(UpdateRefused, match="used its 2"):
            budget.admit("alice", [_block("alice")])
        assert budget.admit("bob", [_block("bob")]) == 1
        # A second run fits (0.5 + 0.5 = 1.0); a third is denied, and its clients are stopped.
        assert request_run(led, "clients", run_id="r2", config=CFG, dim=DIM, passes=2,
                           window=Window(last=4)).granted
        denied = request_run(led, "clients", run_id="r3", config=CFG, dim=DIM, passes=1,
                             window=Window(last=4))
        assert not denied.granted and denied.grant is None


def test_a_grant_that_does_not_pay_for_the_run_is_refused(sqlite_url):
    with _ledger(sqlite_url) as led:
        g = led.request("clients", run_id="cheap", window=Window(last=4), epsilon=0.25).grant
        with pytest.raises(MissingGrantError, match="pays"):
            RunBudget(g, CFG, DIM, passes=2)
        feature = ClientConfig(gamma=0.01, l1_norm_clip=1.0, epsilon=0.25, unit="feature")
        with pytest.raises(MissingGrantError):  # the paper's unit costs 387 × 0.25 per update
            RunBudget(g, feature, DIM, passes=1)
        assert run_epsilon(feature, DIM, 1) == pytest.approx(DIM * 0.25)


def test_clients_of_blocks_outside_the_grant_or_retired_are_stopped(sqlite_url):
    with _ledger(sqlite_url) as led:
        led.retire_block("clients", "bucket-3", "user deletion")
        d = request_run(led, "clients", run_id="r1", config=CFG, dim=DIM, passes=1,
                        window=Window(last=3))
        assert set(d.grant.block_ids) == {"bucket-0", "bucket-1", "bucket-2"}
        budget = RunBudget(d.grant, CFG, DIM, passes=1)
        client3 = next(f"u{i}" for i in range(100) if _block(f"u{i}") == "bucket-3")
        with pytest.raises(UpdateRefused, match="not granted"):
            budget.admit(client3, [_block(client3)])
        client1 = [f"u{i}" for i in range(100) if _block(f"u{i}") == "bucket-1"]
        budget.admit(client1[0], ["bucket-1"])
        led.retire_block("clients", "bucket-1", "operator")  # retired mid-run
        assert budget.refresh(led) == ["bucket-1"]
        with pytest.raises(UpdateRefused, match="stopped"):
            budget.admit(client1[1], ["bucket-1"])
        with pytest.raises(UpdateRefused, match="not granted"):  # spans a non-granted block
            budget.admit("carol", ["bucket-0", "bucket-3"])


def test_a_block_exhausted_by_this_grant_keeps_serving_it(sqlite_url):
    with _ledger(sqlite_url) as led:
        d = request_run(led, "clients", run_id="all", config=CFG, dim=DIM, passes=4,
                        window=Window(last=2))
        budget = RunBudget(d.grant, CFG, DIM, passes=4)
        assert budget.refresh(led) == []  # retired by its own charge: paid for
        budget.admit("x", [d.grant.block_ids[0]])


def test_rdp_streams_are_charged_the_composed_laplace_event(sqlite_url):
    with _ledger(sqlite_url, mode="rdp") as led:
        d = request_run(led, "clients", run_id="r1", config=CFG, dim=DIM, passes=3,
                        window=Window(last=4))
        assert d.granted
        assert accounting.event_to_json(d.grant.event) == accounting.event_to_json(
            dp_event_lib.SelfComposedDpEvent(dp_event_lib.LaplaceDpEvent(1 / 0.25), 3))
        assert run_event(CFG, DIM, 3) == d.grant.event
        RunBudget(d.grant, CFG, DIM, passes=3)
        with pytest.raises(MissingGrantError):
            RunBudget(d.grant, CFG, DIM, passes=4)
