"""`sage-tfx compile` hands its arguments to the pipeline layer's compiler (no TFX in the core)."""
import sys

from sage_tfx import cli


def test_compile_runs_the_pipeline_compiler_with_the_arguments_and_ledger(monkeypatch):
    calls = []
    monkeypatch.setattr("subprocess.call", lambda argv, env: calls.append((argv, env)) or 3)
    monkeypatch.delenv("SAGE_LEDGER_URL", raising=False)
    args = ["--target", "kubeflow", "flights-dp", "--beam-arg=--runner=DirectRunner", "--help"]
    assert cli.main(["--ledger", "postgresql://sage@h:5432/l", "compile", *args]) == 3
    [(argv, env)] = calls
    assert argv == [sys.executable, "-m", "sage_tfx.pipelines.compile", *args]
    assert env["SAGE_LEDGER_URL"] == "postgresql://sage@h:5432/l"
    # Without --ledger the environment decides, and no ledger file is opened or created.
    calls.clear()
    assert cli.main(["compile", "--target", "airflow", "gate-stats"]) == 3
    assert "SAGE_LEDGER_URL" not in calls[0][1]

