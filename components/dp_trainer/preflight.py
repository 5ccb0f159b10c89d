"""What the DP Trainer refuses from its configuration alone, checked before anything is charged.

:func:`check` reads the trainer module's *source* (never imports or runs it) and refuses a module
without ``model_fn`` — e.g. a stock Trainer module with only ``run_fn`` — and settings the
executor would refuse, with the message the executor would give. ``DPTrainer`` calls it when
the pipeline is built; a gate's preflight may call it again before it charges (the exec
properties are those the executor receives).
"""
from __future__ import annotations

import ast
import importlib.util
import math
import os
from typing import Any, Mapping, Optional

from sage_tfx.components.dp_trainer import model_fn as model_fn_lib
from sage_tfx.errors import InvalidRequestError

MODULE_FILE_KEY = "module_file"
MODULE_PATH_KEY = "module_path"
RUN_FN_KEY = "run_fn"
OUTPUT_SCALE_KEY = "output_scale"
OUTPUT_OFFSET_KEY = "output_offset"


class TrainerConfigError(InvalidRequestError):
    """A DPTrainer configuration its executor would refuse."""


def _defines(source: str, name: str, where: str) -> bool:
    try:
        tree = ast.parse(source, filename=where)
    except SyntaxError as e:
        raise TrainerConfigError(f"the trainer module {where} does not parse: {e}") from e
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name.split(".")[-1]) == name for a in node.names):
            return True
    return False


def _module_source(module: str) -> Optional[tuple[str, str]]:
    """(source, path) of an importable module, found without importing it (None: not found)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin) \
            or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        return f.read(), spec.origin


def _refuse_missing(where: str, name: str, has_run_fn: bool) -> TrainerConfigError:
    hint = (" It defines run_fn, the stock Trainer's entry point: a DPTrainer module ends in "
            f"{model_fn_lib.MODEL_FN}(fn_args) returning a DPSGDSpec (the model, the label, the "
            "loss); the executor reads the data, trains with DP-SGD and exports the model "
            "itself" if has_run_fn else "")
    return TrainerConfigError(f"the trainer module {where} defines no {name}(fn_args).{hint}")


def check(exec_properties: Mapping[str, Any]) -> None:
    """Refuses a DPTrainer configuration its executor would refuse (module doc).

    A module the checking process cannot see (e.g. a packaged ``module_path`` installed only in
    the trainer's image) is left to the executor.

    Raises:
      TrainerConfigError: no module, a module without ``model_fn``, a ``run_fn``, or output
        constants that are not finite (a zero scale).
    """
    props = dict(exec_properties)
    if props.get(RUN_FN_KEY):
        raise TrainerConfigError(
            f"DPTrainer takes {model_fn_lib.MODEL_FN}, not run_fn ({props[RUN_FN_KEY]!r}): the "
            "executor trains and exports the model itself; give module_file (with "
            f"{model_fn_lib.MODEL_FN}) or {model_fn_lib.MODEL_FN}='package.module.function'")
    for key, default in ((OUTPUT_SCALE_KEY, 1.0), (OUTPUT_OFFSET_KEY, 0.0)):
        value = props.get(key, default)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or (key == OUTPUT_SCALE_KEY and value == 0):
            what = "a finite number ≠ 0" if key == OUTPUT_SCALE_KEY else "a finite number"
            raise TrainerConfigError(f"{key} must be {what}, got {value!r}")
    module_file = props.get(MODULE_FILE_KEY)
    module_path = props.get(MODULE_PATH_KEY)
    fn = props.get(model_fn_lib.MODEL_FN)
    if not (module_file or module_path or fn):
        raise TrainerConfigError(f"DPTrainer needs module_file or {model_fn_lib.MODEL_FN}")
    if isinstance(module_file, str) and module_file and "://" not in module_file:
        name = fn or model_fn_lib.MODEL_FN
        if not os.path.isfile(module_file):
            if module_path:  # packaged (TFX user-module wheel): the executor installs it
                return
            raise TrainerConfigError(f"the trainer module file {module_file!r} does not exist")
        with open(module_file, encoding="utf-8") as f:
            source = f.read()
        if not _defines(source, name, module_file):
            raise _refuse_missing(module_file, name, _defines(source, RUN_FN_KEY, module_file))
        return
    if module_path:
        found = _module_source(module_path)
        if found is not None and not _defines(found[0], model_fn_lib.MODEL_FN, found[1]):
            raise _refuse_missing(module_path, model_fn_lib.MODEL_FN,
                                  _defines(found[0], RUN_FN_KEY, found[1]))
        return
    if fn:
        module, _, attr = str(fn).rpartition(".")
        if not module or not attr:
            raise TrainerConfigError(f"{model_fn_lib.MODEL_FN} must be a dotted path "
                                     f"'package.module.function', got {fn!r}")
        found = _module_source(module)
        if found is not None and not _defines(found[0], attr, found[1]):
            raise TrainerConfigError(f"module {module} ({found[1]}) defines no {attr}")
