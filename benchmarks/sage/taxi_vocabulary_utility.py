"""Benchmark: the DP taxi pipeline's model with DP vocabularies vs hashing vs a public domain.

Runs ``pipelines/taxi_pipeline.py`` end to end (LocalDagRunner: gate → BlockExampleGen →
DPStatisticsGen → SchemaGen → ExampleValidator → DPTransform → DPTrainer → DPModelValidator →
Pusher) on the trips TFX ships, imported into monthly blocks with the ``sage-tfx`` CLI, once per
vocabulary mode (``taxi_vocabulary_modules.py``: ``dp`` partition selection, ``hash``,
``public``) and per train ε ∈ {1, 3, 8} (δ = 1e-6; transform part ε = 1, plus δ = 1e-6 for the
DP vocabularies only). Each run's model is scored (accuracy and AUC of "big tipper", not DP: a
benchmark measurement) on the eval split BlockExampleGen held out, through its serving
signature. Prints a table and writes ``benchmarks/results/sage/taxi_vocabulary_utility.{csv,md}``.

Usage: python benchmarks/sage/taxi_vocabulary_utility.py [--epsilons 1,3,8]
           [--modes dp,hash,public] [--window 24] [--epochs 10] [--out DIR]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODULE = os.path.join(HERE, "taxi_vocabulary_modules.py")
STREAM = "taxi"


def _newest(store, type_name: str):
    return max(store.get_artifacts_by_type(type_name), key=lambda a: a.id)


def score(metadata_path: str) -> dict:
    """Accuracy and AUC of the run's Model on its BlockExampleGen eval split (raw examples)."""
    import tensorflow as tf
    from ml_metadata.metadata_store import metadata_store
    from sklearn.metrics import roc_auc_score
    from tfx.orchestration import metadata
    store = metadata_store.MetadataStore(metadata.sqlite_metadata_connection_config(
        metadata_path))
    model = _newest(store, "Model")
    examples = [a for a in store.get_artifacts_by_type("Examples")
                if os.path.isdir(os.path.join(a.uri, "Split-eval"))
                and "BlockExampleGen" in a.uri]
    eval_dir = os.path.join(max(examples, key=lambda a: a.id).uri, "Split-eval")
    files = tf.io.gfile.glob(os.path.join(eval_dir, "*"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    labels = np.array([tf.train.Example.FromString(r).features.feature["big_tipper"]
                       .int64_list.value[0] for r in raw])
    serve = tf.saved_model.load(os.path.join(model.uri, "Format-Serving")).signatures[
        "serving_default"]
    p = np.concatenate([serve(examples=tf.constant(raw[i:i + 1024]))["predictions"].numpy()[:, 0]
                        for i in range(0, len(raw), 1024)])
    return {"accuracy": float(np.mean((p > 0.5) == (labels == 1))),
            "auc": float(roc_auc_score(labels, p)), "eval_examples": len(raw)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="1,3,8")
    ap.add_argument("--modes", default="dp,hash,public")
    ap.add_argument("--window", type=int, default=24)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "sage"))
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components.dp_statistics_gen.privacy import statistics_part
    from sage_tfx.pipelines import taxi_pipeline as tp
    work = tempfile.mkdtemp(prefix="taxi-vocab-")
    os.environ.setdefault("SAGE_KEY_PROVIDER", f"file:{work}/kek.json")
    t0 = time.time()
    print(f"[{time.time() - t0:5.0f}s] importing the trips into monthly blocks", flush=True)
    url = tp.import_taxi_blocks(work, STREAM, epsilon_g=1000.0, delta_g=1e-3)  # the CLI
    rows = []
    for mode in args.modes.split(","):
        for eps in [float(e) for e in args.epsilons.split(",")]:
            name = f"{mode}-eps{eps:g}"
            plan = PrivacyPlan.of(
                statistics_part(list(tp.STATISTICS_FEATURES), 0.5, 1e-6),
                PlanPart("transform", 1.0, 1e-6 if mode == "dp" else 0.0),
                PlanPart("train", eps, 1e-6), PlanPart("validate", 0.5),
                PlanPart("baseline", 0.5))
            print(f"[{time.time() - t0:5.0f}s] {name}", flush=True)
            metadata_path = os.path.join(work, f"{name}.db")
            start = time.monotonic()
            result = tp.run_iteration(
                pipeline_name=f"taxi-{mode}", pipeline_root=os.path.join(work, name),
                metadata_path=metadata_path, ledger_url=url, stream=STREAM,
                window_last=args.window, serving_model_dir=os.path.join(work, name, "serving"),
                plan=plan, module_file=MODULE,
                trainer_config={"epochs": args.epochs}, transform_config={"vocabulary": mode})
            row = {"vocabulary": mode, "train_epsilon": eps, **score(metadata_path),
                   "outcome": result.outcome,
                   "dp_epsilon": result.model_guarantee.get("dp_epsilon"),
                   "seconds": round(time.monotonic() - start, 1)}
            rows.append(row)
            print(f"  {row}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "taxi_vocabulary_utility.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["# Taxi pipeline: DP vocabularies vs hashing vs a public domain", "",
             f"`python benchmarks/sage/taxi_vocabulary_utility.py --epsilons {args.epsilons} "
             f"--modes {args.modes} --window {args.window} --epochs {args.epochs}`", "",
             "| vocabulary | train ε | accuracy | AUC | validator | eval examples |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['vocabulary']} | {r['train_epsilon']:g} | {r['accuracy']:.4f} | "
              f"{r['auc']:.4f} | {r['outcome']} | {r['eval_examples']} |" for r in rows]
    with open(os.path.join(args.out, "taxi_vocabulary_utility.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
