"""DP count selection picks the informative pair; it is charged before it reads."""
import numpy as np
import pandas as pd
import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import select_groups
from sage_tfx.pyramid.selection import pair_gains


def xor_frame(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    a, b, c, d = (rng.integers(0, 4, n) for _ in range(4))
    y = ((a + b) % 2 == 0).astype(int)            # only the pair (a, b) explains y
    flip = rng.random(n) < 0.05
    return pd.DataFrame({"a": a, "b": b, "c": c, "d": d, "y": np.where(flip, 1 - y, y)})


def test_exact_gain_is_largest_for_the_interacting_pair():
    pairs, gains = pair_gains(xor_frame(), ["a", "b", "c", "d"], "y")
    assert pairs[int(np.argmax(gains))] == ("a", "b")


def test_private_selection_finds_it_and_charges_the_ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=0.0)
    led.add_block("s", "b0", location="/x")
    got = select_groups(xor_frame(), ["a", "b", "c", "d"], "y", 1, 0.5, max_records=10_000,
                        ledger=led, stream="s", blocks=["b0"], run_id="sel-w0")
    assert got == [("a", "b")]
    assert led.remaining("s", "b0")["epsilon"] == pytest.approx(0.5)
    # A replay of the run id returns the recorded choice, even on other data (where (c, d)
    # is the pair to find): no new noise, no new charge, one release.
    swapped = xor_frame(seed=1).rename(columns={"a": "c", "b": "d", "c": "a", "d": "b"})
    again = select_groups(swapped, ["a", "b", "c", "d"], "y", 1, 0.5, max_records=10_000,
                          ledger=led, stream="s", blocks=["b0"], run_id="sel-w0")
    assert again == [("a", "b")]
    assert led.remaining("s", "b0")["epsilon"] == pytest.approx(0.5)
    grant = led.grant_for_run("s", "sel-w0")
    assert [r.name for r in led.releases(grant.grant_id)] == ["pyramid/select_groups"]
    assert led.check_consistency("s") == []


@pytest.mark.parametrize("kw", [dict(n_select=0), dict(n_select=7), dict(max_records=10),
                                dict(features=["a"])])
def test_bad_selection_requests(kw):
    args = dict(frame=xor_frame(200), features=["a", "b", "c", "d"], label="y", n_select=1,
                epsilon=1.0, max_records=10_000)
    args.update(kw)
    with pytest.raises(InvalidRequestError):
        select_groups(**args)
