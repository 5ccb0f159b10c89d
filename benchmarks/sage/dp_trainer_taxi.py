"""Benchmark: the DP Trainer on TFX's Chicago taxi example — utility, speed and memory.

What it measures (the DP Trainer issue's benchmark; numbers printed and written to
``benchmarks/results/sage/dp_trainer_taxi.{csv,md,png}``):

1. **Utility.** The taxi module's own wide-and-deep model (``pipelines/taxi_utils_dp.py``: TFX's
   ``_build_keras_model``, unchanged) trained by the DPTrainer executor at ε ∈ {1, 3, 8}
   (δ = 1e-5, batch 256, 10 epochs, C = 1, Adam(1e-2): the module's DP settings) against the
   same architecture trained without DP (Keras ``fit`` as the original ``run_fn`` does, the
   same optimizer, batch size and epochs) on the same split: accuracy and AUC of "big tipper"
   on the held-out third, scored through the exported serving signature (raw tf.Examples in).
   The transform is TFX's original ``preprocessing_fn`` with exact statistics for both: this
   benchmark isolates the trainer (the DP transform's own cost is the DP Transform benchmark's),
   and records that graph in the ledger as the grant's transform release, which only a
   DPTransform does in a pipeline.
2. **Speed.** Seconds per epoch of the DP-SGD loop (Poisson batches from disk, the one-pass
   clipped sum both models' all-Dense layers take, noise) against Keras ``fit`` (batches from
   disk) for the wide-and-deep model and for a 256-256 MLP on the same features; steady state
   (the first step / epoch, which traces, left out), rounds alternated, medians.
3. **Memory.** Peak resident memory of the Beam job that builds the batches and of the DP-SGD
   loop, each in its own process, on the training split and on 10 copies of it.
4. **The conversion.** Non-blank lines of the training half of TFX's module (its imports,
   signature builders, ``_input_fn``, model builders and ``run_fn``) removed and added in
   ``pipelines/taxi_utils_dp.py``, by function (no training; always printed).

Usage: python benchmarks/sage/dp_trainer_taxi.py [--epsilons 1,3,8] [--epochs 10]
           [--rounds 2] [--scale 10] [--quick] [--out benchmarks/results/sage]
"""
from __future__ import annotations

import argparse
import collections
import csv
import difflib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODULE = os.path.join(ROOT, "pipelines", "taxi_utils_dp.py")
LABEL, RAW_LABEL = "tips_xf", "tips"
DELTA = 1e-5


def _quiet() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import warnings
    warnings.filterwarnings("ignore")
    from absl import logging
    logging.set_verbosity(logging.ERROR)


def _taxi_module():
    """TFX's own taxi module (the original preprocessing_fn and model builder)."""
    import importlib

    import tfx
    path = os.path.join(os.path.dirname(tfx.__file__), "examples", "chicago_taxi_pipeline")
    sys.path.insert(0, path)
    try:
        return importlib.import_module("taxi_utils_native_keras")
    finally:
        sys.path.remove(path)


# --- data ---------------------------------------------------------------------------------------


def prepare(work: str) -> dict:
    """Raw taxi Examples split 2:1 (by row), the original transform fitted on the train split,
    and both splits transformed, in ExampleGen's layout (cached in ``work``)."""
    done = os.path.join(work, "prepared.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import schema_utils

    from sage_tfx.streams import example_codec, records
    from sage_tfx.streams.datasets import chicago_taxi_csv_path
    csv_path = chicago_taxi_csv_path()
    types = records.infer_csv_schema([csv_path])
    columns = records.read_csv_header(csv_path)
    raw = {"train": [], "eval": []}
    instances = []   # the train rows as tf.Transform instance dicts ({name: [value] or []})
    for i, row in records.iter_csv_rows(csv_path):
        values = records.parse_csv_row(row, columns, [types[c] for c in columns])
        split = "eval" if i % 3 == 0 else "train"
        raw[split].append(example_codec.encode_example(values, types))
        if split == "train":
            instances.append({k: [] if v is None else [v] for k, v in values.items()})
    tf_types = {example_codec.INT: tf.int64, example_codec.FLOAT: tf.float32,
                example_codec.STRING: tf.string}
    spec = {k: tf.io.VarLenFeature(tf_types[t]) for k, t in types.items()}
    schema = schema_utils.schema_from_feature_spec(spec)
    taxi = _taxi_module()
    graph = os.path.join(work, "transform_graph")
    parse = lambda batch: tf.io.parse_example(tf.constant(batch), spec)  # noqa: E731
    with tft_beam.Context(temp_dir=os.path.join(work, "tft_tmp"), force_tf_compat_v1=False):
        transform_fn = ((instances, tft.DatasetMetadata(schema))
                        | tft_beam.AnalyzeDataset(taxi.preprocessing_fn))
        _ = transform_fn | tft_beam.WriteTransformFn(graph)
    from tensorflow_transform.tf_metadata import metadata_io
    metadata_io.write_metadata(tft.DatasetMetadata(schema),
                               os.path.join(graph, tft.TFTransformOutput.RAW_METADATA_DIR))
    layer = tft.TFTransformOutput(graph).transform_features_layer()
    info = {"graph": graph, "examples": os.path.join(work, "examples"),
            "raw": os.path.join(work, "raw"), "rows": {k: len(v) for k, v in raw.items()}}
    for split, rows in raw.items():
        os.makedirs(os.path.join(info["raw"], f"Split-{split}"), exist_ok=True)
        os.makedirs(os.path.join(info["examples"], f"Split-{split}"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(info["raw"], f"Split-{split}", "data.gz"),
                                  options="GZIP") as w:
            for r in rows:
                w.write(r)
        with tf.io.TFRecordWriter(os.path.join(info["examples"], f"Split-{split}",
                                               "data.gz"), options="GZIP") as w:
            for start in range(0, len(rows), 2048):
                out = {k: v.numpy() for k, v in layer(parse(rows[start:start + 2048])).items()}
                for j in range(len(out[LABEL])):
                    w.write(_example({k: v[j] for k, v in out.items()}))
    with open(done, "w") as f:
        json.dump(info, f)
    return info


def _example(values: dict) -> bytes:
    import tensorflow as tf
    ex = tf.train.Example()
    for k, v in values.items():
        v = np.asarray(v)
        if v.dtype.kind in "iu":
            ex.features.feature[k].int64_list.value.append(int(v))
        elif v.dtype.kind == "f":
            ex.features.feature[k].float_list.value.append(float(v))
        else:
            ex.features.feature[k].bytes_list.value.append(bytes(v))
    return ex.SerializeToString()


def replicate(info: dict, copies: int, work: str) -> str:
    """The transformed train split, ``copies`` times (the memory runs' larger data)."""
    out = os.path.join(work, f"examples_x{copies}")
    if os.path.isdir(out):
        return out
    os.makedirs(os.path.join(out, "Split-train"))
    for k in range(copies):
        shutil.copy(os.path.join(info["examples"], "Split-train", "data.gz"),
                    os.path.join(out, "Split-train", f"data-{k:03d}.gz"))
    return out


# --- utility ------------------------------------------------------------------------------------


def _grant(work: str, name: str, epsilon: float, graph: str):
    """A ledger grant with a train part (ε, δ) and the transform graph recorded as its release."""
    from tfx.types import standard_artifacts

    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.ledger import BlockSpec, open_ledger, releases
    url = f"sqlite:///{work}/{name}.db"
    plan = PrivacyPlan.of(PlanPart("train", float(epsilon), DELTA))
    with open_ledger(url) as ledger:
        ledger.create_stream("taxi", epsilon_g=100.0, delta_g=1e-4)
        ledger.add_blocks("taxi", [BlockSpec("all", f"{work}/blocks")])
        decision = ledger.request("taxi", run_id=name, blocks=["all"], **plan.cost())
        released = standard_artifacts.TransformGraph()
        released.uri = os.path.join(work, f"{name}_graph")

        def copy(staging):
            shutil.rmtree(staging)
            shutil.copytree(graph, staging)
        releases.release_tree_once(ledger, decision.grant.grant_id, "transform/transform_graph",
                                   released.uri, copy)
    grant = artifacts.SageGrant()
    grant.uri = os.path.join(work, f"{name}_grant")
    artifacts.write_grant(grant, decision.grant, stream="taxi", run_id=name, context="default",
                          ledger_url=url)
    plan_io.write_plan(grant, plan)
    return grant, released


def dp_train(info: dict, work: str, epsilon: float, epochs: int, batch: int,
             learning_rate: float) -> tuple:
    """(Model uri, properties, seconds) of the DPTrainer executor at ε."""
    from tfx.proto import trainer_pb2
    from tfx.types import artifact_utils, standard_artifacts
    from tfx.utils import json_utils, proto_utils

    from sage_tfx.components.dp_trainer import executor, spec
    name = f"dp_eps{epsilon:g}"
    shutil.rmtree(os.path.join(work, name), ignore_errors=True)
    grant, graph = _grant(work, name, epsilon, info["graph"])
    examples = standard_artifacts.Examples()
    examples.uri = info["examples"]
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    model = standard_artifacts.Model()
    model.uri = os.path.join(work, name)
    run = standard_artifacts.ModelRun()
    run.uri = os.path.join(work, name + "_run")
    props = {spec.TRAIN_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.TrainArgs()),
             spec.EVAL_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.EvalArgs()),
             spec.CUSTOM_CONFIG_KEY: json_utils.dumps({"epochs": epochs, "batch_size": batch,
                                                       "learning_rate": learning_rate}),
             spec.MODULE_FILE_KEY: MODULE}
    start = time.monotonic()
    executor.Executor().Do({spec.EXAMPLES_KEY: [examples], spec.GRANT_INPUT_KEY: [grant],
                            spec.TRANSFORM_GRAPH_KEY: [graph]},
                           {spec.MODEL_KEY: [model], spec.MODEL_RUN_KEY: [run]}, props)
    seconds = time.monotonic() - start
    with open(os.path.join(model.uri, executor.PROPERTIES_FILE_NAME)) as f:
        return model.uri, json.load(f), seconds


def _labels(info: dict) -> np.ndarray:
    import tensorflow as tf
    ds = tf.data.TFRecordDataset(os.path.join(info["examples"], "Split-eval", "data.gz"),
                                 compression_type="GZIP")
    return np.array([tf.train.Example.FromString(r.numpy()).features.feature[LABEL]
                     .int64_list.value[0] for r in ds], np.float64)


def _raw_eval(info: dict) -> list:
    import tensorflow as tf
    ds = tf.data.TFRecordDataset(os.path.join(info["raw"], "Split-eval", "data.gz"),
                                 compression_type="GZIP")
    return [r.numpy() for r in ds]


def score(probabilities: np.ndarray, labels: np.ndarray) -> dict:
    from sklearn.metrics import roc_auc_score
    p = np.asarray(probabilities, np.float64).reshape(-1)
    return {"accuracy": float(np.mean((p > 0.5) == (labels == 1))),
            "auc": float(roc_auc_score(labels, p))}


def serve_probabilities(model_uri: str, raw: list) -> np.ndarray:
    import tensorflow as tf
    fn = tf.saved_model.load(os.path.join(model_uri, "Format-Serving")).signatures[
        "serving_default"]
    out = [fn(examples=tf.constant(raw[i:i + 1024]))["predictions"].numpy()
           for i in range(0, len(raw), 1024)]
    return np.concatenate(out)[:, 0]


def _transformed_dataset(info: dict, split: str, batch: int, spec: dict, repeat: bool = False):
    import tensorflow as tf
    files = tf.io.gfile.glob(os.path.join(info["examples"], f"Split-{split}", "*"))
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP")
    if repeat:
        ds = ds.shuffle(4096)
    ds = ds.batch(batch).map(lambda r: tf.io.parse_example(r, spec))

    def split_label(d):
        d = dict(d)
        y = d.pop(LABEL)
        return d, y
    return ds.map(split_label).prefetch(2)


def non_dp(info: dict, epochs: int, batch: int, build, learning_rate: float = 0.01) -> tuple:
    """(model, per-epoch (wall, CPU) seconds) of Keras fit of the same architecture, no DP."""
    import tensorflow as tf
    import tensorflow_transform as tft
    spec = dict(tft.TFTransformOutput(info["graph"]).transformed_feature_spec())
    model = build()
    model.compile(loss="binary_crossentropy",
                  optimizer=tf.keras.optimizers.Adam(learning_rate))
    ds = _transformed_dataset(info, "train", batch, spec, repeat=True)
    ds = ds.map(lambda x, y: ({k: tf.cast(v, model.get_layer(k).dtype)
                               if k in model.input_names else v for k, v in x.items()}, y))
    times = []

    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            times.append((time.perf_counter() - self.t[0], time.process_time() - self.t[1]))
    model.fit(ds, epochs=epochs, verbose=0, callbacks=[Timer()])
    return model, times


def _model_inputs(model, x: dict) -> dict:
    import tensorflow as tf
    return {k: tf.cast(x[k], model.get_layer(k).dtype) for k in model.input_names}


def non_dp_probabilities(info: dict, model) -> np.ndarray:
    import tensorflow_transform as tft
    spec = dict(tft.TFTransformOutput(info["graph"]).transformed_feature_spec())
    out = [model(_model_inputs(model, x), training=False).numpy().reshape(-1)
           for x, _ in _transformed_dataset(info, "eval", 1024, spec)]
    return np.concatenate(out)


# --- speed: the DP-SGD loop against fit -------------------------------------------------------


def mlp(taxi) -> Any:
    """A 256-256 MLP over the taxi features (all of them, one-hot and numeric)."""
    import tensorflow as tf
    base = taxi._build_keras_model([4])   # the same inputs and feature columns
    columns = []
    for layer in base.layers:
        if type(layer).__name__ == "DenseFeatures":
            columns += list(layer._feature_columns)  # pylint: disable=protected-access
    inputs = {layer.name: layer.output for layer in base.layers
              if type(layer).__name__ == "InputLayer"}
    x = tf.keras.layers.DenseFeatures(columns)(inputs)
    for units in (256, 256):
        x = tf.keras.layers.Dense(units, activation="relu")(x)
    out = tf.keras.layers.Dense(1, activation="sigmoid")(x)
    return tf.keras.Model(inputs, tf.squeeze(out, -1))


def dp_loop_epochs(info: dict, work: str, build, epochs: int, batch: int,
                   examples_dir: Optional[str] = None, learning_rate: float = 0.01) -> tuple:
    """Per-epoch (wall, CPU) seconds of the DP-SGD loop (σ = 1, C = 1) over Poisson batches
    from disk, the first segment (tracing) left out."""
    import apache_beam as beam
    import tensorflow as tf
    import tensorflow_transform as tft

    from sage_tfx.components.dp_trainer import architecture as arch
    from sage_tfx.components.dp_trainer import batching, loop, objectives
    from sage_tfx.dp import poisson_batching as pb
    examples = examples_dir or info["examples"]
    files = [os.path.join(examples, "Split-train", "*")]
    n = info["rows"]["train"] * (1 if examples_dir is None else
                                 len(os.listdir(os.path.join(examples, "Split-train"))))
    q = batch / n
    steps = int(np.ceil(epochs * n / batch))
    out = tempfile.mkdtemp(dir=work, prefix="batches-")
    with beam.Pipeline() as p:
        batching.write_batches(p, files, out, label_key=LABEL, sampling_probability=q,
                               steps=steps, oversize=pb.SPILL,
                               max_batch_size=pb.choose_max_batch(n, q, steps, epsilon=0.0,
                                                                  delta_budget=1e-6))
    model = build()
    architecture = arch.check_model_json(model.to_json())
    model = architecture.build()
    dp = loop.DPSGDLoop(model, loss=objectives.check_loss("binary_crossentropy"),
                        optimizer=tf.keras.optimizers.Adam(learning_rate), l2_norm_clip=1.0,
                        noise_multiplier=1.0, expected_batch_size=batch,
                        max_batch_size=int(batch * 2))
    spec = dict(tft.TFTransformOutput(info["graph"]).transformed_feature_spec())
    parser = loop.ExampleParser(spec, architecture.inputs, LABEL)
    per_epoch = max(1, steps // epochs)
    marks = []
    dp.train(out, parser, steps,
             progress=lambda done, total, s: marks.append((done, s, time.process_time())))
    shutil.rmtree(out)
    # a progress mark after each of ~20 segments: time per step from the first mark on
    (d0, s0, c0), (d1, s1, c1) = marks[0], marks[-1]
    return (s1 - s0) / (d1 - d0) * per_epoch, (c1 - c0) / (d1 - d0) * per_epoch


# --- memory -------------------------------------------------------------------------------------


def memory(info: dict, work: str, copies: int, batch: int) -> list:
    """[(data, rows, phase, peak MB)] of the Beam batching job and the DP-SGD loop (1 epoch),
    each in a fresh process, on the train split and on ``copies`` copies of it."""
    rows = []
    for k in (1, copies):
        examples = info["examples"] if k == 1 else replicate(info, k, work)
        n = info["rows"]["train"] * k
        q, steps = batch / n, int(np.ceil(n / batch))
        out = os.path.join(work, f"mem_batches_x{k}")
        shutil.rmtree(out, ignore_errors=True)
        beam_code = (
            "import apache_beam as beam\n"
            "from sage_tfx.components.dp_trainer import batching\n"
            "with beam.Pipeline() as p:\n"
            f"    batching.write_batches(p, [{os.path.join(examples, 'Split-train', '*')!r}], "
            f"{out!r}, label_key={LABEL!r}, sampling_probability={q!r}, steps={steps}, "
            f"max_batch_size={2 * batch}, oversize='spill')\n")
        # each measurement in its own child of a fresh measuring process (ru_maxrss of
        # RUSAGE_CHILDREN is the largest child so far): a tiny wrapper per phase
        peak_beam = _fresh_peak(beam_code)
        loop_code = (
            "import json, os, sys\n"
            f"sys.argv = ['x']\nsys.path.insert(0, {HERE!r})\n"
            "import dp_trainer_taxi as b\nb._quiet()\n"
            "import tensorflow as tf, tensorflow_transform as tft\n"
            "from sage_tfx.components.dp_trainer import architecture as arch, loop, objectives\n"
            f"info = json.load(open({os.path.join(work, 'prepared.json')!r}))\n"
            "taxi = b._taxi_module()\n"
            "a = arch.check_model_json(taxi._build_keras_model([100, 70, 49, 34]).to_json())\n"
            "m = a.build()\n"
            "dp = loop.DPSGDLoop(m, loss=objectives.check_loss('binary_crossentropy'), "
            "optimizer=tf.keras.optimizers.Adam(1e-2), l2_norm_clip=1.0, noise_multiplier=1.0,"
            f" expected_batch_size={batch}, max_batch_size={2 * batch})\n"
            "spec = dict(tft.TFTransformOutput(info['graph']).transformed_feature_spec())\n"
            f"dp.train({out!r}, loop.ExampleParser(spec, a.inputs, {LABEL!r}), {steps})\n")
        peak_loop = _fresh_peak(loop_code)
        shutil.rmtree(out, ignore_errors=True)
        rows += [(f"x{k}", n, "beam batching (DirectRunner)", peak_beam),
                 (f"x{k}", n, "DP-SGD loop (1 epoch)", peak_loop)]
        print(f"  memory x{k} ({n} rows): batching {peak_beam:.0f} MB, loop {peak_loop:.0f} MB",
              flush=True)
    return rows


def _fresh_peak(code: str) -> float:
    wrapper = ("import resource, subprocess, sys\n"
               f"subprocess.run([sys.executable, '-c', {code!r}], check=True)\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]),
               TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", wrapper], check=True, env=env, cwd=ROOT,
                         capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


# --- main ---------------------------------------------------------------------------------------


def _halves(text: str, trainer_def: str) -> list[tuple[str, str]]:
    """(function, line) for the training half of a taxi module: the trainer imports, every
    top-level def after ``_fill_in_missing`` except ``preprocessing_fn``."""
    out, where = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith(("import ", "from ")):
            if any(k in line for k in ("fn_args_utils", "tfxio", "dp_trainer")):
                out.append(("imports", line))
            continue
        if line.startswith("def "):
            where = line[4:].split("(")[0]
        elif line.startswith("# TFX"):
            where = trainer_def
        if where and where not in ("_transformed_name", "_transformed_names",
                                   "_fill_in_missing", "preprocessing_fn") and \
                not line.startswith("# TFX Transform"):
            out.append((where, line))
    return out


def conversion_diff() -> dict:
    """Changed non-blank lines of the taxi training half, original vs converted (module doc, 4)."""
    with open(os.path.join(os.path.dirname(_taxi_module().__file__),
                           "taxi_utils_native_keras.py")) as f:
        original = _halves(f.read(), "run_fn")
    with open(MODULE) as f:
        converted = _halves(f.read(), "model_fn")
    removed: collections.Counter = collections.Counter()
    added: collections.Counter = collections.Counter()
    orig_lines = [line for _, line in original]
    conv_lines = [line for _, line in converted]
    where_o = [w for w, _ in original]
    where_c = [w for w, _ in converted]
    matcher = difflib.SequenceMatcher(a=orig_lines, b=conv_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "delete"):
            removed.update(where_o[i1:i2])
        if tag in ("replace", "insert"):
            added.update(where_c[j1:j2])
    result = {"original_lines": len(orig_lines), "converted_lines": len(conv_lines),
              "removed": sum(removed.values()), "added": sum(added.values()),
              "removed_by_function": dict(removed), "added_by_function": dict(added)}
    print(f"taxi training half: {result['original_lines']} non-blank lines -> "
          f"{result['converted_lines']}; {result['removed']} removed {dict(removed)}, "
          f"{result['added']} added {dict(added)}", flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="1,3,8")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--learning-rate", type=float, default=0.01)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scale", type=int, default=10, help="copies of the data for memory")
    ap.add_argument("--quick", action="store_true", help="one ε, one round, 2 epochs, x2 data")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "sage"))
    ap.add_argument("--work", default=None, help="working directory (default: a temp dir)")
    ap.add_argument("--parts", default="utility,speed,memory",
                    help="which measurements to run (the others are read from --out's CSVs)")
    args = ap.parse_args(argv)
    if args.quick:
        args.epsilons, args.epochs, args.rounds, args.scale = "3", 2, 1, 2
    _quiet()
    work = args.work or tempfile.mkdtemp(prefix="dp-trainer-taxi-")
    os.makedirs(work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    diff = conversion_diff()
    parts = set(p for p in args.parts.split(",") if p)
    unknown = parts - {"utility", "speed", "memory"}
    if unknown:
        ap.error(f"unknown --parts {sorted(unknown)}: choose from utility, speed, memory")
    results, speed, mem = _previous(args.out)
    if parts:
        print(f"[{time.time() - t0:6.0f}s] preparing the taxi data (stock transform) in {work}",
              flush=True)
        info = prepare(work)
        print(f"  rows: {info['rows']}", flush=True)
        taxi = _taxi_module()
        labels = _labels(info)
        raw_eval = _raw_eval(info)
    missing = [name for name, rows in (("utility", results), ("speed", speed), ("memory", mem))
               if name not in parts and not rows]
    if missing:
        ap.error(f"no earlier {missing} results in {args.out}: add them to --parts")
    if "utility" in parts:
        results = utility(info, work, taxi, labels, raw_eval, args, t0)
    if "speed" in parts:
        speed = speed_rounds(info, work, taxi, args, t0)
    if "memory" in parts:
        print(f"[{time.time() - t0:6.0f}s] memory (1x and {args.scale}x data)", flush=True)
        mem = memory(info, work, args.scale, args.batch)
    _write(args.out, results, speed, mem, diff, args)
    print(f"[{time.time() - t0:6.0f}s] done; results in {args.out}/dp_trainer_taxi.*",
          flush=True)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _previous(out: str) -> tuple:
    """The results, speed and memory rows of an earlier run in ``out`` (empty if none)."""
    def rows(name):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return list(csv.DictReader(f))
    def num(r: dict) -> dict:
        out = {}
        for k, v in r.items():
            if k in ("model", "training", "isolation", "data", "phase") or v in ("", None):
                out[k] = v
            else:
                out[k] = int(v) if k == "round" else float(v)
        return out
    results = [num(r) for r in rows("dp_trainer_taxi.csv")]
    speed = [num(r) for r in rows("dp_trainer_taxi_speed.csv")]
    mem = [(r["data"], int(float(r["rows"])), r["phase"], float(r["peak_mb"]))
           for r in rows("dp_trainer_taxi_memory.csv")]
    return results, speed, mem


def utility(info, work, taxi, labels, raw_eval, args, t0) -> list:
    """The non-DP baseline and the DPTrainer at each ε (module doc, 1)."""
    results = []
    print(f"[{time.time() - t0:6.0f}s] non-DP baseline (Keras fit, {args.epochs} epochs)",
          flush=True)
    base, _ = non_dp(info, args.epochs, args.batch,
                     lambda: taxi._build_keras_model([100, 70, 49, 34]), args.learning_rate)
    results.append({"model": "wide-and-deep", "training": "non-DP", "epsilon": "",
                    **score(non_dp_probabilities(info, base), labels)})
    print(f"  non-DP: {results[-1]}", flush=True)
    for eps in [float(e) for e in args.epsilons.split(",")]:
        print(f"[{time.time() - t0:6.0f}s] DPTrainer at epsilon={eps:g}", flush=True)
        uri, props, seconds = dp_train(info, work, eps, args.epochs, args.batch,
                                       args.learning_rate)
        results.append({"model": "wide-and-deep", "training": "DP-SGD (DPTrainer)",
                        "epsilon": eps, **score(serve_probabilities(uri, raw_eval), labels),
                        "dp_epsilon": props["dp_epsilon"], "sigma": props["dp_noise_multiplier"],
                        "steps": props["dp_steps"], "max_batch": props["dp_max_batch_size"],
                        "truncation_delta": props["dp_truncation_delta"],
                        "isolation": props.get("dp_model_fn_isolation"),
                        "executor_seconds": round(seconds, 1)})
        print(f"  {results[-1]}", flush=True)
    return results


def speed_rounds(info, work, taxi, args, t0) -> list:
    """Seconds per epoch, DP-SGD loop vs Keras fit, for both models (module doc, 2)."""
    speed = []
    models = {"wide-and-deep": lambda: taxi._build_keras_model([100, 70, 49, 34]),
              "MLP 256-256": lambda: mlp(taxi)}
    for r in range(args.rounds):
        for name, build in models.items():
            print(f"[{time.time() - t0:6.0f}s] speed round {r + 1}: {name}", flush=True)
            _, fit_times = non_dp(info, args.epochs, args.batch, build, args.learning_rate)
            dp_wall, dp_cpu = dp_loop_epochs(info, work, build, args.epochs, args.batch,
                                             learning_rate=args.learning_rate)
            steady = fit_times[1:] or fit_times
            speed.append({"model": name, "round": r + 1,
                          "non_dp_s_per_epoch": statistics.median(t for t, _ in steady),
                          "dp_s_per_epoch": dp_wall,
                          "non_dp_cpu_s_per_epoch": statistics.median(c for _, c in steady),
                          "dp_cpu_s_per_epoch": dp_cpu})
            print(f"  {speed[-1]}", flush=True)
    return speed


def _write(out: str, results: list, speed: list, mem: list, diff: dict, args) -> None:
    with open(os.path.join(out, "dp_trainer_taxi.csv"), "w", newline="") as f:
        keys = sorted({k for r in results for k in r})
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(results)
    with open(os.path.join(out, "dp_trainer_taxi_speed.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(speed[0]))
        w.writeheader()
        w.writerows(speed)
    with open(os.path.join(out, "dp_trainer_taxi_memory.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["data", "rows", "phase", "peak_mb"])
        w.writerows(mem)
    lines = ["# DP Trainer on the Chicago taxi example", "",
             f"`python benchmarks/sage/dp_trainer_taxi.py --epsilons {args.epsilons} --epochs "
             f"{args.epochs} --rounds {args.rounds} --scale {args.scale}`", "",
             "| training | ε | accuracy | AUC | σ | steps | B | truncation δ |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['training']} | {r['epsilon']} | {r['accuracy']:.4f} | "
                     f"{r['auc']:.4f} | {r.get('sigma', '')} | {r.get('steps', '')} | "
                     f"{r.get('max_batch', '')} | {r.get('truncation_delta', '')} |")
    lines += ["", "| model | non-DP s/epoch | DP s/epoch | DP / non-DP (wall) | "
              "non-DP CPU s/epoch | DP CPU s/epoch | DP / non-DP (CPU) |",
              "|---|---|---|---|---|---|---|"]
    by_model: dict = {}
    for s in speed:
        by_model.setdefault(s["model"], []).append(s)
    for name, rows in by_model.items():
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("non_dp_s_per_epoch", "dp_s_per_epoch", "non_dp_cpu_s_per_epoch",
                         "dp_cpu_s_per_epoch")}
        lines.append(f"| {name} | {med['non_dp_s_per_epoch']:.2f} | {med['dp_s_per_epoch']:.2f} "
                     f"| {med['dp_s_per_epoch'] / med['non_dp_s_per_epoch']:.2f}x | "
                     f"{med['non_dp_cpu_s_per_epoch']:.2f} | {med['dp_cpu_s_per_epoch']:.2f} | "
                     f"{med['dp_cpu_s_per_epoch'] / med['non_dp_cpu_s_per_epoch']:.2f}x |")
    lines += ["", "| data | rows | phase | peak MB |", "|---|---|---|---|"]
    lines += [f"| {d} | {n} | {p} | {m:.0f} |" for d, n, p, m in mem]
    lines += ["", f"Training half of the module: {diff['original_lines']} non-blank lines in "
              f"TFX's, {diff['converted_lines']} in ours; {diff['removed']} removed, "
              f"{diff['added']} added.", "", "| function | removed | added |", "|---|---|---|"]
    for name in dict.fromkeys(list(diff["removed_by_function"]) + list(diff["added_by_function"])):
        lines.append(f"| `{name}` | {diff['removed_by_function'].get(name, 0)} | "
                     f"{diff['added_by_function'].get(name, 0)} |")
    with open(os.path.join(out, "dp_trainer_taxi.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    _plot(out, results)


def _plot(out: str, results: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    dp = [r for r in results if r["epsilon"] != ""]
    base = next(r for r in results if r["epsilon"] == "")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, metric in zip(axes, ("accuracy", "auc")):
        ax.plot([r["epsilon"] for r in dp], [r[metric] for r in dp], "o-", label="DPTrainer")
        ax.axhline(base[metric], color="gray", ls="--", label="non-DP")
        ax.set_xscale("log")
        ax.set_xticks([r["epsilon"] for r in dp], [f"{r['epsilon']:g}" for r in dp])
        ax.minorticks_off()
        ax.set_xlabel("ε (train part, δ = 1e-5)")
        ax.set_ylabel(metric)
        ax.set_title(f"taxi big-tipper {metric}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "dp_trainer_taxi.png"), dpi=120)


if __name__ == "__main__":
    sys.exit(main())
