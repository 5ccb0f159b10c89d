"""The spam check as the server runs it: thresholds cached and recalibrated in the background
(never on a request's path), the same decision as in line for the same thresholds, only
unexpired draws counted in flight, and the check run off the event loop."""
import threading
import time

import httpx
import numpy as np
from dndtest import STREAM, bearer, serving

from sage_tfx import services
from sage_tfx.dnd import ClientConfig, GLMSpec
from sage_tfx.dnd.server import BINARY, TICKET_HEADER, build_service, create_app, encode
from sage_tfx.dnd.spam import SpamCheck, count_limit
from sage_tfx.dnd.state import DnDState, initial_instances
from sage_tfx.streams import HashBucketScheme

SPEC = GLMSpec("logistic", 386)
CFG = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
SCHEME = HashBucketScheme("client_id", 4, "dnd")


def _state(k=20, d=387, seed=0):
    rng = np.random.default_rng(seed)
    return DnDState(initial_instances(np.zeros(d), k, CFG.noise_variance, rng=rng)), rng


def _updates(state, rng, n):
    """Honest updates (an instance plus Laplace noise) mixed with crude attacks: ×1.5 and ×10
    scaled, a shift of every weight, ten weights pushed far, and copies."""
    inst = state.instances_view()
    out = []
    for i in range(n):
        base = inst[rng.integers(len(inst))]
        honest = base + rng.laplace(0.0, CFG.noise_scale, base.size)
        pushed = honest.copy()
        pushed[:10] += 10 * CFG.noise_scale
        out.append([honest, 1.5 * honest, 10 * honest, honest + 0.5 * CFG.noise_scale, pushed,
                    base][i % 6])
    return out


def _expected(cal, state, u, in_flight, check):
    """The decision of the three statistics and the copy test, written out from their
    definitions (SpamCheck's docstring) for the given calibration."""
    mu, sd = state.moments()
    cols = state.columns(cal.columns)
    if np.min(np.mean(np.abs(cols - u[cal.columns]), axis=1)) < 0.5 * check.noise_scale:
        return False
    limit = count_limit(cols - mu[cal.columns], sd[cal.columns], mu.size, check.noise_scale,
                        z=check.z, alpha=check.false_reject / 3, stale_fraction=cal.stale_fraction,
                        in_flight_fraction=min(1.0, in_flight / state.k))
    z = (u - mu) / sd
    t = cal.thresholds
    return bool(np.sum(np.abs(z) > check.z) <= limit and np.max(np.abs(z)) <= t.max_z
                and t.mean_z_low <= z.mean() <= t.mean_z_high)


def test_background_decision_equals_the_inline_decision_for_the_same_thresholds():
    state, rng = _state()
    inline = SpamCheck.for_config(CFG, recalibrate_every=10 ** 6)
    background = SpamCheck.for_config(CFG, recalibrate_every=10 ** 6, background=True)
    cal = inline.calibration(state.instances_view(), in_flight=3)
    inline.install(cal)
    background.install(cal)
    inline.in_flight = 3
    got_inline, got_bg, want = [], [], []
    for u in _updates(state, rng, 120):
        got_inline.append(inline(state, u))
        got_bg.append(background.check(state, u, in_flight=3))
        want.append(_expected(cal, state, u, 3, inline))
    assert got_bg == got_inline == want
    assert 0 < sum(want) < len(want)  # both outcomes occur: honest pass, crude attacks fail
    assert all(want[i] for i in range(0, 120, 6))  # every honest update passes here
    assert not any(want[i] for i in range(120) if i % 6 in (2, 5))  # ×10 scaled, copies
    assert inline.failures == background.failures


def _slow_check(every: int, seconds: float):
    """A background check whose calibrations take ``seconds`` and record their thread."""
    check = SpamCheck.for_config(CFG, background=True, recalibrate_every=every)
    threads = []
    original = check.calibration

    def spy(instances, in_flight=None):
        threads.append(threading.current_thread().name)
        time.sleep(seconds)
        return original(instances, in_flight)
    check.calibration = spy
    return check, threads


def _timed_checks(check, state, rng, n):
    took = []
    for u in _updates(state, rng, n):
        t0 = time.perf_counter()
        check.check(state, u)
        took.append(time.perf_counter() - t0)
        if rng.random() < 0.3:
            state.replace(int(rng.integers(state.k)), u)
    return took


def test_background_mode_never_calibrates_in_a_check():
    state, rng = _state(seed=1)
    check, threads = _slow_check(every=40, seconds=0.5)  # starts one after 20 checks
    check.prime(state)
    assert threads == [threading.current_thread().name]
    threads.clear()
    took = _timed_checks(check, state, rng, 38)  # below the lag limit (40): nobody waits
    assert check.wait_idle(10)
    assert threads and all(t.startswith("spam-calibrate") for t in threads)
    assert check.calibrations == 1 + len(threads)
    assert max(took) < 0.4  # no check waited for a 500 ms calibration


def test_a_check_waits_only_when_the_thresholds_lag_too_far():
    """Thresholds never serve more checks than in line (``recalibrate_every``): past that a
    check waits for the running recalibration instead of using staler thresholds."""
    state, rng = _state(seed=2)
    check, threads = _slow_check(every=4, seconds=0.5)  # starts after 2 checks, waits at 4
    check.prime(state)
    took = _timed_checks(check, state, rng, 8)
    assert check.wait_idle(10)
    assert took[4] >= 0.2 and max(took[:4] + took[5:]) < 0.4
    assert check.calibrations == 3 and len(threads) == 3


def _service(p, **kw):
    return build_service(ledger_url=p.url, stream=STREAM, run_id="r1", spec=SPEC, config=CFG,
                         k=20, window_last=4, block_scheme=SCHEME, token=p.server, **kw)


def test_expired_tickets_do_not_count_in_flight(principals):
    """5,000 abandoned draws used to widen the test; now a draw counts only until its ticket
    expires: what the check is told is the number of unexpired tickets but the one returned."""
    p = principals
    service = _service(p, passes=40, ticket_ttl=60.0)
    now = [service.store._time()]
    service.store._time = lambda: now[0]  # the store's clock, moved by the test
    seen = []
    original = service.spam_check.check

    def spy(instances, update, in_flight=None):
        seen.append(in_flight)
        return original(instances, update, in_flight=in_flight)
    service.spam_check.check = spy
    for _ in range(30):  # abandoned by their client
        service.draw("alice")
    assert service.in_flight() == 29 and service.store.outstanding(service.grant_id) == 30
    ticket, w = service.draw("bob")
    noise = np.random.default_rng(3).laplace(0.0, CFG.noise_scale, w.size)
    service.discard("bob", ticket, w + noise)
    now[0] += 59.0
    assert service.in_flight() == 29  # not yet expired
    now[0] += 1.0
    assert service.in_flight() == 0 and service.store.outstanding(service.grant_id) == 0
    ticket, w = service.draw("bob")
    service.discard("bob", ticket, w + noise[::-1])
    assert seen == [30, 0]  # 30 alice + bob's own ticket, minus the one returned; then none


def test_a_slow_check_does_not_block_the_event_loop(principals):
    p = principals
    service = _service(p, passes=2)
    original = service.spam_check.check

    def slow(*a, **kw):
        time.sleep(1.5)
        return original(*a, **kw)
    service.spam_check.check = slow
    app = create_app(service, services.Authenticator(p.url, token=p.server, cache_seconds=0))
    alice = bearer(p.client("alice"))
    with serving(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        c.get("/v1/spec", headers=alice)  # the token is cached
        r = c.post("/v1/draw", headers={"accept": BINARY, **alice})
        w = np.frombuffer(r.content, "<f8")
        u = w + np.random.default_rng(4).laplace(0.0, CFG.noise_scale, w.size)
        done = {}

        def send():
            with httpx.Client(base_url=base, timeout=30) as c2:
                done["r"] = c2.post(f"/v1/discard/{r.headers[TICKET_HEADER]}", content=encode(u),
                                    headers={"content-type": BINARY, **alice})
        t = threading.Thread(target=send)
        t0 = time.perf_counter()
        t.start()
        time.sleep(0.3)
        assert "r" not in done  # the check is still running
        spec = c.get("/v1/spec", headers=alice)
        answered = time.perf_counter() - t0
        t.join(30)
    assert spec.status_code == 200 and answered < 1.4
    assert done["r"].status_code == 200 and done["r"].json() == {"accepted": True}


def test_more_draws_in_flight_than_the_thresholds_allow_for_recalibrates_first():
    """Thresholds primed with no draw in flight are too narrow once 16 are: the next check waits
    for a recalibration that allows for them (background) or makes one (in line)."""
    state, rng = _state()
    for background in (True, False):
        check = SpamCheck.for_config(CFG, background=background)
        check.prime(state, in_flight=0)
        u = _updates(state, rng, 1)[0]
        check.check(state, u, in_flight=16)
        assert check.calibrations == 2 and check._cal.in_flight == 16
        check.check(state, u, in_flight=12)  # fewer: the wider thresholds stay
        assert check.calibrations == 2
        if background:
            assert check.wait_idle()


def test_background_calibrations_can_run_in_another_process():
    """The server's mode: the background thread hands each recalibration to a spawned process
    (off this process's GIL) and installs what it returns; prime() still calibrates here."""
    import os

    from sage_tfx.dnd import spam
    state, rng = _state()
    check = SpamCheck.for_config(CFG, background=True, process=True)
    check.prime(state, in_flight=0)
    for u in _updates(state, rng, 12):  # the 11th check starts the recalibration due at k/2
        check.check(state, u, in_flight=0)
    assert check.wait_idle(120)
    assert check.calibrations == 2 and check._cal.key == check.key(state.k, state.dim)
    pids = list(spam._calibration_process()._processes)
    assert pids and os.getpid() not in pids
