"""The ``sage-tfx`` command on input a newcomer gets wrong: exit code 2, a one-line message, no
traceback, and nothing changed; a refused caller changes no file (the key file included); the
messages name the command's own flags."""
import hashlib
import os
import subprocess
import sys

import pytest

from sage_tfx import cli
from sage_tfx.ledger import keys, open_ledger

CSV = "timestamp,x\n2013-01-01T01:00:00Z,1\n2013-01-02T01:00:00Z,2\n"


def run(capsys, *argv):
    """(exit code, stdout, stderr) of one in-process ``sage-tfx`` invocation."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def tree(root) -> dict:
    """Every file and directory under ``root``: path -> (size, mtime, sha256) or "dir"."""
    found = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            found[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in files:
            path = os.path.join(dirpath, f)
            st = os.stat(path)
            with open(path, "rb") as fh:
                found[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns,
                                                      hashlib.sha256(fh.read()).hexdigest())
    return found


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A ledger (in its own directory) and a work directory with data and the key file's place."""
    monkeypatch.delenv("SAGE_LEDGER_TOKEN", raising=False)
    monkeypatch.delenv("SAGE_LEDGER_TOKEN_FILE", raising=False)
    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.csv").write_text(CSV)
    monkeypatch.setenv(keys.PROVIDER_ENV, f"file:{work}/keys/kek.json")
    (tmp_path / "ledger").mkdir()
    return f"sqlite:///{tmp_path}/ledger/l.db", work


def test_a_missing_source_is_a_message_and_writes_nothing(workspace, capsys):
    url, work = workspace
    assert run(capsys, "--ledger", url, "create-stream", "flights", "--epsilon-g", "1",
               "--delta-g", "1e-6", "--granularity", "time:timestamp:day")[0] == 0
    before = tree(work)
    code, out, err = run(capsys, "--ledger", url, "import", "flights", str(work / "missing.csv"),
                         "--scheme", "time:timestamp:day", "--block-root", str(work / "blocks"))
    assert code == 2 and "matches no file" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("sage-tfx: error: ")
    assert tree(work) == before  # no block root, no key file


def test_create_stream_refuses_a_granularity_no_import_could_fill(workspace, capsys):
    url, _ = workspace
    code, _, err = run(capsys, "--ledger", url, "create-stream", "flights", "--epsilon-g", "1",
                       "--delta-g", "1e-6", "--granularity", "daily")
    assert code == 2 and "--granularity 'daily' is not a block scheme" in err
    assert "time:timestamp:day" in err
    with open_ledger(url) as led:
        assert led.streams() == []
    for good in ("time:timestamp:day", "hash:user:16:salt", "month"):
        assert run(capsys, "--ledger", url, "create-stream", f"s-{good.split(':')[0]}",
                   "--epsilon-g", "1", "--delta-g", "0", "--granularity", good)[0] == 0


def test_keys_on_a_fresh_ledger_say_what_happened_once(workspace, capsys):
    url, work = workspace
    assert run(capsys, "--ledger", url, "create-stream", "s", "--epsilon-g", "1",
               "--delta-g", "0")[0] == 0
    code, out, err = run(capsys, "--ledger", url, "keys", "status")
    assert code == 0 and "no key-encryption key" in out
    assert not (work / "keys").exists()  # a status creates no key file
    code, out, err = run(capsys, "--ledger", url, "keys", "shred")
    assert code == 0 and "destroyed 0 key(s)" in out
    assert "not wiped" not in out and "readers held" not in out  # nothing needed wiping
    code, out, err = run(capsys, "--ledger", url, "keys", "migrate")
    assert code == 0
    assert (out + err).count("encrypted 0 block(s)") == 1, (out, err)


def test_dnd_help_lists_its_action(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["dnd", "--help"])
    assert done.value.code == 0
    assert "serve" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        cli.main(["dnd"])
    assert done.value.code == 2 and "name an action: serve" in capsys.readouterr().err


def _principals(capsys, url):
    """An admin and a pipeline principal bound to stream s; returns their tokens."""
    assert run(capsys, "--ledger", url, "create-stream", "s", "--epsilon-g", "1",
               "--delta-g", "1e-6", "--granularity", "time:timestamp:day")[0] == 0
    assert run(capsys, "--ledger", url, "add-block", "s", "x", "--location", "/nowhere/x")[0] == 0
    code, out, _ = run(capsys, "--ledger", url, "principal", "add", "root", "--role", "admin")
    root = out.splitlines()[2].strip()
    code, out, _ = run(capsys, "--ledger", url, "--token", root, "principal", "add", "etl",
                       "--role", "pipeline")
    etl = out.splitlines()[2].strip()
    assert run(capsys, "--ledger", url, "--token", root, "principal", "bind", "etl",
               "--stream", "s", "--context", "default")[0] == 0
    return root, etl


def test_a_refused_command_changes_no_file(workspace, capsys):
    """Every command checks its caller before it touches anything: a pipeline's refused key,
    import, stream and anchor commands leave the work directory (data, block root, key file,
    anchor file) and the ledger's audit log as they were."""
    url, work = workspace
    root, etl = _principals(capsys, url)
    refused = [
        ["keys", "status"], ["keys", "rotate"], ["keys", "migrate"], ["keys", "shred"],
        ["import", "s", str(work / "data.csv"), "--scheme", "time:timestamp:day",
         "--block-root", str(work / "blocks")],
        ["create-stream", "t", "--epsilon-g", "1", "--delta-g", "0"],
        ["add-block", "s", "y", "--location", str(work / "y")],
        ["retire", "s", "x"],
        ["principal", "add", "p2", "--role", "pipeline"],
        ["audit", "anchor", "--file", str(work / "anchors.jsonl")],
    ]

    def check_all():
        with open_ledger(url, token=root) as led:
            entries = len(led.audit_log(limit=10_000))
        before = tree(work)
        for argv in refused:
            code, _, err = run(capsys, "--ledger", url, "--token", etl, *argv)
            assert code == 2 and "may not" in err, (argv, err)
            assert tree(work) == before, argv
        with open_ledger(url, token=root) as led:
            assert len(led.audit_log(limit=10_000)) == entries

    check_all()  # no key file yet: none is created
    assert not (work / "keys").exists()
    assert run(capsys, "--ledger", url, "--token", root, "keys", "rotate")[0] == 0
    assert (work / "keys" / "kek.json").exists()
    check_all()  # the key file exists: a refused rotation leaves it byte for byte


@pytest.mark.slow  # two Beam splits
def test_import_into_a_stream_of_per_team_contexts(workspace, tmp_path):
    """README's per-team contexts import like any stream; a malformed row is refused with the
    command's own flag, without Google's FutureWarnings, and leaves no directory behind."""
    url, work = workspace

    def sage(*argv):
        return subprocess.run([sys.executable, "-m", "sage_tfx.cli", "--ledger", url, *argv],
                              capture_output=True, text=True, timeout=900)

    r = sage("create-stream", "ev", "--epsilon-g", "1", "--delta-g", "1e-6",
             "--granularity", "time:timestamp:day", "--contexts", "team-a,team-b")
    assert r.returncode == 0, r.stderr
    (work / "bad.csv").write_text(CSV + "not-a-time,3\n")
    blocks = ["--scheme", "time:timestamp:day", "--block-root", str(work / "blocks")]
    r = sage("import", "ev", str(work / "bad.csv"), *blocks)
    assert r.returncode == 2 and "--on-malformed skip" in r.stderr, r.stderr
    assert "on_malformed=" not in r.stderr and "Warning" not in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (work / "blocks").exists()
    r = sage("import", "ev", str(work / "data.csv"), *blocks)
    assert r.returncode == 0 and "imported 2 encrypted blocks into ev" in r.stdout, r.stderr
    assert "Warning" not in r.stderr, r.stderr
    r = sage("blocks", "ev", "--context", "team-b")
    assert r.returncode == 0 and "2013-01-01" in r.stdout and "2013-01-02" in r.stdout
