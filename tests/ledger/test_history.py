"""The block × time budget history, replayed from the audit log."""
import math

import dp_accounting
import numpy as np
import pytest

from sage_tfx.ledger import BlockSpec, Window, open_ledger
from sage_tfx.ledger.history import budget_history, plot_budget_heatmap


@pytest.fixture
def ledger(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    yield led
    led.close()


def _arrive(led, stream, block_id):
    led.add_blocks(stream, [BlockSpec(block_id, f"/blocks/{stream}/{block_id}")])


def test_basic_history_matches_the_charges_step_by_step(ledger):
    ledger.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    _arrive(ledger, "s", "d0")
    ledger.request("s", run_id="a", blocks=["d0"], epsilon=0.25)
    _arrive(ledger, "s", "d1")
    ledger.request("s", run_id="b", window=Window(last=2), epsilon=0.5)
    reserved = ledger.request("s", run_id="c", blocks=["d1"], epsilon=0.125, release=False)
    _arrive(ledger, "s", "d2")
    ledger.cancel(reserved.grant.grant_id)          # refunded at step 2
    h = budget_history(ledger, "s")
    assert h.block_ids == ("d0", "d1", "d2") and h.steps == ("d0", "d1", "d2")
    expected = np.array([[0.25, 0.75, 0.75],
                         [np.nan, 0.625, 0.5],
                         [np.nan, np.nan, 0.0]])
    np.testing.assert_array_equal(np.isnan(h.epsilon), np.isnan(expected))
    np.testing.assert_allclose(np.nan_to_num(h.epsilon), np.nan_to_num(expected))
    final = [b.epsilon_spent for b in ledger.blocks("s")]
    np.testing.assert_allclose(h.epsilon[:, -1], final)


def test_rdp_history_ends_at_the_ledgers_epsilon(ledger):
    ledger.create_stream("r", epsilon_g=2.0, delta_g=1e-6, mode="rdp")
    event = dp_accounting.GaussianDpEvent(noise_multiplier=10.0)
    for k in range(3):
        _arrive(ledger, "r", f"d{k}")
        assert ledger.request("r", run_id=f"g{k}", window=Window(last=k + 1), event=event).granted
    h = budget_history(ledger, "r")
    final = [b.epsilon_spent for b in ledger.blocks("r")]
    np.testing.assert_allclose(h.epsilon[:, -1], final, rtol=1e-12)
    # the oldest block was charged three times, the newest once: ε grows along a row
    assert h.epsilon[0, 0] < h.epsilon[0, 1] < h.epsilon[0, 2]
    assert math.isnan(h.epsilon[2, 0]) and h.epsilon[2, 2] == pytest.approx(h.epsilon[0, 0])


def test_other_contexts_are_not_counted(ledger):
    ledger.create_stream("c", epsilon_g=1.0, delta_g=0.0, contexts=("us", "eu"))
    _arrive(ledger, "c", "d0")
    ledger.request("c", run_id="x", blocks=["d0"], epsilon=0.5, context="eu")
    assert budget_history(ledger, "c", context="us").epsilon[0, 0] == 0.0
    assert budget_history(ledger, "c", context="eu").epsilon[0, 0] == 0.5


def test_heatmap_draws_one_image(ledger):
    import matplotlib
    matplotlib.use("Agg")
    ledger.create_stream("s", epsilon_g=1.0, delta_g=0.0)
    for k in range(4):
        _arrive(ledger, "s", f"d{k}")
        ledger.request("s", run_id=f"r{k}", window=Window(last=1), epsilon=0.2)
    fig = plot_budget_heatmap(budget_history(ledger, "s"))
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (4, 4)
