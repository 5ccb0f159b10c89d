"""`sage-tfx compile` / `submit` hand their arguments to the pipeline layer's commands (no TFX
in the core)."""
import sys

import pytest

from sage_tfx import cli


@pytest.mark.parametrize("command, args", [
    ("compile", ["--target", "kubeflow", "flights-dp", "--beam-arg=--runner=DirectRunner",
                 "--help"]),
    ("submit", ["out/gate-stats.yaml", "--host", "http://127.0.0.1:1", "--param",
                "epsilon=1"]),
])
def test_the_command_runs_the_pipeline_layers_module_with_the_arguments(monkeypatch, command,
                                                                        args):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda argv, env: calls.append((argv, env)) or 3)
    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    assert cli.main(["--ledger", "postgresql://sage@h:5432/l", command, *args]) == 3
    [(argv, env)] = calls
    assert argv == [sys.executable, "-m", f"sage_tfx.pipelines.{command}", *args]
    # --ledger is the compiled pipeline's ledger; a submitted run has its own (compiled in).
    assert env.get("SAGE_LEDGER_URL") == (
        "postgresql://sage@h:5432/l" if command == "compile" else None)
    # Without --ledger the environment decides, and no ledger file is opened or created.
    calls.clear()
    assert cli.main([command, *args]) == 3
    assert "SAGE_LEDGER_URL" not in calls[0][1]


@pytest.mark.parametrize("command", ["compile", "submit"])
def test_help_is_quiet_and_imports_no_tensorflow(command):
    import subprocess

    probe = (f"import sys; from sage_tfx.pipelines import {command} as m; m.build_parser(); "
             "heavy = [n for n in ('tensorflow', 'tfx', 'apache_beam') if n in sys.modules]; "
             "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=300)
    help_run = subprocess.run([sys.executable, "-m", f"sage_tfx.pipelines.{command}", "--help"],
                              capture_output=True, text=True, timeout=300)
    assert help_run.returncode == 0 and help_run.stderr == "", help_run.stderr
    assert help_run.stdout.startswith(f"usage: sage-tfx {command}")
    if command == "compile":  # every pipeline, with its runtime parameters
        for name in ("flights-dp", "gate-stats", "ptk", "pyramid", "dp-bagging", "dnd"):
            assert f"  {name}: " in help_run.stdout
