"""``sage_tfx.pyramid.cost``: the DpEvent a window's seal charges on an rdp stream."""
import numpy as np
import pandas as pd
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import accounting, open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore, cost

DELTA_G = 1e-5
LAPLACE = CountSpec(groups=("user", "item"), label="y", width=64, depth=3, epsilon=1.0)
GAUSS = CountSpec(groups=("user",), label="y", width=64, depth=3, epsilon=1.0,
                  mechanism="gaussian", delta=1e-7)


def frame(n=200, seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 10, n)
    return pd.DataFrame({"user": [f"u{u}" for u in user], "item": rng.integers(0, 4, n),
                         "y": (user % 3 == 0).astype(int)})


@pytest.mark.parametrize("spec, weights", [(LAPLACE, None), (LAPLACE, [0.5, 0.3, 0.2]),
                                           (GAUSS, None)])
def test_cost_is_the_event_the_seal_charges(tmp_path, sqlite_url, spec, weights):
    event = cost(spec, weights=weights)
    with open_ledger(sqlite_url) as led:
        led.create_stream("obs", epsilon_g=20.0, delta_g=DELTA_G, mode=accounting.RDP)
        for w in range(2):
            led.add_block("obs", f"b{w}", location=f"/data/b{w}")
        store = PyramidStore(spec, str(tmp_path / "pyr"), retention=2, ledger=led, stream="obs")
        store.open_window(0, ["b0"])
        store.observe(frame())
        res = store.seal(weights=weights)
        grant = led.grant_for_run("obs", res.run_id)
        assert accounting.event_to_json(grant.event) == accounting.event_to_json(event)
        acc = rdp_lib.RdpAccountant(list(led.stream("obs").orders))
        acc.compose(event)
        spent = {b.block_id: b.epsilon_spent for b in led.blocks("obs")}
        assert spent["b0"] == pytest.approx(acc.get_epsilon(DELTA_G), rel=1e-9)
        assert spent["b0"] > 0 and spent["b1"] == 0.0


def test_bad_configs_are_refused():
    with pytest.raises(InvalidRequestError, match="CountSpec"):
        cost({"groups": ("user",), "label": "y"})
    with pytest.raises(ValueError):
        cost(LAPLACE, weights=[1.0])                          # one weight for three tables
