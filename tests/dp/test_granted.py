"""Library releases under a grant, released once (sage_tfx.dp.granted): the replay matrix.

Every release here draws OpenDP noise (never seeded), so a second draw would publish other
bytes: equal bytes on a replay mean nothing was drawn again. Cases: a retry in the same
process, a new process, two processes racing (both draw; one record wins and both publish it),
a different request (refused, nothing recorded), and the ledger's consistency check.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sage_tfx.dp import granted
from sage_tfx.dp.validation import Outcome, SumStatisticValidator
from sage_tfx.errors import GrantStateError, InvalidRequestError, ReleaseConflictError
from sage_tfx.ledger import BlockSpec, open_ledger

STREAM = "s"
NAME = "mean-delay/mean"


def _ledger(tmp_path, *, release=True, run_id="r1"):
    url = f"sqlite:///{tmp_path}/ledger.db"
    ledger = open_ledger(url)
    ledger.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-5)
    ledger.add_blocks(STREAM,
                      [BlockSpec("b1", f"{tmp_path}/b1"), BlockSpec("b2", f"{tmp_path}/b2")])
    d = ledger.request(STREAM, run_id=run_id, blocks=["b1", "b2"], epsilon=1.0, delta=1e-6,
                       release=release)
    assert d.granted
    return url, ledger, d.grant


VALUES = np.random.default_rng(3).uniform(0.0, 100.0, 500)


class Counting:
    """The values, lazily, counting how often they are read."""

    def __init__(self, values=VALUES):
        self.values, self.calls = values, 0

    def __call__(self):
        self.calls += 1
        return self.values


def _validator(target=5.0):
    return SumStatisticValidator(target=target, value_bound=100.0, eta=0.05)


def test_replay_in_process_returns_the_recorded_release_and_reads_nothing(tmp_path):
    url, ledger, grant = _ledger(tmp_path)
    values = Counting()
    first, replayed = granted.validate_once(ledger, grant.grant_id, NAME, _validator(), values,
                                            epsilon=0.5)
    assert not replayed and values.calls == 1
    again, replayed = granted.validate_once(ledger, grant.grant_id, NAME, _validator(), values,
                                            epsilon=0.5)
    assert replayed and values.calls == 1  # the data is not read again, no noise is drawn
    assert again == first
    assert granted.canonical_json(again.to_dict()) == granted.canonical_json(first.to_dict())
    # The release is noisy (OpenDP): another grant's release of the same data differs.
    d = ledger.request(STREAM, run_id="r2", blocks=["b1"], epsilon=1.0)
    other, _ = granted.validate_once(ledger, d.grant.grant_id, NAME, _validator(), values,
                                     epsilon=0.5)
    assert other.dp_estimate != first.dp_estimate and values.calls == 2
    assert abs(first.dp_estimate - VALUES.mean()) < 10  # still an estimate of the mean
    assert [r.name for r in ledger.releases(grant.grant_id)] == [NAME]
    assert ledger.check_consistency(STREAM) == []


def test_another_request_under_the_grant_is_refused_before_reading(tmp_path):
    url, ledger, grant = _ledger(tmp_path)
    granted.validate_once(ledger, grant.grant_id, NAME, _validator(), VALUES, epsilon=0.5)
    values = Counting()
    with pytest.raises(ReleaseConflictError) as e:
        granted.validate_once(ledger, grant.grant_id, NAME, _validator(target=1.0), values,
                              epsilon=0.5)
    message = str(e.value)
    assert grant.grant_id in message and NAME in message and "target: 5.0 then, 1.0 now" in message
    assert values.calls == 0
    with pytest.raises(ReleaseConflictError, match="epsilon"):
        granted.validate_once(ledger, grant.grant_id, NAME, _validator(), VALUES, epsilon=0.25)
    assert len(ledger.releases(grant.grant_id)) == 1
    assert ledger.check_consistency(STREAM) == []


def test_a_failed_draw_records_nothing_and_binds_nothing(tmp_path):
    url, ledger, grant = _ledger(tmp_path)

    def broken():
        raise RuntimeError("the reader failed")

    with pytest.raises(RuntimeError):
        granted.release_json_once(ledger, grant.grant_id, NAME, broken, request={"a": 1})
    assert ledger.releases(grant.grant_id) == []
    out = granted.release_json_once(ledger, grant.grant_id, NAME, lambda: [1.5, float("inf")],
                                    request={"a": 2})
    assert out.value == [1.5, float("inf")] and not out.replayed


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    url, ledger, grant = _ledger(tmp_path)
    with pytest.raises(InvalidRequestError, match="JSON"):
        granted.release_json_once(ledger, grant.grant_id, NAME, lambda: 1, request={"a": object()})
    with pytest.raises(InvalidRequestError, match="JSON"):
        granted.release_json_once(ledger, grant.grant_id, NAME, lambda: object())
    with pytest.raises(InvalidRequestError, match="release name"):
        granted.release_json_once(ledger, grant.grant_id, "bad name!", lambda: 1)
    assert ledger.releases(grant.grant_id) == []
    _, ledger2, reservation = _ledger(tmp_path / "r", release=False)
    with pytest.raises(GrantStateError, match="reserved"):
        granted.validate_once(ledger2, reservation.grant_id, NAME, _validator(), VALUES,
                              epsilon=0.5)
    assert ledger2.releases(reservation.grant_id) == []


def test_adassp_replays_its_weights_and_released_moments(tmp_path):
    url, ledger, grant = _ledger(tmp_path)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (400, 3))
    y = x @ np.array([0.5, -0.2, 0.1]) + rng.normal(0, 0.05, 400)
    features = Counting(x)
    kw = dict(epsilon=1.0, delta=1e-6, x_bound=2.0, y_bound=2.0)
    first, replayed = granted.adassp_once(ledger, grant.grant_id, "lr/adassp", features, y, **kw)
    again, replayed_again = granted.adassp_once(ledger, grant.grant_id, "lr/adassp", features,
                                                y, **kw)
    assert (replayed, replayed_again, features.calls) == (False, True, 1)
    for field in ("weights", "noisy_xtx", "noisy_xty"):
        np.testing.assert_array_equal(getattr(again, field), getattr(first, field))
    assert again.event == first.event and again.noisy_lambda_min == first.noisy_lambda_min
    assert np.abs(first.weights - [0.5, -0.2, 0.1]).max() < 0.5
    with pytest.raises(ReleaseConflictError, match="epsilon"):
        granted.adassp_once(ledger, grant.grant_id, "lr/adassp", x, y, **{**kw, "epsilon": 0.5})
    assert ledger.check_consistency(STREAM) == []


# -- other processes ----------------------------------------------------------------------------

_WORKER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    from sage_tfx.dp import granted
    from sage_tfx.dp.validation import SumStatisticValidator
    from sage_tfx.ledger import open_ledger
    url, grant_id, name, barrier, me = sys.argv[1:6]
    values = np.random.default_rng(3).uniform(0.0, 100.0, 500)
    drew = []
    def read():
        drew.append(1)
        time.sleep(0.5)  # both processes are past the ledger lookup before either records
        return values
    if barrier != "-":
        open(os.path.join(barrier, me), "w").close()
        while len(os.listdir(barrier)) < 2:
            time.sleep(0.01)
    with open_ledger(url) as ledger:
        result, replayed = granted.validate_once(
            ledger, grant_id, name, SumStatisticValidator(target=5.0, value_bound=100.0, eta=0.05),
            read, epsilon=0.5)
    print("RESULT " + json.dumps({"result": granted.canonical_json(result.to_dict()).decode(),
                                  "replayed": replayed, "drew": len(drew)}))
""")


def _spawn(url, grant_id, barrier, me):
    return subprocess.Popen([sys.executable, "-c", _WORKER, url, grant_id, NAME, barrier, me],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    [line] = [l for l in out.splitlines() if l.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow  # a new Python process (imports the core: seconds, more on a loaded machine)
def test_a_new_process_replays_byte_for_byte(tmp_path):
    url, ledger, grant = _ledger(tmp_path)
    first, _ = granted.validate_once(ledger, grant.grant_id, NAME, _validator(), VALUES,
                                     epsilon=0.5)
    out = _result(_spawn(url, grant.grant_id, "-", "p"))
    assert out["replayed"] and out["drew"] == 0
    assert out["result"] == granted.canonical_json(first.to_dict()).decode()


@pytest.mark.slow
def test_two_processes_racing_publish_one_release(tmp_path):
    url, ledger, grant = _ledger(tmp_path)
    barrier = tmp_path / "barrier"
    os.makedirs(barrier)
    a, b = [_result(p) for p in [_spawn(url, grant.grant_id, str(barrier), m) for m in "ab"]]
    assert a["result"] == b["result"]
    assert sorted([a["replayed"], b["replayed"]]) == [False, True]
    [rec] = ledger.releases(grant.grant_id)
    assert json.loads(rec.value)["release"] == json.loads(a["result"])
    assert Outcome(json.loads(a["result"])["outcome"]) in (Outcome.ACCEPT, Outcome.RETRY)
    # Both drew (they raced past the lookup); the loser's draw was discarded, never published.
    print("draws:", a["drew"], b["drew"])
    assert a["drew"] + b["drew"] >= 1
    assert [g.run_id for g in ledger.grants(STREAM)] == ["r1"]
    assert ledger.check_consistency(STREAM) == []
