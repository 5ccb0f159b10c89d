"""PostgreSQL login roles of principals: what the database server itself enforces.

Every test runs against the real PostgreSQL test server: a pipeline principal's login role
works end to end through the library in its bound context, and direct SQL as that role (what a
pipeline pod holding its DSN could send) cannot charge or refund an unbound context, lower a
budget, un-retire a block, read keys or token digests, add principals or delete anything; an
auditor's role reads and verifies everything and writes nothing.
"""
import json
import urllib.parse
import uuid

import pytest
from dp_accounting import dp_event

from sage_tfx.errors import (AuthenticationError, GrantStateError, InvalidRequestError,
                             PermissionDeniedError)
from sage_tfx.ledger import BlockSpec, Window, open_ledger, pgrequest, pgroles

pytestmark = pytest.mark.postgres
psycopg = pytest.importorskip("psycopg")


def as_role(url: str, role: str, password: str = None) -> str:
    """``url`` with its user (and password) replaced."""
    parts = urllib.parse.urlsplit(url)
    auth = role + (f":{password}" if password else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{auth}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def ledger(postgres_url):
    """(owner URL, tokens, role names, password) of a ledger with a bound pipeline role."""
    tag = uuid.uuid4().hex[:8]
    roles = {"pipeline": f"etl_{tag}", "auditor": f"aud_{tag}", "client": f"cl_{tag}"}
    password = "pw-" + uuid.uuid4().hex
    with open_ledger(postgres_url) as led:
        led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, contexts=("team-a", "team-b"))
        led.add_blocks("s", [BlockSpec(f"b{i}", f"/d/b{i}", records=10) for i in range(4)])
        led.create_stream("r", epsilon_g=4.0, delta_g=1e-5, mode="rdp", contexts=("team-a",))
        led.add_blocks("r", [BlockSpec(f"r{i}", f"/d/r{i}") for i in range(3)])
        tokens = {"root": led.add_principal("root", ["admin"])}
    with open_ledger(postgres_url, token=tokens["root"]) as root:
        tokens["etl"] = root.add_principal("etl", ["pipeline"], pg_role=roles["pipeline"],
                                           create_pg_role=True, pg_password=password)
        tokens["aud"] = root.add_principal("aud", ["auditor"], pg_role=roles["auditor"],
                                           create_pg_role=True)
        tokens["cl"] = root.add_principal("cl", ["client"], pg_role=roles["client"],
                                          create_pg_role=True)
        root.bind("etl", "s", "team-a")
        root.bind("etl", "r", "team-a")
        root.add_principal("other", ["pipeline"])
        root.bind("other", "s", "team-b")
        # Wrapped data keys as the encryption layer stores them (opaque bytes here).
        root._q("INSERT INTO block_keys (stream, block_id, kek_id, wrapped, created_at) "
                "SELECT 's', block_id, 'kek1', convert_to('key-' || block_id, 'UTF8'), 'now' "
                "FROM blocks WHERE stream = 's'")
    return postgres_url, tokens, roles, password


def _state(url, token):
    """Everything a forbidden statement might have changed, read by the admin."""
    with open_ledger(url, token=token) as root:
        budgets = root._q("SELECT stream, context, block_id, status, eps_spent, delta_spent, "
                          "rdp, charges FROM budgets ORDER BY id").fetchall()
        grants = root._q("SELECT grant_id, status FROM grants ORDER BY grant_id").fetchall()
        rest = [root._q(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("audit", "principals", "bindings", "block_keys", "releases")]
        heads = root._q("SELECT id, audit_seq, audit_hash FROM ledger_head ORDER BY id").fetchall()
    return budgets, grants, rest, heads


def test_a_pipeline_role_works_through_the_library_in_its_bound_context(ledger):
    url, tokens, roles, password = ledger
    with open_ledger(as_role(url, roles["pipeline"], password)) as etl:
        assert etl.principal.name == "etl" and etl.principal.pg_role == roles["pipeline"]
        # basic mode: the one-statement server-side request, then a reservation released
        d = etl.request("s", run_id="r1", window=Window(last=2), epsilon=0.25, context="team-a")
        assert d.granted and d.grant.block_ids == ("b2", "b3")
        assert etl.request("s", run_id="r1", window=Window(last=2), epsilon=0.25,
                           context="team-a").replayed
        res = etl.request("s", run_id="r2", blocks=["b0"], epsilon=0.5, context="team-a",
                          release=False).grant
        assert etl.release(res.grant_id).status == "released"
        etl.record_release(res.grant_id, "out", value=b"noisy")
        assert etl.recorded_release(res.grant_id, "out").value == b"noisy"
        assert etl.grant(d.grant.grant_id).block_ids == ("b2", "b3")
        assert [b.charges for b in etl.blocks("s", "team-a")] == [1, 0, 1, 1]
        # a denial is audited under its own name
        assert not etl.request("s", run_id="r3", blocks=["b0"], epsilon=0.75,
                               context="team-a").granted
        # cancel: the refund runs through sage_refund and restores the block exactly
        before = etl.block("s", "b1", "team-a")
        res = etl.request("s", run_id="r4", blocks=["b1"], epsilon=0.125, context="team-a",
                          release=False).grant
        assert etl.block("s", "b1", "team-a").epsilon_spent == 0.125
        assert etl.cancel(res.grant_id).status == "cancelled"
        after = etl.block("s", "b1", "team-a")
        assert (after.epsilon_spent, after.charges) == (before.epsilon_spent, before.charges)
        # rdp mode (the general path, curves computed here) and its refund
        ev = dp_event.GaussianDpEvent(4.0)
        g = etl.request("r", run_id="q1", window=Window(last=2), event=ev, context="team-a")
        assert g.granted
        res = etl.request("r", run_id="q2", blocks=["r0"], event=ev, context="team-a",
                          release=False).grant
        curve = etl._q("SELECT rdp FROM budgets WHERE stream = 'r' AND block_id = 'r0'")
        assert json.loads(curve.fetchone()[0])[0] > 0
        etl.cancel(res.grant_id)
        assert etl.block("r", "r0", "team-a").charges == 0
        # keys: only a released grant's, in grant order
        keys = pgroles.grant_keys(etl._store, d.grant.grant_id)
        assert [(b, k, w) for b, k, w in keys] == [("b2", "kek1", b"key-b2"),
                                                  ("b3", "kek1", b"key-b3")]
        with pytest.raises(GrantStateError, match="cancelled"):
            pgroles.grant_keys(etl._store, res.grant_id)
        # leases and counters, which the systems share across processes
        assert etl.next_range("cursor", 5) == 0 and etl.next_range("cursor", 5) == 5
        with etl.lease("window", ttl=30, wait=5):
            assert etl.lease_holder("window") is not None
        assert etl.lease_holder("window") is None
        # what the library refuses before the database would
        with pytest.raises(PermissionDeniedError, match="not bound"):
            etl.request("s", run_id="x", blocks=["b0"], epsilon=0.1, context="team-b")
        with pytest.raises(PermissionDeniedError):
            etl.audit_log()
    with open_ledger(url, token=tokens["aud"]) as aud:
        assert aud.verify_audit().ok
        assert aud.check_consistency("s") == [] and aud.check_consistency("r") == []
        mine = [e for e in aud.audit_log() if e.kind in ("grant", "deny", "cancel", "release",
                                                         "record_release")]
        assert len(mine) >= 8 and {e.payload["principal"] for e in mine} == {"etl"}


FORBIDDEN = [
    # (what, SQL, error SQLSTATE class name)
    ("lower a bound budget", "UPDATE budgets SET eps_spent = '0' WHERE context = 'team-a' "
                             "AND block_id = 'b3'", "InsufficientPrivilege"),
    ("lower a charge count", "UPDATE budgets SET charges = 0 WHERE context = 'team-a' AND "
                             "block_id = 'b3'", "InsufficientPrivilege"),
    ("lower an RDP curve", r"UPDATE budgets SET rdp = regexp_replace(rdp, '[^,\[\] ]+', '0', 'g') "
                           "WHERE stream = 'r' AND "
                           "block_id = 'r2'", "InsufficientPrivilege"),
    ("un-retire a block", "UPDATE budgets SET status = 'active' WHERE context = 'team-a' "
                          "AND block_id = 'b0'", "InsufficientPrivilege"),
    ("move a budget row", "UPDATE budgets SET context = 'team-b' WHERE context = 'team-a'",
     "InsufficientPrivilege"),
    ("read block keys", "SELECT * FROM block_keys", "InsufficientPrivilege"),
    ("read token digests", "SELECT token_sha256 FROM principals", "InsufficientPrivilege"),
    ("read bindings", "SELECT * FROM bindings", "InsufficientPrivilege"),
    ("read the audit log", "SELECT * FROM audit", "InsufficientPrivilege"),
    ("add a principal", "INSERT INTO principals (name, roles, status, created_at, updated_at) "
                        "VALUES ('evil', '[\"admin\"]', 'active', 'x', 'x')",
     "InsufficientPrivilege"),
    ("bind itself", "INSERT INTO bindings VALUES ('etl', 's', 'team-b', 'x')",
     "InsufficientPrivilege"),
    ("delete audit rows", "DELETE FROM audit", "InsufficientPrivilege"),
    ("rewrite audit rows", "UPDATE audit SET payload = '{}'", "InsufficientPrivilege"),
    ("delete grants", "DELETE FROM grants", "InsufficientPrivilege"),
    ("delete budgets", "DELETE FROM budgets", "InsufficientPrivilege"),
    ("delete releases", "DELETE FROM releases", "InsufficientPrivilege"),
    ("rewrite a release", "UPDATE releases SET digest = 'x'", "InsufficientPrivilege"),
    ("grant in an unbound context",
     "INSERT INTO grants (grant_id, stream, context, run_id, request, mode, blocks, status, "
     "created_at) VALUES ('g-evil', 's', 'team-b', 'evil', '{}', 'basic', '[\"b0\"]', "
     "'released', 'x')", "InsufficientPrivilege"),
    ("grant over blocks it did not charge",
     "INSERT INTO grants (grant_id, stream, context, run_id, request, mode, epsilon, blocks, "
     "status, created_at, principal) VALUES ('g-free', 's', 'team-a', 'free', '{}', 'basic', 0, "
     "'[\"b2\"]', 'released', 'x', 'etl')", "InsufficientPrivilege"),
    ("grant over a retired block it touched",  # b0 is retired in team-a: its row takes nothing
     "UPDATE budgets SET charges = charges + 1 WHERE context = 'team-a' AND block_id = 'b0'",
     "InsufficientPrivilege"),
    ("grant in another principal's name",
     "WITH c AS (UPDATE budgets SET charges = charges + 1 WHERE context = 'team-a' AND "
     "block_id = 'b2' RETURNING 1) INSERT INTO grants (grant_id, stream, context, run_id, "
     "request, mode, epsilon, blocks, status, created_at, principal) SELECT 'g-name', 's', "
     "'team-a', 'name', '{}', 'basic', 0.5, '[\"b2\"]', 'released', 'x', 'root' FROM c",
     "InsufficientPrivilege"),
    ("record a release of a reservation",
     "INSERT INTO releases (grant_id, name, stream, context, run_id, digest, size, principal, "
     "created_at) VALUES ('@mine_reserved@', 'x', 's', 'team-a', 'm2', 'd', 1, 'etl', 'x')",
     "InsufficientPrivilege"),
    ("record a release in another's name",
     "INSERT INTO releases (grant_id, name, stream, context, run_id, digest, size, principal, "
     "created_at) VALUES ('@mine_released@', 'x', 's', 'team-a', 'm1', 'd', 1, 'root', 'x')",
     "InsufficientPrivilege"),
    ("record a release under another run",
     "INSERT INTO releases (grant_id, name, stream, context, run_id, digest, size, principal, "
     "created_at) VALUES ('@mine_released@', 'x', 's', 'team-a', 'other', 'd', 1, 'etl', 'x')",
     "InsufficientPrivilege"),
    ("un-cancel a refunded reservation", "UPDATE grants SET status = 'released' WHERE "
                                         "status = 'cancelled'", "InsufficientPrivilege"),
    ("append audit entries in another's name",
     "INSERT INTO audit (seq, ts, stream, kind, payload, prev_hash, hash, chain) VALUES "
     "(999999, 'x', 's', 'grant', '{\"principal\": \"root\"}', 'x', 'x', 1)",
     "InsufficientPrivilege"),
    ("rewind an audit chain head", "UPDATE ledger_head SET audit_hash = 'x' WHERE id = 1",
     "InsufficientPrivilege"),
    ("change the schema version", "UPDATE ledger_head SET schema_version = 1",
     "InsufficientPrivilege"),
    ("create a table", "CREATE TABLE mine (x int)", "InsufficientPrivilege"),
    ("change a stream's cap", "UPDATE streams SET epsilon_g = 100", "InsufficientPrivilege"),
    ("grant itself privileges", "GRANT SELECT ON block_keys TO CURRENT_USER",
     "InsufficientPrivilege"),
    ("refund another context's grant", "SELECT sage_refund('@other_reserved@', '[]')",
     "InsufficientPrivilege"),
    ("refund a released grant", "SELECT sage_refund('@mine_released@', '[]')",
     "ObjectNotInPrerequisiteState"),
    ("refund more than a reservation charged",
     "SELECT sage_refund('@mine_reserved@', '[{\"block\": \"b1\", \"eps\": \"0\", "
     "\"delta\": \"0\", \"charges\": 0}]')", "InsufficientPrivilege"),
    ("refund one block twice",
     "SELECT sage_refund('@mine_reserved@', '[{\"block\": \"b1\", \"eps\": \"0.5\", "
     "\"delta\": \"0\", \"charges\": 1}, {\"block\": \"b1\", \"eps\": \"0.5\", \"delta\": \"0\", "
     "\"charges\": 1}]')", "InsufficientPrivilege"),
    ("another context's keys", "SELECT * FROM sage_grant_keys('@other_released@')",
     "InsufficientPrivilege"),
    ("a reservation's keys", "SELECT * FROM sage_grant_keys('@mine_reserved@')",
     "ObjectNotInPrerequisiteState"),
]


def _fill(sql, grants):
    for name, grant_id in grants.items():
        sql = sql.replace(f"@{name}@", grant_id)
    return sql


def test_direct_sql_as_a_pipeline_role_changes_nothing_it_may_not(ledger):
    url, tokens, roles, password = ledger
    grants = {}
    with open_ledger(url, token=tokens["root"]) as root:  # the other team's grants
        grants["other_reserved"] = root.request("s", run_id="o1", blocks=["b0"], epsilon=0.25,
                                                context="team-b", release=False).grant.grant_id
        grants["other_released"] = root.request("s", run_id="o2", blocks=["b1"], epsilon=0.25,
                                                context="team-b").grant.grant_id
    with open_ledger(as_role(url, roles["pipeline"], password)) as etl:
        grants["mine_released"] = etl.request("s", run_id="m1", blocks=["b3"], epsilon=0.5,
                                              context="team-a").grant.grant_id
        etl.request("s", run_id="m0", blocks=["b1"], epsilon=0.25, context="team-a")
        grants["mine_reserved"] = etl.request("s", run_id="m2", blocks=["b1"], epsilon=0.5,
                                              context="team-a", release=False).grant.grant_id
        etl.request("s", run_id="m3", blocks=["b0"], epsilon=1.0, context="team-a")  # retires b0
        etl.cancel(etl.request("s", run_id="m5", blocks=["b2"], epsilon=0.5, context="team-a",
                               release=False).grant.grant_id)
        etl.request("r", run_id="m4", blocks=["r2"], event=dp_event.GaussianDpEvent(3.0),
                    context="team-a")
    before = _state(url, tokens["root"])
    conn = psycopg.connect(as_role(url, roles["pipeline"], password), autocommit=True)
    # Temporary objects come first in an unqualified lookup: shadows of what the guards read.
    conn.execute("CREATE TEMP VIEW sage_scope AS SELECT 'root'::text AS principal, "
                 "true AS reads_all, true AS writes_all, 's'::text AS stream, "
                 "'team-b'::text AS context")
    conn.execute("CREATE TEMP TABLE pg_class AS SELECT oid, "
                 "(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) AS relowner "
                 "FROM pg_catalog.pg_class")
    for what, sql, error in FORBIDDEN:
        with pytest.raises(getattr(psycopg.errors, error)):
            conn.execute(_fill(sql, grants))
            pytest.fail(f"allowed: {what}")
    # Row-level security: the unbound context's rows are invisible, so unchargeable.
    assert conn.execute("SELECT count(*) FROM budgets WHERE context = 'team-b'").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM grants WHERE context = 'team-b'").fetchone() == (0,)
    cur = conn.execute("UPDATE budgets SET eps_spent = '0.9', charges = charges + 1 "
                       "WHERE context = 'team-b'")
    assert cur.rowcount == 0
    conn.close()
    assert _state(url, tokens["root"]) == before
    with open_ledger(url, token=tokens["aud"]) as aud:
        assert aud.verify_audit().ok and aud.check_consistency("s") == []


def test_an_auditor_role_verifies_and_writes_nothing(ledger):
    url, tokens, roles, password = ledger
    with open_ledger(as_role(url, roles["pipeline"], password)) as etl:
        etl.request("s", run_id="a1", window=Window(last=1), epsilon=0.5, context="team-a")
    before = _state(url, tokens["root"])
    with open_ledger(as_role(url, roles["auditor"])) as aud:
        assert aud.principal.name == "aud"
        assert aud.verify_audit().ok and aud.check_consistency("s") == []
        assert len(aud.grants("s")) == 1 and len(aud.blocks("s", "team-b")) == 4
        with pytest.raises(PermissionDeniedError):
            aud.request("s", run_id="a2", blocks=["b0"], epsilon=0.1, context="team-a")
        # what the library would refuse, the server refuses too
        for sql in ("UPDATE budgets SET charges = charges + 1",
                    "INSERT INTO audit (seq, ts, kind, payload, prev_hash, hash) VALUES "
                    "(999999, 'x', 'x', '{\"principal\": \"aud\"}', 'x', 'x')",
                    "UPDATE ledger_head SET audit_seq = audit_seq",
                    "SELECT token_sha256 FROM principals", "SELECT * FROM block_keys",
                    "SELECT sage_refund('x', '[]')", "SELECT * FROM sage_grant_keys('x')",
                    "DELETE FROM leases"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                aud._q(sql)
        assert aud._q("SELECT count(*) FROM principals").fetchone() == (5,)
    assert _state(url, tokens["root"]) == before


def test_role_lifecycle_and_refusals(ledger, sqlite_url):
    url, tokens, roles, password = ledger
    owner = psycopg.connect(url, autocommit=True)
    stored = owner.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                           (roles["pipeline"],)).fetchone()[0]
    assert stored.startswith("SCRAM-SHA-256$") and password not in stored  # only a verifier
    # A token naming someone else does not lend its roles to this connection.
    with pytest.raises(AuthenticationError, match="names principal 'root'"):
        open_ledger(as_role(url, roles["pipeline"], password), token=tokens["root"])
    assert open_ledger(as_role(url, roles["pipeline"], password),
                       token=tokens["etl"]).principal.name == "etl"
    # A client's role connects and reads nothing.
    with pytest.raises(PermissionDeniedError, match="may not read this ledger"):
        open_ledger(as_role(url, roles["client"]))
    before = _state(url, tokens["root"])
    with open_ledger(url, token=tokens["root"]) as root:
        for bad, match in ((dict(roles=["admin"], pg_role="adm_x", create_pg_role=True),
                            "owner's database role"),
                           (dict(roles=["pipeline"], pg_role=roles["auditor"]),
                            "already belongs to principal 'aud'"),
                           (dict(roles=["pipeline"], pg_role=roles["auditor"],
                                 create_pg_role=True), "already"),
                           (dict(roles=["pipeline"], pg_role="x" * 64), "at most 63"),
                           (dict(roles=["pipeline"], pg_password="p"), "need pg_role")):
            with pytest.raises(InvalidRequestError, match=match):
                root.add_principal("new", **bad)
        assert owner.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'adm_x'"
                             ).fetchone() == (0,)
        new_pw = "pw2-" + uuid.uuid4().hex
        root.rotate_token("etl", pg_password=new_pw)
        assert owner.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                             (roles["pipeline"],)).fetchone()[0] != stored
        session = psycopg.connect(as_role(url, roles["pipeline"], new_pw), autocommit=True)
        assert session.execute("SELECT count(*) FROM streams").fetchone() == (2,)
        root.disable_principal("etl")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            session.execute("SELECT count(*) FROM streams")  # the open session, at once
        with pytest.raises(psycopg.OperationalError, match="not permitted to log in"):
            psycopg.connect(as_role(url, roles["pipeline"], new_pw))
        kinds = [e.kind for e in root.audit_log()][-2:]
        assert kinds == ["principal_rotate", "principal_disable"]
    assert _state(url, tokens["root"])[0] == before[0]  # no budget moved
    with open_ledger(sqlite_url) as local:
        with pytest.raises(InvalidRequestError, match="PostgreSQL"):
            local.add_principal("a", ["admin"], pg_role="a")


def test_a_pipeline_roles_request_reads_use_indexes(postgres_url):
    """Row-level security keeps the request path index-driven: a 20,000-block stream, and no
    locking read of the server-side request touches more than a window's worth of rows."""
    from test_ledger_scale import _rows_touched

    role = f"etl_{uuid.uuid4().hex[:8]}"
    with open_ledger(postgres_url) as led:
        led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
        led.add_blocks("s", [BlockSpec(f"b{i:05d}", f"/store/b{i:05d}") for i in range(20_000)])
        led._q("ANALYZE")
        token = led.add_principal("root", ["admin"])
    with open_ledger(postgres_url, token=token) as root:
        root.add_principal("etl", ["pipeline"], pg_role=role, create_pg_role=True)
        root.bind("etl", "s", "default")
    with open_ledger(as_role(postgres_url, role)) as etl:
        assert etl.request("s", run_id="w", window=Window(last=30), epsilon=0.01).granted
        params = {"stream": "s", "context": "default", "page": 38,
                  "blocks": [f"b{i:05d}" for i in range(100, 130)]}
        for sql in (pgrequest.WINDOW_ROWS, pgrequest.BLOCK_ROWS):
            plan = etl._store.conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + sql.format(**{k: f"%({k})s" for k in params}),
                params).fetchone()[0]
            touched = _rows_touched(plan[0]["Plan"])
            assert touched and all(n <= 100 for _, _, n in touched), touched


def test_an_auditor_role_checks_the_access_digest(ledger):
    """It cannot read token digests, yet checks the digest over them (sage_access_rows): an
    edit by the owner's role outside the library shows."""
    url, tokens, roles, _ = ledger
    with open_ledger(as_role(url, roles["auditor"])) as aud:
        assert aud.check_access() == []
        with psycopg.connect(url, autocommit=True) as owner:
            owner.execute("UPDATE principals SET token_sha256 = md5(token_sha256) "
                          "WHERE name = 'root'")
        (problem,) = aud.check_access()
        assert "outside the library" in problem
