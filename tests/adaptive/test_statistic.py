"""A DP statistic iteration of privacy-adaptive training, released once against its grant."""
import numpy as np
import pytest

from sage_tfx.adaptive import SearchConfig, run_statistic_iteration
from sage_tfx.dp.validation import Outcome, SumStatisticValidator
from sage_tfx.errors import MissingGrantError, ReleaseConflictError
from sage_tfx.ledger import BlockSpec, open_ledger

VALUES = {f"/store/d{i}": np.random.default_rng(i).uniform(0, 100, 300) for i in range(6)}


class Reader:
    """Per-block values by location, counting the reads."""

    def __init__(self):
        self.reads = 0

    def __call__(self, locations):
        self.reads += 1
        return np.concatenate([VALUES[loc] for loc in locations])


def _ledger(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"d{i}", f"/store/d{i}", records=300) for i in range(6)])
    return led


def _iteration(led, reader, **kw):
    args = dict(run_id="mean.it0", blocks=["d0", "d1"], epsilon=0.5, delta=1e-8,
                validator=SumStatisticValidator(target=5.0, value_bound=100.0, eta=0.05),
                read_values=reader, name="mean/dp_mean", request={"feature": "v"})
    args.update(kw)
    return run_statistic_iteration(led, "s", **args)


def test_an_iteration_run_twice_publishes_one_statistic_and_charges_once(tmp_path):
    led = _ledger(tmp_path)
    reader = Reader()
    first = _iteration(led, reader)
    again = _iteration(led, reader)
    assert (first.replayed, again.replayed, reader.reads) == (False, True, 1)
    assert again.result == first.result and again.grant.grant_id == first.grant.grant_id
    exact = np.concatenate([VALUES["/store/d0"], VALUES["/store/d1"]]).mean()
    assert first.result.dp_estimate != exact and abs(first.result.dp_estimate - exact) < 5
    assert first.result.outcome in (Outcome.ACCEPT, Outcome.RETRY)
    assert [b.charges for b in led.blocks("s")][:2] == [1, 1]
    assert [r.name for r in led.releases(first.grant.grant_id)] == ["mean/dp_mean"]
    assert led.check_consistency("s") == []


def test_a_reservation_charged_by_the_allocator_is_released_then_used_once(tmp_path):
    from sage_tfx.adaptive import AdaptiveSearch, Allocator
    led = _ledger(tmp_path)
    allocator = Allocator(led, "s")
    search = AdaptiveSearch(allocator, "mean", SearchConfig(epsilon0=0.25, delta=1e-8,
                                                            min_blocks=2))
    allocator.add_blocks([f"d{i}" for i in range(6)])
    plan, grant = search.start(now=0, release=False)
    assert grant.status == "reserved"
    reader = Reader()
    it = _iteration(led, reader, run_id=plan.run_id, blocks=list(plan.blocks),
                    epsilon=plan.epsilon, delta=plan.delta)
    assert it.grant.status == "released" and not it.replayed
    assert _iteration(led, reader, run_id=plan.run_id, blocks=list(plan.blocks),
                      epsilon=plan.epsilon, delta=plan.delta).replayed
    assert reader.reads == 1 and len(led.grants("s")) == 1
    assert led.check_consistency("s") == []


def test_another_statistic_under_the_iterations_grant_is_refused(tmp_path):
    led = _ledger(tmp_path)
    reader = Reader()
    _iteration(led, reader)
    with pytest.raises(ReleaseConflictError, match="feature"):
        _iteration(led, reader, request={"feature": "w"})
    assert reader.reads == 1


def test_a_denied_iteration_reads_nothing(tmp_path):
    led = _ledger(tmp_path)
    reader = Reader()
    with pytest.raises(MissingGrantError, match="denied"):
        _iteration(led, reader, epsilon=5.0)
    assert reader.reads == 0 and led.grants("s") == []
