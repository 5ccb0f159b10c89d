"""One ``--ledger`` flag on every command; older spellings are deprecated aliases.

``sage-tfx`` took ``--ledger``, ``sage-tfx ptk`` ``--url`` and ``sage-tfx compile``
``--ledger-url``: each now takes ``--ledger``, and the old spelling still works with a note on
stderr (``sage_tfx.ledger.flags``).
"""
from __future__ import annotations

import argparse
import ast
import pathlib

import pytest

from sage_tfx import cli
from sage_tfx.dnd import server
from sage_tfx.ledger import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
OLD_SPELLINGS = ("--url", "--ledger-url", "--ledger_url", "--db", "--ledger-db")


def _parser(**kwargs) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="probe")
    flags.add_ledger_argument(p, help="the ledger", **kwargs)
    return p


def test_the_flag_stores_the_url_silently(capsys):
    a = _parser(deprecated=("--url",)).parse_args(["--ledger", "sqlite:///a.db"])
    assert a.ledger == "sqlite:///a.db"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("alias", ["--url", "--ledger-url"])
def test_a_deprecated_spelling_sets_the_same_value_with_a_note(alias, capsys):
    p = _parser(deprecated=("--url", "--ledger-url"), dest="target", required=True)
    a = p.parse_args([alias, "env:LEDGER"])
    assert a.target == "env:LEDGER"
    err = capsys.readouterr().err
    assert f"{alias} is deprecated; use --ledger" in err and "probe" in err
    a = p.parse_args([f"{alias}=env:OTHER"])  # the --flag=value form too
    assert a.target == "env:OTHER" and "deprecated" in capsys.readouterr().err


def test_required_is_met_by_either_spelling_and_missing_still_fails(capsys):
    p = _parser(deprecated=("--url",), required=True)
    with pytest.raises(SystemExit):
        p.parse_args([])
    assert "--ledger" in capsys.readouterr().err


def test_help_names_the_flag_and_marks_the_old_spelling_deprecated():
    text = _parser(deprecated=("--url",)).format_help()
    assert "--ledger URL" in text and "--url: deprecated spelling" in text


def test_sage_tfx_takes_ledger_and_its_old_spellings(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["--ledger", "sqlite:///x.db", "streams"]).ledger == "sqlite:///x.db"
    assert capsys.readouterr().err == ""
    for old in ("--url", "--ledger-url"):
        assert parser.parse_args([old, "sqlite:///y.db", "streams"]).ledger == "sqlite:///y.db"
        assert f"{old} is deprecated" in capsys.readouterr().err


def test_sage_tfx_streams_with_the_old_spelling_still_runs(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/ledger.db"
    assert cli.main(["--ledger", url, "create-stream", "s", "--epsilon-g", "1",
                     "--delta-g", "1e-6"]) == 0
    assert cli.main(["--url", url, "streams"]) == 0
    out = capsys.readouterr()
    assert "s" in out.out.split() and "--url is deprecated" in out.err


def test_ptk_command_takes_ledger_and_url(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/ledger.db"
    from sage_tfx.ptk import service
    assert service.main(["plan", "--ledger", url]) == 0
    first = capsys.readouterr()
    assert "no plan yet" in first.out and first.err == ""
    assert service.main(["plan", "--url", url]) == 0
    second = capsys.readouterr()
    assert second.out == first.out and "--url is deprecated; use --ledger" in second.err
    # sage-tfx --ledger URL ptk plan: the top-level flag reaches the system's command.
    assert cli.main(["--ledger", url, "ptk", "plan"]) == 0
    assert capsys.readouterr().out == first.out


def test_dnd_serve_takes_ledger():
    args = ["--stream", "s", "--run-id", "r", "--features", "3", "--gamma", "0.5",
            "--epsilon", "1"]
    a = server.build_parser().parse_args(["--ledger", "sqlite:///d.db", *args])
    assert a.ledger == "sqlite:///d.db"
    with pytest.raises(SystemExit):
        server.build_parser().parse_args(args)


@pytest.mark.slow  # sage_tfx.pipelines.compile imports TFX (~30-60 s under load)
def test_compile_takes_ledger_and_ledger_url(capsys):
    from sage_tfx.pipelines import compile as compile_lib
    base = ["--target", "airflow", "gate-stats", "--pipeline-root", "/r", "--stream", "s",
            "--epsilon", "1"]
    parser = compile_lib.build_parser()
    assert parser.parse_args([*base, "--ledger", "postgresql://a@h/db"]).ledger_url == (
        "postgresql://a@h/db")
    assert capsys.readouterr().err == ""
    assert parser.parse_args([*base, "--ledger-url", "postgresql://b@h/db"]).ledger_url == (
        "postgresql://b@h/db")
    assert "--ledger-url is deprecated; use --ledger" in capsys.readouterr().err


def _flag_literals(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, option) of every ``add_argument("--...")`` option string naming a ledger URL."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            for arg in node.args:
                if (isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                        and arg.value in (flags.LEDGER_FLAG, *OLD_SPELLINGS)):
                    out.append((node.lineno, arg.value))
    return out


def _python_files() -> list[pathlib.Path]:
    return [p for d in ("sage_tfx", "components", "pipelines", "benchmarks", "scripts")
            for p in sorted((ROOT / d).rglob("*.py"))]


def test_every_command_declares_the_ledger_through_the_one_helper():
    """No parser adds ``--ledger`` / ``--url`` / ``--ledger-url`` by hand: each goes through
    ``flags.add_ledger_argument``, so the spelling and the deprecation notes stay one."""
    found = {str(p.relative_to(ROOT)): hits for p in _python_files()
             if (hits := _flag_literals(p))}
    assert found == {}, f"ledger flags added by hand: {found}"


def test_the_scan_finds_a_hand_made_flag(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import argparse\np = argparse.ArgumentParser()\n"
                     "p.add_argument('--url', required=True)\n")
    assert _flag_literals(probe) == [(3, "--url")]
