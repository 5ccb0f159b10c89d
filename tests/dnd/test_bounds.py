"""Bounded influence: the per-update norm bound and the per-client rate limit.

* the norm bound of each unit holds for honest updates (the secure samplers and the seeded ones)
  at its stated tail, and refuses scaled and boosted updates;
* a refused update changes nothing: no pass counted, no instance overwritten, the ticket still
  outstanding and usable;
* the step is measured from the instance the ticket drew, even after it was overwritten;
* the rate limit is shared by two services and two server processes on one database: 429 with
  Retry-After, never 5xx, nothing counted for a limited draw.
"""
import math

import httpx
import numpy as np
import pytest
from dndtest import STREAM, bearer, make_ledger, serving

from sage_tfx import services
from sage_tfx.dnd import ClientConfig, GLMSpec
from sage_tfx.dnd.client import add_noise
from sage_tfx.dnd.runstore import RateLimit, RateLimitedError, RunStore
from sage_tfx.dnd.server import BINARY, TICKET_HEADER, build_service, create_app, encode
from sage_tfx.dnd.service import UpdateOutOfBoundsError
from sage_tfx.dnd.spam import NormBound
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.streams import HashBucketScheme

SPEC = GLMSpec("logistic", 386)
CFG = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
GAUSS = ClientConfig(0.05, epsilon=8.0, unit="gaussian", delta=1e-7, l2_norm_clip=2.0)
SCHEME = HashBucketScheme("client_id", 4, "dnd")


def _honest_steps(config, dim, n, rng):
    """n honest updates of the zero model: a full-size clipped step in a random direction plus
    the unit's noise (the secure sampler for the gaussian unit, seeded Laplace otherwise)."""
    noise = SeededNoise(int(rng.integers(1 << 30)))
    out = []
    for _ in range(n):
        g = rng.normal(size=dim)
        if config.gaussian:
            g *= config.clip / np.linalg.norm(g)
        elif config.unit == "feature":
            g = np.sign(g) * config.clip
        else:
            g *= config.clip / np.abs(g).sum()
        stepped = -config.gamma * g
        out.append(add_noise(stepped, config, None if config.gaussian else noise))
    return np.stack(out)


@pytest.mark.parametrize("config", [GAUSS, CFG, ClientConfig(0.001, 1.0, 0.5, "feature")],
                         ids=["gaussian", "model", "feature"])
def test_honest_updates_pass_the_norm_bound_and_boosted_ones_do_not(config):
    dim = 2000
    rng = np.random.default_rng(7)
    bound = NormBound.for_config(config, dim)
    steps = _honest_steps(config, dim, 400, rng)
    zero = np.zeros(dim)
    sizes = np.array([bound.measure(zero, u) for u in steps])
    assert np.all(sizes <= bound.limit)  # P(any of 400 fails) ≤ 4e-4
    assert all(bound.violation(zero, u) is None for u in steps)  # the L∞ limit too
    # The bound is tight enough to matter: the noise norm concentrates near its mean, and the
    # noise term is within 15 % of the largest honest step measured (the step term is the
    # triangle inequality's worst case: d·γC for the feature unit, small for the others).
    assert bound.noise <= 1.15 * sizes.max() and bound.step < 0.05 * bound.noise or \
        config.unit == "feature"
    # At a loose tail the stated exceedance is an upper bound of the measured one.
    loose = NormBound.for_config(config, dim, alpha=0.2)
    assert np.mean(sizes > loose.limit) <= 0.2 + 3 * math.sqrt(0.2 * 0.8 / len(sizes))
    # The same for one weight (L∞, α/2 = 0.1), and for the Laplace units (whose union bound over
    # weights is nearly exact) not vacuous: the noise term alone is exceeded a few % of the time.
    tops = np.abs(steps).max(axis=1)
    assert np.mean(tops > loose.linf_limit) <= 0.1 + 3 * math.sqrt(0.1 * 0.9 / len(tops))
    if not config.gaussian:
        assert np.mean(tops > loose.linf_noise) >= 0.03
    # Boosted (noise ×1.3) and scaled (×10) updates are refused with the reason.
    for bad in (1.3 * steps[0], 10 * steps[1]):
        reason = bound.violation(zero, bad)
        assert reason is not None and bound.norm.upper() in reason


@pytest.mark.parametrize("config", [GAUSS, CFG, ClientConfig(0.001, 1.0, 0.5, "feature")],
                         ids=["gaussian", "model", "feature"])
def test_a_push_of_one_weight_within_the_norm_is_refused_by_the_per_weight_limit(config):
    """A weight pushed past the L∞ limit is refused even when the update's L1 / L2 norm is
    within the bound: the push does not rely on the spam check, whose spread an accepted push
    widens. The L∞ limit at 50,000 weights is ~26 noise scales (Laplace) or ~7.3 σ (gaussian)."""
    dim = 2000
    bound = NormBound.for_config(config, dim)
    steps = _honest_steps(config, dim, 50, np.random.default_rng(11))
    zero = np.zeros(dim)
    u = steps[np.argmin([bound.measure(zero, v) for v in steps])].copy()
    u[7] = 1.05 * bound.linf_limit
    assert bound.measure(zero, u) <= bound.limit  # the norm alone would let it through
    reason = bound.violation(zero, u)
    assert reason is not None and "weight 7" in reason
    u[7] = 0.9 * bound.linf_limit  # within both
    assert bound.violation(zero, u) is None
    big = NormBound.for_config(config, 50_000)
    assert big.linf_noise < (27 if not config.gaussian else 7.5) * config.noise_scale


def test_norm_bound_input():
    with pytest.raises(ValueError):
        NormBound.for_config(GAUSS, 0)
    with pytest.raises(ValueError):
        NormBound.for_config(GAUSS, 10, alpha=0.0)


def _service(p, run_id="b1", passes=3, config=CFG, spec=SPEC, **kw):
    return build_service(ledger_url=p.url, stream=STREAM, run_id=run_id, spec=spec,
                         config=config, k=10, passes=passes, window_last=4, block_scheme=SCHEME,
                         token=p.server, **kw)


def _snapshot(service):
    store, gid = service.store, service.grant_id
    return (store.passes(gid), store.instance_versions(gid), store.run(gid).accepted,
            store.run(gid).rejected, store.outstanding(gid))


def test_a_refused_update_changes_nothing_and_its_ticket_stays_usable(principals):
    p = principals
    service = _service(p)
    ticket, w = service.draw("alice")
    before = _snapshot(service)
    for bad in (10 * w + 1.0, w + SeededNoise(3).laplace(np.zeros_like(w), 3 * CFG.noise_scale)):
        with pytest.raises(UpdateOutOfBoundsError, match="from the drawn instance"):
            service.discard("alice", ticket, bad)
        assert _snapshot(service) == before
    assert service.stats()["out_of_bounds"] == 2
    # the same ticket still takes an honest update
    assert service.discard("alice", ticket, SeededNoise(4).laplace(w, CFG.noise_scale)) in (
        True, False)
    assert service.store.passes(service.grant_id)["alice"] == (1, 1)
    assert service.store.problems(service.grant_id) == []


def test_the_step_is_measured_from_the_drawn_instance_after_it_is_overwritten(sqlite_url):
    """Every outstanding ticket's drawn instance is recoverable byte for byte while accepted
    updates overwrite instances; the kept copies go with the last ticket that drew them."""
    p = make_ledger(sqlite_url, clients=[f"c{i}" for i in range(40)])
    service = _service(p, passes=1, spam_check=False)
    drawn = {f"c{i}": service.draw(f"c{i}") for i in range(40)}
    gid = service.grant_id
    noise = SeededNoise(5)
    store = RunStore(p.url)

    def kept():
        return tuple(store._read(lambda: store._q(
            "SELECT (SELECT count(*) FROM dnd_retired), (SELECT count(*) FROM dnd_drawn)"
        ).fetchone()))
    for name in list(drawn)[:30]:  # 30 accepted updates overwrite random slots of the k = 10
        ticket, w = drawn.pop(name)
        assert service.discard(name, ticket, noise.laplace(w, CFG.noise_scale))
    assert kept()[0] > 0 and kept()[1] == 10  # some drawn instances were overwritten
    for name, (ticket, w) in drawn.items():
        assert np.array_equal(service.store.drawn_instance(gid, name, ticket, SPEC.dim), w)
        assert service.discard(name, ticket, noise.laplace(w, CFG.noise_scale))
    try:
        assert kept() == (0, 0)  # without a sweep
    finally:
        store.close()
    assert service.store.problems(gid) == []


def _clock(*services_, start=1_000_000.25):
    """A fixed database clock for the services' stores (SQLite's time is this machine's)."""
    now = [start]
    for svc in services_:
        svc.store._time = lambda: now[0]
    return now


def test_rate_limit_is_shared_by_two_services_on_one_database(principals):
    p = principals
    rate = RateLimit(3, 2.0)
    one = _service(p, passes=20, rate=rate)
    two = _service(p, passes=20, rate=rate)  # the same run (the grant replayed)
    assert one.grant_id == two.grant_id
    now = _clock(one, two)
    for svc in (one, two, one):
        svc.draw("alice")
    before = one.store.passes(one.grant_id)
    with pytest.raises(RateLimitedError) as caught:
        two.draw("alice")
    assert caught.value.retry_after == pytest.approx(1.75)  # the window is [1e6, 1e6 + 2)
    assert one.store.passes(one.grant_id) == before  # a limited draw counts nothing
    two.draw("bob")  # another principal has its own count
    now[0] += caught.value.retry_after
    one.draw("alice")  # the next window
    two.draw("alice")
    now[0] += 0.5
    with pytest.raises(RateLimitedError):
        one.draw("alice")
        one.draw("alice")


def test_rate_limit_input():
    for bad in ((0, 60.0), (True, 60.0), (3, 0.0), (3, -1.0), (3, 1e9)):
        with pytest.raises(InvalidRequestError):
            RateLimit(*bad)


def test_http_answers_429_with_retry_after_and_422_for_an_out_of_bounds_update(principals):
    p = principals
    spec = GLMSpec("multinomial", 64, 10)
    service = _service(p, config=GAUSS, spec=spec, rate=RateLimit(2, 60.0))
    _clock(service, start=6_000_001.0)
    app = create_app(service, services.Authenticator(p.url, token=p.server, cache_seconds=0))
    alice = bearer(p.client("alice"))
    with serving(app) as base, httpx.Client(base_url=base) as c:
        r = c.post("/v1/draw", headers={"accept": BINARY, **alice})
        w = np.frombuffer(r.content, "<f8")
        far = c.post(f"/v1/discard/{r.headers[TICKET_HEADER]}", content=encode(w + 1.0),
                     headers={"content-type": BINARY, **alice})
        assert far.status_code == 422 and "L2 from the drawn instance" in far.json()["refused"]
        assert c.post("/v1/draw", headers=alice).status_code == 200
        limited = c.post("/v1/draw", headers=alice)
        assert limited.status_code == 429 and "limit is 2" in limited.json()["refused"]
        assert limited.headers["retry-after"] == "59"
        stats = c.get("/v1/stats", headers=bearer(p.pipeline)).json()
        assert stats["draws"] == 2 and stats["updates"] == 0 and stats["out_of_bounds"] == 1


def test_rate_limit_across_two_server_processes(ledger_url):
    from test_server_restart import server_process
    p = make_ledger(ledger_url, clients=["alice"])
    # a one-day window (aligned on the database clock's days): the 8 draws do not straddle two
    extra = ("--rate-limit", "4", "--rate-window", "86400")
    alice = bearer(p.client("alice"))
    with server_process(p, passes=50, extra=extra) as (_, base1), \
            server_process(p, passes=50, extra=extra) as (_, base2), \
            httpx.Client(timeout=60) as c:
        codes = [c.post(f"{b}/v1/draw", headers=alice).status_code
                 for b in (base1, base2) * 4]
        assert codes == [200] * 4 + [429] * 4


def test_a_draw_of_a_process_without_the_bound_is_checked_by_one_with_it(principals):
    p = principals
    off = _service(p, norm_bound=False)
    on = _service(p)
    ticket, w = off.draw("alice")
    assert off.discard("alice", ticket, 10 * w + 1.0) is False  # only the spam check there
    ticket, w = off.draw("alice")
    with pytest.raises(UpdateOutOfBoundsError):
        on.discard("alice", ticket, 10 * w + 1.0)
    assert on.store.passes(on.grant_id)["alice"] == (1, 2)


def test_the_drawn_instance_comes_from_memory_when_known_and_equals_the_stored_one(sqlite_url):
    """The norm bound reads a ticket's drawn instance from this process's memory (the mirror, or
    an instance it overwrote since) when it has that version, else from the database: the same
    bytes either way; a second service on the database sees the first's updates."""
    p = make_ledger(sqlite_url, clients=[f"c{i}" for i in range(30)])
    service = _service(p, passes=1, spam_check=False)
    other = _service(p, passes=1, spam_check=False)  # another process on the same run
    drawn = {f"c{i}": service.draw(f"c{i}") for i in range(30)}
    noise = SeededNoise(9)
    for name in list(drawn)[:20]:
        ticket, w = drawn.pop(name)
        assert service.discard(name, ticket, noise.laplace(w, CFG.noise_scale))
    gid, hits = service.grant_id, []

    def known(slot, version):
        hit = service._known(slot, version)
        hits.append(hit is not None)
        return hit
    for name, (ticket, w) in drawn.items():
        from_memory = service.store.drawn_instance(gid, name, ticket, SPEC.dim, known=known)
        stored = service.store.drawn_instance(gid, name, ticket, SPEC.dim)
        assert np.array_equal(from_memory, w) and np.array_equal(stored, w)
    assert all(hits)  # every drawn version is still in this process's memory
    service._recent.clear()
    hits.clear()
    for name, (ticket, w) in drawn.items():  # overwritten ones now come from the database
        assert np.array_equal(service.store.drawn_instance(gid, name, ticket, SPEC.dim,
                                                           known=known), w)
    assert not all(hits)
    name, (ticket, w) = next(iter(drawn.items()))
    assert other.discard(name, ticket, noise.laplace(w, CFG.noise_scale))
    service._sync()
    rows = service.store.instances(gid, SPEC.dim)
    assert np.array_equal(service._mirror.instances_view(), np.stack([r[2] for r in rows]))
