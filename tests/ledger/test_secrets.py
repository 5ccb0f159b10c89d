"""Secrets by reference: env:/file: ledger URLs, redaction, and refusing embedded passwords."""
import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import open_ledger, secrets


def test_references_resolve_in_the_connecting_process(monkeypatch, tmp_path):
    monkeypatch.setenv("LEDGER_URL_X", f"sqlite:///{tmp_path}/l.db")
    assert secrets.resolve("env:LEDGER_URL_X") == f"sqlite:///{tmp_path}/l.db"
    (tmp_path / "secret").write_text(f"sqlite:///{tmp_path}/l.db\n")
    assert secrets.resolve(f"file:{tmp_path}/secret") == f"sqlite:///{tmp_path}/l.db"
    led = open_ledger("env:LEDGER_URL_X")
    assert led.url == "env:LEDGER_URL_X" and led.backend == "sqlite"
    with pytest.raises(InvalidRequestError, match="not set"):
        secrets.resolve("env:NOT_SET_ANYWHERE_42")
    with pytest.raises(InvalidRequestError, match="cannot be read"):
        secrets.resolve(f"file:{tmp_path}/missing")
    (tmp_path / "empty").write_text("")
    with pytest.raises(InvalidRequestError, match="empty"):
        secrets.resolve(f"file:{tmp_path}/empty")


@pytest.mark.parametrize("url,shown", [
    ("postgresql://sage:hunter2@db:5432/ledger", "postgresql://sage:***@db:5432/ledger"),
    ("postgresql://sage@db/ledger?password=hunter2&sslmode=require",
     "postgresql://sage:***@db/ledger?sslmode=require"),
    # what libpq reads, not what a URL parser sees: '#' and '?' belong to the password here
    ("postgresql://etl:#hunter2@db:5432/ledger", "postgresql://etl:***@db:5432/ledger"),
    ("postgresql://etl:pa?hunter2@db/ledger", "postgresql://etl:***@db/ledger"),
    ("postgresql://sage@db/ledger?sslpassword=hunter2", "postgresql://sage@db/ledger?sslpassword=***"),
    ("host=db password=hunter2 dbname=ledger", "password=*** dbname=ledger host=db"),
    ("postgresql://sage@db/ledger", "postgresql://sage@db/ledger"),
    ("sqlite:////data/ledger.db", "sqlite:////data/ledger.db"),
    ("env:SAGE_LEDGER_URL", "env:SAGE_LEDGER_URL"),
])
def test_redaction_hides_every_password(url, shown):
    assert secrets.redact(url) == shown
    assert "hunter2" not in secrets.redact(url)
    assert secrets.has_password(url) == ("hunter2" in url)
    if "hunter2" in url:
        with pytest.raises(InvalidRequestError, match="env:SAGE_LEDGER_URL") as e:
            secrets.check_no_password(url, "a compiled spec")
        assert "hunter2" not in str(e.value)
    else:
        assert secrets.check_no_password(url, "a compiled spec") == url
