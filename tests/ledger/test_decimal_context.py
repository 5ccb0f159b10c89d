"""The ledger's decimal sums do not depend on the caller's ``decimal`` context."""
import decimal

import pytest

from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.ledger.history import budget_history


@pytest.fixture
def coarse_context():
    """A caller that lowered the thread's decimal precision to 6 digits (restored afterwards)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 6
        yield ctx


def test_sums_are_exact_whatever_the_callers_precision(tmp_path, coarse_context):
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec("b0", "/b0")])
    # 0.1000001 twice is 0.2000002: six digits would round it down to 0.200000 (an under-charge)
    for i in range(2):
        assert led.request("s", run_id=f"r{i}", blocks=["b0"], epsilon=0.1000001).granted
    block = led.block("s", "b0")
    assert decimal.Decimal(repr(block.epsilon_spent)) == decimal.Decimal("0.2000002")
    assert decimal.Decimal(repr(led.remaining("s", "b0")["epsilon"])) == decimal.Decimal(
        "0.7999998")
    # a charge that fits only by the rounding is denied: 0.2000002 + 0.7999999 > 1
    assert not led.request("s", run_id="r2", blocks=["b0"], epsilon=0.7999999).granted
    assert led.check_consistency("s") == []
    history = budget_history(led, "s")
    assert decimal.Decimal(repr(float(history.epsilon[0, -1]))) == decimal.Decimal("0.2000002")
    assert decimal.getcontext().prec == 6  # the caller's context is left as it was


def test_ptk_partition_sums_are_exact_whatever_the_callers_precision(coarse_context):
    """The allocator's per-partition Σε and Σδ (what a plan charges) ignore the caller's
    context: six digits would round 0.1000001 + 0.1000001 down to 0.200000."""
    from sage_tfx.ptk.allocation import Assignment, Partition
    part = Partition(0, 100, (Assignment("a", 0.1000001, 1.0000001e-7, 10),
                              Assignment("b", 0.1000001, 1.0000001e-7, 10)))
    assert part.epsilon_sum == decimal.Decimal("0.2000002")
    assert part.delta_sum == decimal.Decimal("2.0000002E-7")
