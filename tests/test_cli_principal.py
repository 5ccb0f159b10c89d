"""``sage-tfx principal ...`` and ``--token``: output, exit codes, audit entries naming the
principal, and bad input that changes nothing (exit code 2)."""
import base64
import hashlib
import hmac
import re
import urllib.parse
import uuid

import pytest

from sage_tfx import cli
from sage_tfx.ledger import open_ledger


def run(capsys, *argv):
    """(exit code, stdout, stderr) of one ``sage-tfx`` invocation."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def issued(out: str, what: str = "token") -> str:
    """The secret printed on the line after '<what> of/(shown once...'."""
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(what))
    return lines[i + 1].strip()


def snapshot(url, token):
    with open_ledger(url, token=token) as led:
        return ([(p.name, sorted(p.roles), p.status) for p in led.principals()],
                led.bindings(), len(led.audit_log(limit=10_000)))


def test_principal_commands_on_the_embedded_ledger(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SAGE_LEDGER_TOKEN", raising=False)
    monkeypatch.delenv("SAGE_LEDGER_TOKEN_FILE", raising=False)
    url = f"sqlite:///{tmp_path}/l.db"
    led = ["--ledger", url]
    assert run(capsys, *led, "create-stream", "s", "--epsilon-g", "1", "--delta-g", "0",
               "--contexts", "a,b")[0] == 0
    assert run(capsys, *led, "add-block", "s", "x", "--location", "/blocks/x")[0] == 0
    code, out, _ = run(capsys, *led, "principal", "list")
    assert code == 0 and "open mode" in out
    # The first principal must be an admin, and nothing changes otherwise.
    code, _, err = run(capsys, *led, "principal", "add", "etl", "--role", "pipeline")
    assert code == 2 and "must hold the admin role" in err
    code, out, _ = run(capsys, *led, "principal", "add", "root", "--role", "admin")
    assert code == 0 and "authentication is now on" in out and "SAGE_LEDGER_TOKEN" in out
    root = issued(out)
    assert root.startswith("sage_")
    code, _, err = run(capsys, *led, "streams")
    assert code == 2 and "has principals" in err and "principal add" in err
    (tmp_path / "root.tok").write_text(root + "\n")
    monkeypatch.setenv("ROOT_TOKEN", root)
    as_root = [*led, "--token", f"file:{tmp_path}/root.tok"]
    code, out, _ = run(capsys, *led, "--token", "env:ROOT_TOKEN", "principal", "add", "etl",
                       "--role", "pipeline", "--role", "pipeline")
    assert code == 0 and "roles: pipeline)" in out
    etl = issued(out)
    assert run(capsys, *as_root, "principal", "bind", "etl", "--stream", "s",
               "--context", "a")[0] == 0
    code, out, _ = run(capsys, *as_root, "principal", "list")
    assert code == 0 and re.search(r"etl\s+pipeline\s+active\s+s/a", out), out
    assert etl not in out and root not in out and "2 principal(s)" in out

    # The pipeline charges only its bound context (its token on the command line).
    code, _, err = run(capsys, *led, "--token", etl, "request", "s", "--run-id", "r1",
                       "--blocks", "x", "--epsilon", "0.1", "--context", "b")
    assert code == 2 and "not bound" in err
    before = snapshot(url, root)
    # Bad input: a clear error, exit code 2, nothing changed.
    bad = [
        (["principal", "add", "root", "--role", "admin"], "already exists"),
        (["principal", "add", "p2", "--role", "pipeline", "--pg-role"], "PostgreSQL"),
        (["principal", "add", "p2", "--role", "pipeline", "--pg-external"], "needs --pg-role"),
        (["principal", "add", "bad name", "--role", "pipeline"], "principal name"),
        (["principal", "bind", "nobody", "--stream", "s", "--context", "a"], "unknown principal"),
        (["principal", "bind", "etl", "--stream", "s", "--context", "zz"], "not configured"),
        (["principal", "bind", "etl", "--stream", "nope", "--context", "a"], "unknown stream"),
        (["principal", "unbind", "etl", "--stream", "s", "--context", "b"], "not bound"),
        (["principal", "disable", "nobody"], "unknown principal"),
        (["principal", "rotate", "nobody"], "unknown principal"),
        (["principal", "rotate", "etl", "--pg-password"], "no database role"),
    ]
    for argv, message in bad:
        code, out, err = run(capsys, *as_root, *argv)
        assert (code, out) == (2, ""), argv
        assert message in err, (argv, err)
    for argv in (["principal", "add", "x", "--role", "superuser"], ["principal", "add", "x"],
                 ["principal", "frobnicate"]):
        with pytest.raises(SystemExit) as e:  # argparse: usage error, exit code 2
            cli.main([*as_root, *argv])
        assert e.value.code == 2
    # A pipeline may not manage principals; an unknown token is refused.
    code, _, err = run(capsys, *led, "--token", etl, "principal", "add", "evil", "--role", "admin")
    assert code == 2 and "may not configure" in err
    code, _, err = run(capsys, *led, "--token", "sage_forged", "principal", "list")
    assert code == 2 and "unknown token" in err
    code, _, err = run(capsys, *led, "--token", "env:NOT_SET_42", "principal", "list")
    assert code == 2 and "NOT_SET_42" in err
    assert snapshot(url, root) == before

    # rotate: the old token stops working at once; disable: the principal is locked out.
    code, out, _ = run(capsys, *as_root, "principal", "rotate", "etl")
    assert code == 0 and "old token no longer works" in out
    new = issued(out)
    assert run(capsys, *led, "--token", etl, "streams")[0] == 2
    code, out, _ = run(capsys, *led, "--token", new, "request", "s", "--run-id", "r1",
                       "--last", "1", "--epsilon", "0.1", "--context", "a")
    assert code == 0 and out.startswith("grant ")
    assert run(capsys, *as_root, "principal", "unbind", "etl", "--stream", "s",
               "--context", "a")[0] == 0
    code, out, _ = run(capsys, *as_root, "principal", "disable", "etl")
    assert code == 0 and "disabled etl" in out
    code, _, err = run(capsys, *led, "--token", new, "streams")
    assert code == 2 and "disabled" in err
    with open_ledger(url, token=root) as ledger:
        log = [(e.kind, e.payload.get("name"), e.payload["principal"])
               for e in ledger.audit_log() if e.kind.startswith(("principal", "bind", "unbind",
                                                                 "grant"))]
        assert ledger.verify_audit().ok
    assert log == [("principal_add", "root", "local"), ("principal_add", "etl", "root"),
                   ("bind", "etl", "root"), ("principal_rotate", "etl", "root"),
                   ("grant", None, "etl"),
                   ("unbind", "etl", "root"), ("principal_disable", "etl", "root")]


def scram_verifies(verifier: str, password: str) -> bool:
    """Whether a PostgreSQL SCRAM-SHA-256 verifier was made from ``password`` (RFC 5802)."""
    method, rest = verifier.split("$", 1)
    params, keys = rest.split("$")
    iterations, salt = params.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt),
                                 int(iterations))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return method == "SCRAM-SHA-256" and (
        base64.b64encode(hashlib.sha256(client_key).digest()).decode() == stored_key)


@pytest.mark.postgres
def test_pg_role_principals_from_the_command_line(postgres_url, capsys, monkeypatch):
    import psycopg

    monkeypatch.delenv("SAGE_LEDGER_TOKEN", raising=False)
    led = ["--ledger", postgres_url]
    assert run(capsys, *led, "create-stream", "s", "--epsilon-g", "1", "--delta-g", "0")[0] == 0
    root = issued(run(capsys, *led, "principal", "add", "root", "--role", "admin")[1])
    as_root = [*led, "--token", root]
    role = f"etl_{uuid.uuid4().hex[:8]}"
    code, out, _ = run(capsys, *as_root, "principal", "add", "etl", "--role", "pipeline",
                       "--pg-role", role)
    assert code == 0 and f"database role: {role}" in out and "~/.pgpass" in out
    password = issued(out, "database password")
    owner = psycopg.connect(postgres_url, autocommit=True)

    def verifier():
        return owner.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                             (role,)).fetchone()[0]

    assert scram_verifies(verifier(), password) and not scram_verifies(verifier(), "guess")
    # The role is the principal: no token needed.
    assert run(capsys, *as_root, "principal", "bind", "etl", "--stream", "s",
               "--context", "default")[0] == 0
    parts = urllib.parse.urlsplit(postgres_url)
    role_url = parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}").geturl()
    code, out, err = run(capsys, "--ledger", role_url, "streams")
    assert code == 0 and out.splitlines()[2].startswith("s "), err
    code, _, err = run(capsys, "--ledger", role_url, "principal", "list")
    assert code == 2 and "may not configure" in err
    code, out, _ = run(capsys, *as_root, "principal", "rotate", "etl", "--pg-password")
    assert code == 0
    new_password = issued(out, "database password")
    assert scram_verifies(verifier(), new_password) and not scram_verifies(verifier(), password)
    # --pg-external: a role without a password, authenticated by the operator's pg_hba.conf
    ext = f"aud_{uuid.uuid4().hex[:8]}"
    code, out, _ = run(capsys, *as_root, "principal", "add", "aud", "--role", "auditor",
                       "--pg-role", ext, "--pg-external")
    assert code == 0 and "no password" in out and "database password" not in out
    assert owner.execute("SELECT rolcanlogin, rolpassword FROM pg_authid WHERE rolname = %s",
                         (ext,)).fetchone() == (True, None)
    # An admin gets no login role; nothing is created.
    code, _, err = run(capsys, *as_root, "principal", "add", "adm", "--role", "admin",
                       "--pg-role", f"adm_{role}")
    assert code == 2 and "owner's database role" in err
    assert owner.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s",
                         (f"adm_{role}",)).fetchone() == (0,)
