"""Fuzzing every PTK endpoint from its own OpenAPI schema (schemathesis), authenticated: valid
and invalid bodies, paths and queries never get a 5xx, and the ledger stays consistent.

Bounded: a fixed number of examples per operation and mode, no deadline per example, no example
database; it stops by itself (about a minute on a quiet 2-core machine).
"""
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from sage_tfx import services
from sage_tfx.ptk import StoreConfig
from sage_tfx.ptk.service import create_app

from ptk_data import HS, HS_CONFIG, window

pytestmark = pytest.mark.slow
EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 20}
FUZZ = StoreConfig(stream="ptk", epsilon_g=1.0, delta_g=1e-6, n_max=100_000, train_buckets=4,
                   profile_buckets=2, profile_share=0.5, menu=(0.5, 1.0), profile_epsilon=0.1,
                   profile_n_max=16, k_max=2, solve_time_limit=5.0)


def test_fuzzed_requests_never_get_a_5xx(make_store, tmp_path):
    store = make_store(config=FUZZ)
    store.notifier.attempts, store.notifier.backoff = 1, 0.0
    store.notifier.client.timeout = 0.5
    store.advance_window(window(2000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 500)], ptk_id="ptk-fuzz")
    auth = services.Authenticator(store.url, open_token_file=str(tmp_path / "token"))
    app = create_app(store, auth=auth)
    headers = {"Authorization": f"Bearer {auth.open_token}"}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=headers)
    # the credential is the test's own (valid) one; invalid credentials are checked below
    schema.config.generation.update(with_security_parameters=False)
    names = [HS, "covariance", "lloyd", "counts"]
    seen, started = {}, time.monotonic()
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {f"{o.method.upper()} {o.path}" for o in operations} >= {
        "POST /ptks", "DELETE /ptks/{ptk_id}", "PUT /ptks/{ptk_id}/config",
        "PUT /ptks/{ptk_id}/tau", "POST /ptks/{ptk_id}/subscriptions",
        "POST /ptks/{ptk_id}/notify", "GET /ptks/{ptk_id}", "GET /ptks/{ptk_id}/lineage",
        "GET /plan", "GET /ptk-types", "POST /windows", "GET /health"}
    operations.sort(key=lambda o: o.method.upper() == "DELETE")  # deregister the PTK last
    for op in operations:
        for mode, count in EXAMPLES.items():
            @settings(max_examples=count, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode), data=st.data())
            def run(case, data):
                # half of the cases name a real PTK, type, config or window, so the handlers
                # run past their lookups and into the store
                if "ptk_id" in (case.path_parameters or {}) and data.draw(st.booleans()):
                    case.path_parameters["ptk_id"] = pid
                if isinstance(case.body, dict) and "ptk_type" in case.body \
                        and data.draw(st.booleans()):
                    case.body["ptk_type"] = data.draw(st.sampled_from(names))
                    if data.draw(st.booleans()):
                        case.body.update(ptk_type=HS, config=HS_CONFIG)
                if isinstance(case.body, dict) and isinstance(case.body.get("columns"), dict) \
                        and data.draw(st.booleans()):
                    cols = window(data.draw(st.integers(1, 300)), data.draw(st.integers(0, 99)))
                    case.body["columns"] = {k: v.tolist() for k, v in cols.items()}
                    case.body["user_key"] = data.draw(st.sampled_from(["user", None]))
                r = case.call(headers=headers)
                key = f"{op.method.upper()} {op.path} {mode.value}"
                seen.setdefault(key, {}).setdefault(r.status_code, 0)
                seen[key][r.status_code] += 1
                assert r.status_code < 500, (key, case.body, r.status_code, r.text[:500])
            try:
                run()
            except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
                assert mode is GenerationMode.NEGATIVE, op.path
    elapsed = time.monotonic() - started
    print(f"fuzzed {sum(sum(v.values()) for v in seen.values())} requests in {elapsed:.0f}s")
    for key in sorted(seen):
        print(f"  {key}: {seen[key]}")
    assert all(sum(v.values()) >= 1 for v in seen.values())
    assert store.ledger.check_consistency("ptk") == []
    # unauthenticated: every operation is a 401
    for op in operations:
        case = op.as_strategy().example()
        assert case.call().status_code == 401, op.path
