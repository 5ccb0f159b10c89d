"""What the demos share (``pipelines/demo_cli.py``): ``--help`` says in a whole sentence what
each demo is, and a demo writes nothing outside ``--out`` (its key-encryption key included)."""
import importlib
import os

import pytest

from sage_tfx.ledger import keys
from sage_tfx.pipelines import demo_cli

DEMOS = ("sage_demo", "stream_demo", "ptk_demo", "pyramid_demo", "bagging_demo", "dnd_demo")


@pytest.mark.parametrize("name", DEMOS)
def test_help_describes_the_demo_in_a_whole_sentence(name, capsys):
    demo = importlib.import_module(f"sage_tfx.pipelines.{name}")
    with pytest.raises(SystemExit) as done:
        demo.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    description = "".join(text.split("\n\n")[1].split())  # after the usage lines
    assert description.endswith("."), description
    assert description == "".join(demo.__doc__.split("\n\n")[0].split())  # all of it
    if name == "stream_demo":  # the main job is sage_demo
        assert "main job" not in description and "ledger-only" in description


def test_a_demo_keeps_its_key_file_in_its_output_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(keys.PROVIDER_ENV, raising=False)
    monkeypatch.setattr(demo_cli, "_OWN_KEY_PROVIDER", None)
    first = demo_cli.fresh_out(str(tmp_path / "a"))
    assert os.environ[keys.PROVIDER_ENV] == f"file:{first}/kek.json"
    second = demo_cli.fresh_out(str(tmp_path / "b"))  # the next demo of this process moves it
    assert os.environ[keys.PROVIDER_ENV] == f"file:{second}/kek.json"
    monkeypatch.setenv(keys.PROVIDER_ENV, "file:/the/users/kek.json")
    demo_cli.fresh_out(str(tmp_path / "c"))  # a key provider the user named stays
    assert os.environ[keys.PROVIDER_ENV] == "file:/the/users/kek.json"


@pytest.mark.slow  # a Beam split
def test_the_stream_demo_writes_nothing_outside_out(tmp_path, monkeypatch, capsys):
    from sage_tfx.pipelines import stream_demo

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv(keys.PROVIDER_ENV, raising=False)
    monkeypatch.setattr(demo_cli, "_OWN_KEY_PROVIDER", None)
    out = tmp_path / "out"
    assert stream_demo.main(["--days", "8", "--no-tfx", "--out", str(out)]) == 0
    assert "audit chain" in capsys.readouterr().out
    assert (out / "kek.json").is_file()
    assert not (home / ".config" / "sage-tfx").exists()  # the library's default key file
