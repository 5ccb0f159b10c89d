"""Principals, roles and bindings: an unauthenticated or wrong-role caller changes nothing."""
import pytest

from sage_tfx.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from sage_tfx.ledger import BlockSpec, Window, access, open_ledger


def _setup(url):
    """A ledger with a stream, an admin, two pipelines (one bound), an auditor and a client."""
    led = open_ledger(url)
    assert led.open_mode and led.principal.name == "local"
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, contexts=("team-a", "team-b"))
    led.add_blocks("s", [BlockSpec(f"b{i}", f"/d/b{i}", records=10) for i in range(4)])
    with pytest.raises(InvalidRequestError, match="must hold the admin role"):
        led.add_principal("p0", ["pipeline"])
    tokens = {"root": led.add_principal("root", ["admin"])}
    for name, roles in (("pa", ["pipeline"]), ("pb", ["pipeline"]), ("aud", ["auditor"]),
                        ("cl", ["client"])):
        tokens[name] = led.add_principal(name, roles)
    led.bind("pa", "s", "team-a")
    led.close()
    return tokens


def test_open_mode_until_the_first_admin(ledger_url):
    tokens = _setup(ledger_url)
    with pytest.raises(AuthenticationError, match="has principals"):
        open_ledger(ledger_url)
    with pytest.raises(AuthenticationError, match="unknown token"):
        open_ledger(ledger_url, token="sage_not-a-token")
    root = open_ledger(ledger_url, token=tokens["root"])
    assert not root.open_mode and root.principal.roles == frozenset({"admin"})
    stored = root._q("SELECT token_sha256 FROM principals").fetchall()
    assert all(t not in str(stored) for t in tokens.values())  # only digests are kept
    assert {p.name for p in root.principals()} == {"root", "pa", "pb", "aud", "cl"}
    assert root.bindings("pa") == [("pa", "s", "team-a")]


def test_a_pipeline_charges_only_its_bound_contexts(ledger_url):
    tokens = _setup(ledger_url)
    pa = open_ledger(ledger_url, token=tokens["pa"])
    d = pa.request("s", run_id="r1", window=Window(last=2), epsilon=0.1, context="team-a")
    assert d.granted
    entry = [e for e in open_ledger(ledger_url, token=tokens["aud"]).audit_log("s")
             if e.kind == "grant"][-1]
    assert entry.payload["principal"] == "pa"
    pa.record_release(d.grant.grant_id, "out", value=b"1")
    before = len(open_ledger(ledger_url, token=tokens["root"]).audit_log())
    with pytest.raises(PermissionDeniedError, match="not bound"):
        pa.request("s", run_id="r2", window=Window(last=2), epsilon=0.1, context="team-b")
    pb = open_ledger(ledger_url, token=tokens["pb"])
    with pytest.raises(PermissionDeniedError, match="not bound"):
        pb.request("s", run_id="r3", window=Window(last=2), epsilon=0.1, context="team-a")
    with pytest.raises(PermissionDeniedError):
        pb.record_release(d.grant.grant_id, "out2", value=b"2")
    with pytest.raises(PermissionDeniedError):
        pb.grant(d.grant.grant_id)
    for call in (lambda: pa.create_stream("t", epsilon_g=1, delta_g=0),
                 lambda: pa.add_blocks("s", [BlockSpec("x", "/x")]),
                 lambda: pa.retire_block("s", "b0", "no"),
                 lambda: pa.add_principal("evil", ["admin"]),
                 lambda: pa.bind("pa", "s", "team-b"),
                 lambda: pa.audit_log(),
                 lambda: pa.grants("s")):
        with pytest.raises(PermissionDeniedError):
            call()
    root = open_ledger(ledger_url, token=tokens["root"])
    assert len(root.audit_log()) == before
    assert [b.charges for b in root.blocks("s", "team-b")] == [0, 0, 0, 0]
    assert root.check_consistency("s") == []


def test_auditor_and_client_roles(ledger_url):
    tokens = _setup(ledger_url)
    aud = open_ledger(ledger_url, token=tokens["aud"])
    assert aud.verify_audit().ok and aud.check_consistency("s") == []
    assert len(aud.blocks("s", "team-b")) == 4
    with pytest.raises(PermissionDeniedError, match="needs one of"):
        aud.request("s", run_id="r", window=Window(last=1), epsilon=0.1, context="team-a")
    cl = open_ledger(ledger_url, token=tokens["cl"])
    for call in (lambda: cl.blocks("s", "team-a"), lambda: cl.audit_log(),
                 lambda: cl.request("s", run_id="r", window=Window(last=1), epsilon=0.1,
                                    context="team-a")):
        with pytest.raises(PermissionDeniedError):
            call()
    assert cl.authenticate(tokens["pa"]).name == "pa"  # what a service checks


def test_disable_rotate_and_env_tokens(ledger_url, monkeypatch, tmp_path):
    tokens = _setup(ledger_url)
    root = open_ledger(ledger_url, token=tokens["root"])
    new = root.rotate_token("pa")
    with pytest.raises(AuthenticationError):
        open_ledger(ledger_url, token=tokens["pa"])
    monkeypatch.setenv(access.TOKEN_ENV, new)
    assert open_ledger(ledger_url).principal.name == "pa"
    monkeypatch.delenv(access.TOKEN_ENV)
    (tmp_path / "tok").write_text(tokens["aud"] + "\n")
    monkeypatch.setenv(access.TOKEN_FILE_ENV, str(tmp_path / "tok"))
    assert open_ledger(ledger_url).principal.name == "aud"
    root.disable_principal("aud")
    with pytest.raises(AuthenticationError, match="disabled"):
        open_ledger(ledger_url)
    with pytest.raises(InvalidRequestError):
        root.disable_principal("nobody")
    with pytest.raises(InvalidRequestError):
        root.add_principal("x", ["superuser"])
    kinds = [e.kind for e in root.audit_log()]
    assert "principal_rotate" in kinds and "principal_disable" in kinds
    assert root.verify_audit().ok
