"""``sage_tfx.dnd.cost``: the DpEvent ``request_run`` charges for a Draw-and-Discard run."""
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.dnd import ClientConfig, cost
from sage_tfx.dnd.budget import RunBudget, request_run
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import BlockSpec, Window, accounting, open_ledger

DIM = 65
DELTA_G = 1e-6
LAPLACE = ClientConfig(gamma=0.01, l1_norm_clip=1.0, epsilon=0.25)
GAUSS = ClientConfig(gamma=0.01, epsilon=1.0, unit="gaussian", delta=1e-7, l2_norm_clip=1.0)


@pytest.mark.parametrize("config, passes", [(LAPLACE, 2), (GAUSS, 1)])
def test_cost_is_the_charged_event_and_its_epsilon(sqlite_url, config, passes):
    event = cost(config, dim=DIM, passes=passes)
    with open_ledger(sqlite_url) as led:
        led.create_stream("c", epsilon_g=20.0, delta_g=DELTA_G, mode=accounting.RDP)
        led.add_blocks("c", [BlockSpec(f"bucket-{i}", f"/b/{i}") for i in range(2)])
        d = request_run(led, "c", run_id="r", config=config, dim=DIM, passes=passes,
                        window=Window(last=2))
        assert d.granted
        assert accounting.event_to_json(d.grant.event) == accounting.event_to_json(event)
        RunBudget(d.grant, config, DIM, passes)              # the server admits draws with it
        with pytest.raises(MissingGrantError):
            RunBudget(d.grant, config, DIM, passes + 1)
        acc = rdp_lib.RdpAccountant(list(led.stream("c").orders))
        acc.compose(event)
        spent = [b.epsilon_spent for b in led.blocks("c")]
        assert spent == pytest.approx([acc.get_epsilon(DELTA_G)] * 2, rel=1e-9)
        assert spent[0] > 0


@pytest.mark.parametrize("args, kwargs", [
    ((LAPLACE,), {"dim": 0}), ((LAPLACE,), {"dim": DIM, "passes": 0}),
    ((LAPLACE,), {"dim": DIM, "passes": 1.5}), (("laplace",), {"dim": DIM}),
    ((ClientConfig(gamma=0.01, epsilon=None),), {"dim": DIM})])
def test_bad_configs_are_refused(args, kwargs):
    with pytest.raises(InvalidRequestError):
        cost(*args, **kwargs)
