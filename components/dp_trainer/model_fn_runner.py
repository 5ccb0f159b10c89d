"""Runs the user's ``model_fn`` in a process of its own; only JSON comes back.

The executor that trains and exports never imports the user's module: a module written to defeat
the checks could otherwise patch the executor's own code (the allow-lists, the noise, the
export). :func:`run_model_fn` starts ``python -m sage_tfx.components.dp_trainer.model_fn_runner
REQUEST RESPONSE``; that process loads the module the way TFX's Trainer does
(``udf_utils.get_fn``, module file, module path or dotted name), calls ``model_fn(fn_args)``
with :class:`~sage_tfx.components.dp_trainer.model_fn.ModelFnArgs` (no data paths), and writes
``model_fn.spec_to_json`` of the result — the model's ``to_json()``, the loss and optimizer
configurations, the settings. The executor parses and checks that JSON
(``model_fn.parse_training_spec``).

The child cannot read the training data: before it imports anything of the module it restricts
itself with Landlock (``sandbox.py``) to the Python installation, the module, the transform graph
and the schema, with no TCP, and its environment holds no ledger URL, token or key setting. The
isolation it ran under is returned with the result (``{"landlock_abi": N}``, 0: none available)
and recorded with the model.

The module's output (stdout / stderr) is kept out of the executor's log unless the call fails
(then its last lines explain why).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Mapping, Optional, Sequence

from sage_tfx.components.dp_trainer import model_fn as model_fn_lib
from sage_tfx.components.dp_trainer import sandbox
from sage_tfx.errors import InvalidRequestError

DEFAULT_TIMEOUT_SECONDS = 1800
_TAIL_LINES = 40
_EXEC_KEYS = ("module_file", "module_path", model_fn_lib.MODEL_FN)


class ModelFnError(InvalidRequestError):
    """The user's ``model_fn`` could not be loaded or called, or returned something else."""


def _beneath(path: str, root: str) -> bool:
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _readable(paths: Sequence[Optional[str]], data: Sequence[str]) -> list:
    """The local paths among ``paths`` that hold none of the ``data`` paths."""
    out = []
    for path in paths:
        if path and "://" not in path and os.path.exists(path) and not any(
                _beneath(d, path) for d in data):
            out.append(os.path.realpath(path))
    return out


def run_model_fn(exec_properties: Mapping[str, Any], args: model_fn_lib.ModelFnArgs, *,
                 data_paths: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT_SECONDS
                 ) -> tuple[dict, dict]:
    """(the JSON of ``model_fn(args)``, the isolation it ran under), from a child process.

    Args:
      exec_properties: the trainer's (module_file / module_path / model_fn).
      args: what model_fn receives.
      data_paths: local paths of private data (the examples, the pipeline's outputs): no path
        the child may read holds one.
      timeout: seconds before the child is killed.

    Raises:
      ModelFnError: the module or function is missing, model_fn raised, returned another type,
        timed out, or the child died.
    """
    props = {k: exec_properties.get(k) for k in _EXEC_KEYS if exec_properties.get(k)}
    module_file = props.get("module_file")
    module_dir = os.path.dirname(module_file) if isinstance(module_file, str) else None
    data = [os.path.realpath(d) for d in data_paths if d and "://" not in d]
    # A model_fn by import path ("package.module.fn"): its top-level package, found without
    # running any of it.
    fn_path = props.get(model_fn_lib.MODEL_FN)
    package = (sandbox.package_dirs(str(fn_path).split(".")[0])
               if fn_path and not module_file else [])
    extra = _readable([module_dir, args.transform_output, args.schema_path, *package], data)
    if module_file and module_dir not in extra:
        extra += _readable([module_file], data)
    # Where the executor's own imports come from (e.g. a TFX user-module wheel TFX installed),
    # minus the working directory and anything holding data.
    paths = _readable([p for p in sys.path if p and os.path.isdir(p)
                       and os.path.realpath(p) != os.path.realpath(os.getcwd())], data)
    request = {"exec_properties": props,
               "args": {"transform_output": args.transform_output,
                        "schema_path": args.schema_path,
                        "custom_config": args.custom_config},
               "sandbox": {"read": extra, "data": data}}
    with tempfile.TemporaryDirectory(prefix="sage-model-fn-") as tmp:
        req, resp = os.path.join(tmp, "request.json"), os.path.join(tmp, "response.json")
        with open(req, "w") as f:
            json.dump(request, f)
        env = sandbox.clean_environment(dict(os.environ))
        env.update(TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                   HOME=tmp, KERAS_HOME=tmp, TMPDIR=tmp,
                   PYTHONPATH=os.pathsep.join(paths))
        try:
            proc = subprocess.run([sys.executable, "-m", __name__, req, resp], env=env,
                                  cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise ModelFnError(f"model_fn did not return within {timeout:.0f} s") from e
        output = proc.stdout.decode("utf-8", "replace").splitlines()[-_TAIL_LINES:]
        result = None
        if os.path.exists(resp):
            with open(resp) as f:
                try:
                    result = json.load(f)
                except ValueError:
                    result = None
    if not isinstance(result, dict):
        raise ModelFnError(f"model_fn's process exited with code {proc.returncode} without a "
                           "result; its last output:\n" + "\n".join(output))
    if not result.get("ok"):
        raise ModelFnError(f"{result.get('error')}\n(model_fn's last output:\n"
                           + "\n".join(output) + ")")
    return result["spec"], dict(result.get("isolation") or {})


def _child(request_path: str, response_path: str) -> int:
    with open(request_path) as f:
        request = json.load(f)
    box = request.get("sandbox") or {}
    data = list(box.get("data") or [])
    reads = [p for p in sandbox.default_read_paths() + list(box.get("read") or [])
             if not any(_beneath(d, p) for d in data)]
    tmp = os.path.dirname(os.path.abspath(response_path))
    abi = sandbox.restrict(reads, [tmp, *sandbox.WRITABLE_DEVICES])   # before any module import
    isolation = {"landlock_abi": abi}
    try:
        from tfx.components.util import udf_utils
        props = dict(request["exec_properties"])
        if not any(props.get(k) for k in _EXEC_KEYS):
            raise ModelFnError("DPTrainer needs module_file or model_fn")
        try:
            fn = udf_utils.get_fn(props, model_fn_lib.MODEL_FN)
        except (AttributeError, ImportError, ValueError) as e:
            raise ModelFnError(f"could not load {model_fn_lib.MODEL_FN} from the trainer module "
                               f"({props}): {e}. A DPTrainer module defines model_fn(fn_args) "
                               "returning a DPSGDSpec (not run_fn)") from e
        args = model_fn_lib.ModelFnArgs(**request["args"])
        text = json.dumps({"ok": True, "spec": model_fn_lib.spec_to_json(fn(args)),
                           "isolation": isolation})
    except Exception as e:  # noqa: BLE001 - everything the module raises is reported, typed
        text = json.dumps({"ok": False, "error": f"model_fn failed: {type(e).__name__}: {e}",
                           "isolation": isolation})
    with open(response_path, "w") as f:
        f.write(text)
    return 0


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m sage_tfx.components.dp_trainer.model_fn_runner REQUEST RESPONSE",
              file=sys.stderr)
        return 2
    return _child(*argv)


if __name__ == "__main__":
    sys.exit(main())
