"""`sage-tfx submit`: a compiled KFP package started as a run, against a KFP API stand-in on
127.0.0.1 (fake_kfp) that records what it is sent. No TensorFlow: these run in seconds; the
slow test in test_runtime_parameters.py submits a real compiled package and runs it."""
import json
import socket

import pytest
import yaml

from fake_kfp import RUNS_PATH, FakeKfp

from sage_tfx.pipelines import kfp_package, submit

TOKEN = "kfp-bearer-7d1c0e"


def _package(tmp_path, platform=None):
    """A KFP v2 package shaped like the gate-stats one sage-tfx compile writes."""
    spec = {
        "pipelineInfo": {"name": "gate-stats"}, "schemaVersion": "2.1.0",
        "deploymentSpec": {"executors": {"SageGate_executor": {"container": {"image": "i"}},
                                         "StatisticsGen_executor": {"container": {"image": "i"}}}},
        "root": {"inputDefinitions": {"parameters": {
            "epsilon": {"parameterType": "NUMBER_DOUBLE", "defaultValue": 0.5,
                        "isOptional": True},
            "delta": {"parameterType": "NUMBER_DOUBLE", "defaultValue": 1e-6,
                      "isOptional": True},
            "window_last": {"parameterType": "NUMBER_INTEGER", "defaultValue": 3,
                            "isOptional": True}}},
            "dag": {"tasks": {}}},
    }
    path = tmp_path / "gate-stats.yaml"
    with open(path, "w") as f:
        yaml.safe_dump_all([spec] + ([platform] if platform else []), f)
    return str(path), spec


def test_submit_sends_the_package_and_typed_parameters(tmp_path, monkeypatch, capsys):
    path, spec = _package(tmp_path)
    monkeypatch.setenv("MY_KFP_TOKEN", TOKEN)
    with FakeKfp() as kfp:
        rc = submit.main([path, "--host", kfp.url, "--param", "epsilon=0.25",
                          "--param", "window_last=5", "--run-name", "nightly",
                          "--kfp-token", "env:MY_KFP_TOKEN", "--experiment-id", "exp-1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    [req] = kfp.requests
    assert req["path"] == RUNS_PATH
    assert req["headers"]["authorization"] == f"Bearer {TOKEN}"
    body = req["body"]
    assert body["pipeline_spec"] == spec  # the package as compiled, no platform spec
    assert body["runtime_config"] == {"parameters": {"epsilon": 0.25, "window_last": 5}}
    assert isinstance(body["runtime_config"]["parameters"]["window_last"], int)
    assert (body["display_name"], body["experiment_id"]) == ("nightly", "exp-1")
    assert "run " in out and "nightly" in out
    assert TOKEN not in out + err


def test_submit_maps_secrets_into_every_pod_and_keeps_the_packages_own(tmp_path, capsys):
    platform = kfp_package.kubernetes_platform_spec(
        ["SageGate_executor", "StatisticsGen_executor"], {"SAGE_LEDGER_URL": ("old", "url")})
    path, spec = _package(tmp_path, platform)
    with FakeKfp() as kfp:
        assert submit.main([path, "--host", kfp.url, "--ledger-secret", "sage-ledger:url",
                            "--token-secret", "sage-etl:token"]) == 0
    body = kfp.requests[0]["body"]
    assert body["pipeline_spec"]["pipeline_spec"] == spec
    executors = body["pipeline_spec"]["platform_spec"]["platforms"]["kubernetes"][
        "deploymentSpec"]["executors"]
    assert set(executors) == {"SageGate_executor", "StatisticsGen_executor"}
    for config in executors.values():
        env = {p["envVar"]: (e["secretName"], p["secretKey"])
               for e in config["secretAsEnv"] for p in e["keyToEnv"]}
        assert env == {"SAGE_LEDGER_URL": ("sage-ledger", "url"),
                       "SAGE_LEDGER_TOKEN": ("sage-etl", "token")}
    assert body["runtime_config"] == {"parameters": {}}  # the compiled defaults


@pytest.mark.parametrize("args, message", [
    (["--param", "epsilon=0"], "epsilon"),
    (["--param", "epsilon=-1"], "epsilon"),
    (["--param", "epsilon=nan"], "number_double"),
    (["--param", "epsilon=inf"], "number_double"),
    (["--param", "delta=1"], "delta"),
    (["--param", "window_last=0"], "Window"),
    (["--param", "window_last=2.5"], "number_integer"),
    (["--param", "stream=other"], "no parameter stream"),
    (["--param", "epsilon"], "NAME=VALUE"),
    (["--param", "epsilon=1", "--param", "epsilon=2"], "twice"),
    (["--ledger-secret", "Not_A_Secret"], "NAME:KEY"),
    (["--kfp-token", TOKEN], "reference"),
])
def test_bad_input_is_refused_before_anything_is_sent(tmp_path, capsys, args, message):
    path, _ = _package(tmp_path)
    with FakeKfp() as kfp:
        rc = submit.main([path, "--host", kfp.url, *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert kfp.requests == []
    assert TOKEN not in err


def test_a_required_parameter_without_default_must_be_given(tmp_path, capsys):
    path, spec = _package(tmp_path)
    del spec["root"]["inputDefinitions"]["parameters"]["epsilon"]["defaultValue"]
    del spec["root"]["inputDefinitions"]["parameters"]["epsilon"]["isOptional"]
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    with FakeKfp() as kfp:
        assert submit.main([path, "--host", kfp.url]) == 2
        assert "--param for epsilon" in capsys.readouterr().err
        assert submit.main([path, "--host", kfp.url, "--param", "epsilon=1"]) == 0
    assert len(kfp.requests) == 1


def test_not_a_package_is_refused(tmp_path, capsys):
    bad = tmp_path / "job.json"
    bad.write_text(json.dumps({"pipelineSpec": {}}))
    assert submit.main([str(bad), "--host", "http://127.0.0.1:9"]) == 2
    assert "not a Kubeflow Pipelines v2 package" in capsys.readouterr().err
    assert submit.main([str(tmp_path / "missing.yaml"), "--host", "http://127.0.0.1:9"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_server_refusal_and_unreachable_endpoint_are_clear_errors(tmp_path, monkeypatch,
                                                                  capsys):
    path, _ = _package(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with FakeKfp(status=401) as kfp:
        rc = submit.main([path, "--host", kfp.url, "--kfp-token", f"file:{token_file}"])
    err = capsys.readouterr().err
    assert rc == 1 and "answered 401" in err and TOKEN not in err
    assert kfp.requests[0]["headers"]["authorization"] == f"Bearer {TOKEN}"
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = submit.main([path, "--host", f"http://127.0.0.1:{port}", "--timeout", "5"])
    assert rc == 1 and "cannot reach" in capsys.readouterr().err
