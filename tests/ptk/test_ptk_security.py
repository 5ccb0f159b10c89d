"""The PTK store under a caller who does not cooperate: no client-named code runs, every endpoint
authenticates by role, every bad input is a 4xx that changes nothing, window data is encrypted."""
import builtins
import importlib
import json
import os

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sage_tfx import services
from sage_tfx.ledger import open_ledger
from sage_tfx.ptk import TypeRegistry, UnknownPTKTypeError
from sage_tfx.ptk.registry import parse_type_specs, registry_from
from sage_tfx.ptk.service import create_app

from ptk_data import HS, HS_CONFIG, window
from test_ptk_store import snapshot


def columns(n, seed):
    return {k: v.tolist() for k, v in window(n, seed).items()}


@pytest.fixture
def served(make_store, tmp_path):
    """An open-mode store behind its app, a client with the service's token, and the store."""
    store = make_store()
    app = create_app(store, auth=services.Authenticator(
        store.url, open_token_file=str(tmp_path / "token")))
    client = TestClient(app)
    client.headers["Authorization"] = f"Bearer {app.state.auth.open_token}"
    with client:
        yield client, store


class Spy:
    """Records calls to importlib.import_module and builtins.eval / exec while active."""

    def __init__(self, monkeypatch):
        self.calls = []
        real_import = importlib.import_module
        for mod, name, real in ((importlib, "import_module", real_import),
                                (builtins, "eval", builtins.eval),
                                (builtins, "exec", builtins.exec)):
            def spy(*a, _name=name, _real=real, **kw):
                self.calls.append((_name, a[:1]))
                return _real(*a, **kw)
            monkeypatch.setattr(mod, name, spy)


def test_the_builtins_eval_payload_is_refused_before_any_import(served, monkeypatch, tmp_path):
    client, store = served
    store.advance_window(window(10000, 0), user_key="user")
    before = snapshot(store)
    marker = tmp_path / "pwned"
    code = f"__import__('os').system('touch {marker}')"
    payloads = [  # the reported one, and the same idea through every field that names a type
        {"train_dp_fn": f"sage_tfx.ptk.kernels.{HS}:train_dp",
         "eval_fn": f"sage_tfx.ptk.kernels.{HS}:eval", "dp_event_fn": "builtins:eval",
         "tau": 0.2, "menu": [[code, 1]]},
        {"ptk_type": "builtins:eval", "tau": 0.2, "menu": [{"epsilon": 0.5, "n": 100}],
         "config": {"x": code}},
        {"ptk_type": "os:system", "tau": 0.2},
        {"ptk_type": HS, "tau": 0.2, "dp_event_fn": "builtins:eval"},
        {"ptk_type": "builtins", "tau": 0.2},
    ]
    spy = Spy(monkeypatch)
    for body in payloads:
        r = client.post("/ptks", json=body)
        assert r.status_code in (400, 422), (body, r.status_code, r.text)
    assert spy.calls == [] and not marker.exists()
    with pytest.raises(UnknownPTKTypeError):  # the library refuses the same before importing
        store.register_ptk("builtins:eval", tau=0.2, menu=[(0.5, 100)])
    with pytest.raises(TypeError):  # the old keyword arguments are gone
        store.register_ptk(HS, tau=0.2, dp_event_fn="builtins:eval")
    assert spy.calls == [] and not marker.exists()
    assert snapshot(store) == before


def test_operator_types_by_python_flag_or_environment(make_store, monkeypatch, tmp_path):
    import types
    mod = types.ModuleType("operator_kernel")
    from sage_tfx.ptk.kernels import histstats
    for f in ("train_dp", "eval", "dp_event", "erm", "featurize"):
        setattr(mod, f, getattr(histstats, f))
    monkeypatch.setitem(__import__("sys").modules, "operator_kernel", mod)
    assert parse_type_specs("mine=operator_kernel, operator_kernel") == [
        ("mine", "operator_kernel"), ("operator_kernel", "operator_kernel")]
    monkeypatch.setenv("SAGE_PTK_TYPES", "from_env=operator_kernel")
    reg = registry_from([("from_flag", "operator_kernel")])
    reg.register("in_python", train_dp=histstats.train_dp, eval=histstats.eval,
                 dp_event=histstats.dp_event)
    assert {"from_env", "from_flag", "in_python", HS} <= set(reg.names())
    with pytest.raises(ValueError):  # no silent replacement of a registered type
        reg.register_module("operator_kernel", "from_flag")
    store = make_store(registry=reg)
    store.advance_window(window(10000, 0), user_key="user")
    for name in ("from_env", "from_flag", "in_python"):
        assert store.register_ptk(name, config=HS_CONFIG, tau=0.2, menu=[(0.25, 500)]) \
            .startswith("ptk-")
    out = store.advance_window(window(10000, 1), user_key="user")
    assert len([t for t in out.trained if t.trained]) == 3
    assert not TypeRegistry(builtins=False).names()


def test_unauthenticated_and_wrong_role_calls_change_nothing(make_store, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as led:
        root = led.add_principal("root", ["admin"])
    monkeypatch.setenv("SAGE_LEDGER_TOKEN", root)   # the store's own credential
    store = make_store(url=url)
    with open_ledger(url, token=root) as led:
        tok = {n: led.add_principal(n, r) for n, r in (
            ("pipe", ["pipeline"]), ("loose", ["pipeline"]), ("aud", ["auditor"]),
            ("cli", ["client"]))}
        led.bind("pipe", store.cfg.stream, "default")
    store.advance_window(window(10000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 1000)])
    store.advance_window(window(10000, 1), user_key="user")
    app = create_app(store, auth=services.Authenticator(url, token=root, cache_seconds=0))
    c = TestClient(app)
    reg = {"ptk_type": HS, "tau": 0.2, "config": HS_CONFIG, "menu": [{"epsilon": 0.5, "n": 1000}]}
    calls = {  # endpoint -> (method, path, body)
        "register": ("post", "/ptks", reg),
        "deregister": ("delete", f"/ptks/{pid}", None),
        "config": ("put", f"/ptks/{pid}/config", {"config": dict(HS_CONFIG, upper=11.0)}),
        "tau": ("put", f"/ptks/{pid}/tau", {"tau": 0.3}),
        "subscribe": ("post", f"/ptks/{pid}/subscriptions", {"endpoint": "http://127.0.0.1:9/"}),
        "notify": ("post", f"/ptks/{pid}/notify", None),
        "get": ("get", f"/ptks/{pid}", None),
        "lineage": ("get", f"/ptks/{pid}/lineage", None),
        "plan": ("get", "/plan", None),
        "types": ("get", "/ptk-types", None),
        "windows": ("post", "/windows", {"columns": columns(500, 2), "user_key": "user"}),
    }
    allowed = {  # who gets past authentication and the role check
        "pipe": set(calls), "loose": {"subscribe", "notify", "get", "lineage", "plan", "types"},
        "aud": {"lineage", "plan"}, "cli": set()}

    def send(name, headers):
        method, path, body = calls[name]
        kw = {"json": body} if body is not None else {}
        return getattr(c, method)(path, headers=headers, **kw) if method != "delete" else \
            c.delete(path, headers=headers)

    before = snapshot(store)
    for name in calls:
        for headers in ({}, {"Authorization": "Bearer sage_not-a-token"},
                        {"Authorization": root}):  # no scheme
            r = send(name, headers)
            assert r.status_code == 401, (name, headers, r.status_code)
        for who, ok in allowed.items():
            if name in ok:
                continue
            r = send(name, {"Authorization": f"Bearer {tok[who]}"})
            assert r.status_code == 403, (name, who, r.status_code, r.text)
    assert snapshot(store) == before
    h = {"Authorization": f"Bearer {tok['pipe']}"}
    assert c.get("/health").status_code == 401   # every endpoint authenticates
    assert c.get("/health", headers=h).json() == {"ok": True}   # and says nothing else
    assert c.get(f"/ptks/{pid}", headers=h).json()["version"] == 1
    assert c.get("/plan", headers={"Authorization": f"Bearer {tok['aud']}"}).status_code == 200
    r = c.post("/ptks", json=reg, headers=h)
    assert r.status_code == 201, r.text


def test_bad_input_is_a_4xx_and_changes_nothing(served):
    client, store = served
    store.advance_window(window(10000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 1000)])
    before = snapshot(store)
    ok = {"ptk_type": HS, "tau": 0.2, "config": HS_CONFIG}

    def menu(eps, n):
        return dict(ok, menu=[{"epsilon": eps, "n": n}])

    raw = {  # bodies as JSON text (Infinity / NaN are not JSON, Python's parser takes them)
        "n = Infinity": '{"ptk_type": "histstats", "tau": 0.2, "menu": [{"epsilon": 0.5, '
                        '"n": Infinity}]}',
        "epsilon = NaN": '{"ptk_type": "histstats", "tau": 0.2, "menu": [{"epsilon": NaN, '
                         '"n": 100}]}',
        "tau = Infinity": '{"ptk_type": "histstats", "tau": Infinity}',
    }
    bodies = {
        "n = 2.5": menu(0.5, 2.5), "n = true": menu(0.5, True), "n = '500'": menu(0.5, "500"),
        "n = 10**400": menu(0.5, 10**400), "n = 2**53 + 1": menu(0.5, 2**53 + 1),
        "epsilon = 0": menu(0, 100), "epsilon = '0.5'": menu("0.5", 100),
        "menu not a list": dict(ok, menu=5), "menu an object": dict(ok, menu={"a": 1}),
        "menu of pairs": dict(ok, menu=[[0.5, 100]]), "empty menu": dict(ok, menu=[]),
        "menu entry with more": dict(ok, menu=[{"epsilon": 0.5, "n": 100, "x": 1}]),
        "tau = true": dict(ok, tau=True),
        "tau = '0.2'": dict(ok, tau="0.2"), "tau = 0": dict(ok, tau=0),
        "tau = 2": dict(ok, tau=2), "frequency = 1.0": dict(ok, train_frequency=1.0),
        "frequency = true": dict(ok, train_frequency=True),
        "config a list": dict(ok, config=[1, 2]), "config a string": dict(ok, config="x"),
        "config deep": dict(ok, config={"a": [[["x"]]]}),
        "unknown field": dict(ok, eval_fn="x"), "ptk_type a list": dict(ok, ptk_type=[HS]),
        "no ptk_type": {"tau": 0.2}, "body a list": [ok], "bad ptk_id": dict(ok, ptk_id="x"),
        "a config the kernel refuses": dict(ok, config={"key": "city"}),
        "a config with the wrong types": dict(ok, config=dict(HS_CONFIG, lower="low")),
        "an unknown type": dict(ok, ptk_type="nope"),
        "a config naming a column the windows lack": menu(0.5, 100) | {
            "config": dict(HS_CONFIG, key="nonexistent")},
        "bounds with an infinite noise scale": menu(0.5, 100) | {
            "config": dict(HS_CONFIG, lower=-1e308, upper=1e308)},
    }
    for what, text in raw.items():
        r = client.post("/ptks", content=text, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
    for what, body in bodies.items():
        r = client.post("/ptks", json=body)
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
    cols = columns(200, 5)
    windows = {
        "nested rows": {"columns": {"a": [[1, 2], [3, 4]]}},
        "rows of objects": {"columns": {"a": [{"x": 1}]}},
        "user_key a list": {"columns": cols, "user_key": ["user"]},
        "user_key not a column": {"columns": cols, "user_key": "nope"},
        "columns a list": {"columns": [cols["user"]]},
        "unequal columns": {"columns": {"a": [1, 2], "b": [1]}},
        "mixed column": {"columns": {"a": [1, "x"]}}, "booleans": {"columns": {"a": [True]}},
        "empty column": {"columns": {"a": []}}, "no columns": {"columns": {}},
        "window index true": {"columns": cols, "window_index": True},
        "an old window index": {"columns": cols, "window_index": 0},
        "a schema the PTK cannot train on": {"columns": dict(cols, delay=["x"] * 200)},
        "a missing column": {"columns": {k: v for k, v in cols.items() if k != "city"}},
    }
    for what, body in windows.items():
        r = client.post("/windows", json=body)
        assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
    for path, body in ((f"/ptks/{pid}/config", {"config": [1]}),
                       (f"/ptks/{pid}/config", {"config": {"key": "city"}}),
                       (f"/ptks/{pid}/tau", {"tau": float("nan")}),
                       (f"/ptks/{pid}/tau", {"tau": "0.3"})):
        r = client.put(path, json=body) if "NaN" not in json.dumps(body, allow_nan=True) else \
            client.put(path, content='{"tau": NaN}', headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500, (path, body, r.status_code)
    for path in ("/ptks/nope", "/ptks/ptk-nope", "/ptks/ptk-nope/lineage"):
        assert client.get(path).status_code in (404, 422)
    assert client.get(f"/ptks/{pid}?version=0").status_code == 422
    assert client.get(f"/ptks/{pid}?version=true").status_code == 422
    assert client.post(f"/ptks/{pid}/subscriptions", json={"endpoint": "ftp://x"}).status_code \
        == 422
    # bodies past the limits: 413 before they are read (the 20-32 MB bodies of the report)
    big = json.dumps(dict(ok, name="x" * (20 * 1024 * 1024)))
    r = client.post("/ptks", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = client.post("/windows", content=b"{" + b" " * (33 * 1024 * 1024) + b"}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert snapshot(store) == before


def test_openapi_bodies_are_typed(served):
    client, _ = served
    for open_route in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        assert client.get(open_route, headers={"Authorization": ""}).status_code in (401, 404)
    spec = client.get("/openapi.json").json()
    comps = spec["components"]["schemas"]
    reg = comps["RegisterRequest"]
    assert reg["additionalProperties"] is False and set(reg["required"]) == {"ptk_type", "tau"}
    assert reg["properties"]["tau"]["exclusiveMinimum"] == 0
    menu = reg["properties"]["menu"]["anyOf"][0]
    assert menu["maxItems"] == 64 and menu["items"]["$ref"].endswith("/MenuEntry")
    assert comps["MenuEntry"]["properties"]["n"]["type"] == "integer"
    cols = comps["Window"]["properties"]["columns"]
    (column,) = cols["patternProperties"].values()
    assert column["type"] == "array" and cols["maxProperties"] == 256
    assert {t["type"] for t in column["items"]["anyOf"]} == {"integer", "number", "string"}
    assert spec["components"]["securitySchemes"]["sageBearer"]["scheme"] == "bearer"
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert op.get("security") == [{"sageBearer": []}], path
            assert not [p for p in op.get("parameters", []) if p["in"] == "header"], path
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            assert body.get("schema", {}).get("$ref", "").startswith("#/components/schemas/") \
                or not body, (path, method)


def test_window_files_are_encrypted_and_shredded(make_store, tmp_path):
    store = make_store()
    cols = window(4000, 0)
    store.advance_window(cols, user_key="user")
    info = store.lake.window(0)
    users = [u.encode() for u in cols["user"][:200]]
    for path in info.files:
        data = open(path, "rb").read()
        assert not any(u in data for u in users) and not data.startswith(b"PK")  # no npz/zip
        with pytest.raises(Exception):
            np.load(path, allow_pickle=False)
    kek_id, wrapped = store.lake.window_key(0)
    assert kek_id.startswith("file:") and "user" not in wrapped
    block = info.blocks[0][0]
    got = store.windows.files.read_block(0, block, info.files[0])
    assert len(next(iter(got.values()))) == info.blocks[0][2]
    # a block file under another block's name does not decrypt (associated data)
    with pytest.raises(ValueError):
        store.windows.files.read_block(0, info.blocks[1][0], info.files[0])
    copies = {p: open(p, "rb").read() for p in info.files[:3]}
    store.windows.close()
    assert store.lake.window_key(0) is None and not any(os.path.exists(p) for p in copies)
    fresh = make_store(data=tmp_path / "elsewhere")   # files kept by an attacker: unreadable
    for p, data in copies.items():
        open(p, "wb").write(data)
        with pytest.raises(ValueError, match="destroyed"):
            fresh.windows.files.read_block(0, block, p)


def test_kek_rotation_rewraps_open_window_keys(make_store, tmp_path, monkeypatch):
    """`sage-tfx keys rotate` re-wraps an open window's key: the old KEK version is destroyed and
    the window's files still read."""
    from sage_tfx.ledger import blockkeys, keys
    monkeypatch.setenv(keys.PROVIDER_ENV, f"file:{tmp_path}/kek.json")
    store = make_store()
    store.advance_window(window(4000, 0), user_key="user")
    info = store.lake.window(0)
    old_kek, old_wrapped = store.lake.window_key(0)
    kek = keys.provider()
    report = blockkeys.rotate_kek(store.ledger, kek)
    assert report["destroyed"] and report["others"]["ptk_window_keys"] == 1
    new_kek, new_wrapped = store.lake.window_key(0)
    assert new_kek == kek.kek_id != old_kek and new_wrapped != old_wrapped
    store.windows.files.forget(0)
    block = info.blocks[0][0]
    got = store.windows.files.read_block(0, block, info.files[0])
    assert len(next(iter(got.values()))) == info.blocks[0][2]
    with pytest.raises(Exception, match="does not open"):
        keys.DataKey.unwrap(kek, old_wrapped.encode(),
                            keys.aad_for("ptk", store.windows.files.stream,
                                                                    "w000000"))


def test_authentication_comes_before_the_body_and_big_bodies_are_413_chunked_too(
        make_store, tmp_path, monkeypatch):
    """uvicorn on 127.0.0.1: a malformed body without a token is a 401 (it was a 422: FastAPI
    parsed typed bodies before the auth dependency), in the wrong role a 403; an oversized
    chunked body is a 413 (it was a 400), as with Content-Length; nothing changes."""
    import httpx

    from live_http import post_chunked, serving
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as led:
        root = led.add_principal("root", ["admin"])
    monkeypatch.setenv("SAGE_LEDGER_TOKEN", root)
    store = make_store(url=url)
    with open_ledger(url, token=root) as led:
        pipe, cli = led.add_principal("pipe", ["pipeline"]), led.add_principal("cli", ["client"])
        led.bind("pipe", store.cfg.stream, "default")
    store.advance_window(window(5000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 1000)])
    app = create_app(store, auth=services.Authenticator(url, token=root, cache_seconds=0),
                     max_body=4096, max_window_body=64 * 1024)
    routes = [("post", "/ptks"), ("put", f"/ptks/{pid}/config"), ("put", f"/ptks/{pid}/tau"),
              ("post", f"/ptks/{pid}/subscriptions"), ("post", "/windows")]

    def h(token=None):
        return {"Content-Type": "application/json",
                **({"Authorization": f"Bearer {token}"} if token else {})}

    before = snapshot(store)
    with serving(app) as base:
        c = httpx.Client(base_url=base, timeout=60)
        for method, path in routes:
            for body in (b'{"tau": ', b'{"unknown": [1, 2]}', b"null"):
                for token, status in ((None, 401), ("sage_nope", 401), (cli, 403),
                                      (pipe, 422)):
                    r = c.request(method, path, content=body, headers=h(token))
                    assert r.status_code == status, (path, body, token, r.status_code, r.text)
            limit = 64 * 1024 if path == "/windows" else 4096
            big = b'{"tau": 0.2, "name": "' + b"x" * (2 * limit) + b'"}'
            verb = method.upper()
            assert post_chunked(base, path, big, h(), method=verb) == 401, path
            assert post_chunked(base, path, big, h(pipe), method=verb) == 413, path
            assert c.request(method, path, content=big, headers=h(pipe)).status_code == 413
    assert snapshot(store) == before


def test_openapi_documents_every_answer(served):
    """Every route: 401, 403, 413; those with a body 422 (and their body, from components);
    a PTK id 404; the store's refusals 400 and REJECT 409."""
    client, _ = served
    spec = client.get("/openapi.json").json()
    need = {("post", "/ptks"): {"400", "409", "422"},
            ("delete", "/ptks/{ptk_id}"): {"404", "409"},
            ("put", "/ptks/{ptk_id}/config"): {"400", "404", "409", "422"},
            ("put", "/ptks/{ptk_id}/tau"): {"400", "404", "409", "422"},
            ("post", "/ptks/{ptk_id}/subscriptions"): {"400", "404", "422"},
            ("post", "/ptks/{ptk_id}/notify"): {"404"},
            ("get", "/ptks/{ptk_id}"): {"404"}, ("get", "/ptks/{ptk_id}/lineage"): {"404"},
            ("post", "/windows"): {"400", "422", "503"},
            ("get", "/plan"): set(), ("get", "/ptk-types"): set(), ("get", "/health"): set()}
    seen = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert seen == set(need)
    bodies = {("post", "/ptks"): "RegisterRequest", ("put", "/ptks/{ptk_id}/config"):
              "ConfigUpdate", ("put", "/ptks/{ptk_id}/tau"): "TauUpdate",
              ("post", "/ptks/{ptk_id}/subscriptions"): "Subscription",
              ("post", "/windows"): "Window"}
    for (method, path), codes in need.items():
        op = spec["paths"][path][method]
        assert {"401", "403", "413"} | codes <= set(op["responses"]), (method, path)
        if (method, path) in bodies:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{bodies[method, path]}"
            assert op["requestBody"]["required"]
        else:
            assert "requestBody" not in op, (method, path)
    reject = spec["paths"]["/ptks"]["post"]["responses"]["409"]
    assert "reject" in reject["content"]["application/json"]["schema"]["properties"]
