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


def test_a_new_sqlite_ledger_file_is_private(tmp_path):
    """0600 whatever the umask (it was 0644): the file holds wrapped block keys and token
    digests, and whoever may write it may rewrite the ledger. Its WAL, shared memory and lock
    files too; the PTK lake creates the same file the same way."""
    import os
    import stat

    from sage_tfx.ptk.lake import Lake
    old = os.umask(0)
    try:
        led = open_ledger(f"sqlite:///{tmp_path}/a/ledger.db")
        led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
        Lake(f"sqlite:///{tmp_path}/b/ledger.db").close()
    finally:
        os.umask(old)
    files = [tmp_path / "a" / n for n in ("ledger.db", "ledger.db-wal", "ledger.db-shm",
                                          "ledger.db.lock")] + [tmp_path / "b" / "ledger.db"]
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {
        f.name: 0o600 for f in files}
    led.close()


def _raw(url: str, sql: str) -> None:
    """Runs ``sql`` on the ledger's database outside the library (the file's writer on
    SQLite, the owner's role on PostgreSQL)."""
    if url.startswith("sqlite:///"):
        import sqlite3
        conn = sqlite3.connect(url[len("sqlite:///"):], isolation_level=None)
    else:
        import psycopg
        conn = psycopg.connect(url, autocommit=True)
    try:
        conn.execute(sql)
    finally:
        conn.close()


MINE = "sage_" + "m" * 43  # a token the editor knows
EDITS = {
    "a pipeline made admin":
        "UPDATE principals SET roles = '[\"admin\", \"pipeline\"]' WHERE name = 'pa'",
    "the admin's token digest replaced":
        f"UPDATE principals SET token_sha256 = '{access.token_digest(MINE)}' WHERE name = 'root'",
    "a disabled principal enabled": "UPDATE principals SET status = 'active' WHERE name = 'cl'",
    "a principal added": "INSERT INTO principals VALUES ('evil', '[\"admin\"]', "
                         f"'{access.token_digest(MINE)}', 'active', NULL, 't', 't')",
    "a binding added": "INSERT INTO bindings VALUES ('pb', 's', 'team-a', 't')",
    "a binding deleted": "DELETE FROM bindings WHERE principal = 'pa'",
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_verify_reports_principals_or_bindings_edited_outside_the_library(ledger_url, edit,
                                                                          capsys):
    """The audit chain stays intact under such an edit (what 'verify' used to report); the
    access digests recorded with every change say otherwise, and a later change through the
    library does not launder it."""
    from sage_tfx import cli
    tokens = _setup(ledger_url)
    root = open_ledger(ledger_url, token=tokens["root"])
    root.disable_principal("cl")
    aud = open_ledger(ledger_url, token=tokens["aud"])
    assert aud.check_access() == []
    _raw(ledger_url, EDITS[edit])
    (problem,) = aud.check_access()
    assert "outside the library" in problem and aud.verify_audit().ok
    capsys.readouterr()
    assert cli.main(["--ledger", ledger_url, "--token", tokens["aud"], "verify"]) == 4
    out = capsys.readouterr().out
    assert "audit chain: OK" in out and "TAMPERED" in out
    admin = open_ledger(ledger_url, token=MINE if "token" in edit else tokens["root"])
    admin.bind("pb", "s", "team-b")   # the edit's author, now acting through the library
    admin.seal_access()
    assert any("between audit entries" in p for p in aud.check_access())


def test_changes_through_the_library_keep_verify_clean_and_an_old_ledger_is_sealed(
        tmp_path, monkeypatch, capsys):
    from sage_tfx import cli
    from sage_tfx.ledger.access import AccessMixin
    url = f"sqlite:///{tmp_path}/l.db"
    with monkeypatch.context() as m:   # a ledger from before digests were recorded
        m.setattr(AccessMixin, "_audit_access",
                  lambda self, stream, kind, payload, before: self._store.audit(stream, kind,
                                                                               payload))
        tokens = _setup(url)
    aud = open_ledger(url, token=tokens["aud"])
    (problem,) = aud.check_access()
    assert "principal seal" in problem
    assert cli.main(["--ledger", url, "--token", tokens["root"], "principal", "seal"]) == 0
    assert aud.check_access() == []
    root = open_ledger(url, token=tokens["root"])
    root.rotate_token("pb")
    root.bind("pb", "s", "team-b")
    root.unbind("pa", "s", "team-a")
    root.disable_principal("cl")
    root.add_principal("late", ["auditor"])
    assert aud.check_access() == []
    capsys.readouterr()
    assert cli.main(["--ledger", url, "--token", tokens["aud"], "verify"]) == 0
    assert "principals and bindings: as recorded" in capsys.readouterr().out
