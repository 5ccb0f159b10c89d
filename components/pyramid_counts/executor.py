"""PyramidCountTable executor: verify the grant, read its blocks with Beam, seal the window.

The grant must be the window's Pyramid charge: run id ``pyramid_run_id(stream, spec, window)``,
cost (spec.epsilon, 0) on a basic stream or ``window_event(spec)`` on an rdp stream, the
window's blocks; :meth:`sage_tfx.pyramid.PyramidStore.seal` checks it
against the ledger and makes no second charge, and records the window's tables against the
grant before publishing them. A replay — a retried node, a re-run with the same grant, any
``store_dir`` — finds the recorded release and re-materializes it byte for byte
(:meth:`~sage_tfx.pyramid.PyramidStore.restore`): no block is read, no noise drawn, nothing
charged. The output artifact holds a copy of the released tables (``tables.npz``).

A spec with ``aggregation="tree"`` passes through unchanged (same grant: the spec's cost pays
for the window's ``levels + 1`` nodes): the store seals the window into its dyadic nodes, the
artifact holds the window's leaf node, and a replay in a store directory that does not hold the
window seals it again, which replays every recorded node (:mod:`sage_tfx.pyramid.treestore`).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List

import apache_beam as beam
import pandas as pd
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils

from sage_tfx.components import artifacts, pyramid_artifacts as pa
from sage_tfx.components.block_example_gen.executor import (granted_files, read_granted_file,
                                                            verify_grant)
from sage_tfx.components.pyramid_counts import spec as s
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore
from sage_tfx.pyramid.sealing import check_grant


def example_values(record: bytes, columns: List[str]) -> Dict[str, Any]:
    """The first value of each column of a serialized tf.Example (bytes decoded as UTF-8)."""
    import tensorflow as tf
    ex = tf.train.Example.FromString(record)
    out = {}
    for c in columns:
        f = ex.features.feature.get(c)
        kind = f.WhichOneof("kind") if f is not None else None
        values = getattr(f, kind).value if kind else []
        v = values[0] if len(values) else None
        out[c] = v.decode("utf-8") if isinstance(v, bytes) else v
    return out


def read_frame(pipeline: beam.Pipeline, files: List[Any], columns: List[str], tmp: str
               ) -> pd.DataFrame:
    """Beam: all records of ``files`` (granted, decrypted on the workers) -> rows of ``columns``
    (JSON lines), read back as a frame."""
    prefix = os.path.join(tmp, "rows")
    with pipeline as p:
        _ = (p | "Files" >> beam.Create(files) | "Spread" >> beam.Reshuffle()
             | "Read" >> beam.FlatMap(read_granted_file)
             | "Parse" >> beam.Map(lambda r: json.dumps(example_values(r, columns)))
             | "Write" >> beam.io.WriteToText(prefix, file_name_suffix=".jsonl"))
    rows = [json.loads(line) for path in sorted(fileio.glob(prefix + "*.jsonl"))
            for line in open(path)]
    return pd.DataFrame(rows, columns=columns)


def write_window(artifact, result, spec: CountSpec) -> None:
    with fileio.open(os.path.join(artifact.uri, pa.WINDOW_FILE), "w") as f:
        f.write(json.dumps(result, sort_keys=True))
    artifact.window = int(result["window"])
    artifact.run_id = result["run_id"]
    artifact.grant_id = result.get("grant_id") or ""
    artifact.epsilon = float(result["epsilon"])
    artifact.spec_digest = spec.digest()


class Executor(base_beam_executor.BaseBeamExecutor):

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        grant_artifact = artifact_utils.get_single_instance(input_dict[s.GRANT_INPUT_KEY])
        grant = artifacts.read_grant(grant_artifact)  # a denial raises with the ledger's reason
        spec = CountSpec.from_json(json.loads(exec_properties[s.SPEC_JSON_KEY]))
        window = int(exec_properties[s.WINDOW_KEY])
        url = exec_properties[s.LEDGER_URL_KEY]
        out = artifact_utils.get_single_instance(output_dict[s.WINDOW_TABLE_KEY])
        with open_ledger(url) as ledger:
            recorded = verify_grant(grant, ledger, url)
            store = PyramidStore(spec, exec_properties[s.STORE_DIR_KEY],
                                 retention=int(exec_properties[s.RETENTION_KEY]), ledger=ledger,
                                 stream=recorded.stream)
            # A grant for another run pays for something else: refused before any block is read.
            check_grant(ledger, recorded, run_id=store.run_id(window), stream=recorded.stream,
                        blocks=None, epsilon=None)
            released = ledger.recorded_release(recorded.grant_id, store.release_name(window))
            # A tree store re-seals a window it does not hold: its recorded nodes replay.
            if window in store.live_windows or (released is not None and not store.tree):
                result = store.restore(window, grant=recorded)     # no read, no noise
            else:
                files = granted_files(recorded, ledger)
                columns = list(spec.features) + [spec.label]
                with tempfile.TemporaryDirectory() as tmp:
                    frame = read_frame(self._make_beam_pipeline(), files, columns, tmp)
                if store.hot_window == window:    # a failed attempt's rows: read them afresh
                    store.discard_window()
                store.open_window(window, recorded.block_ids)
                store.observe(frame)
                result = store.seal(grant=recorded)
            fileio.makedirs(out.uri)
            fileio.copy(store.sealed_path(window), os.path.join(out.uri, pa.TABLES_FILE),
                        overwrite=True)
        write_window(out, {"window": result.window, "run_id": result.run_id,
                           "grant_id": result.grant_id, "epsilon": result.epsilon_charged,
                           "table_epsilons": list(result.table_epsilons),
                           "noise_scales": list(result.noise_scales),
                           "release": store.release_name(window), "replayed": result.replayed,
                           "dropped": list(result.dropped), "retrain": result.retrain}, spec)
