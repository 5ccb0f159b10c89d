"""Beam beyond DirectRunner: the block splitter and a DP Transform on ``PortableRunner``.

The runner submits to Beam's own Python job service, and an external SDK worker pool runs the
work (``--environment_type=EXTERNAL``), each in its own process (``beam_services.py``): the Job
and Fn API protocol the Flink, Spark and Dataflow runners speak. Blocks, ledger state and the
DP Transform's output (seeded noise) must equal a DirectRunner run's.
"""
import glob
import os
import subprocess
import sys
import time

import pytest

from flightsdata import STREAM, WINDOW, split_flights, spent

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
TRANSFORM_EPSILON = 0.5


@pytest.fixture(scope="module")
def portable_flags(tmp_path_factory):
    """Beam flags of PortableRunner on a job service and an SDK worker pool started here."""
    root = tmp_path_factory.mktemp("beam_services")
    env = dict(os.environ,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs, ports = {}, {}
    for kind in ("job-service", "worker-pool"):
        port_file = str(root / f"{kind}.port")
        procs[kind] = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "beam_services.py"), kind, port_file], env=env,
            stdout=open(root / f"{kind}.log", "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not os.path.exists(port_file):
            assert procs[kind].poll() is None, (root / f"{kind}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{kind} did not start"
            time.sleep(0.5)
        with open(port_file) as f:
            ports[kind] = int(f.read())
    yield ["--runner=PortableRunner", f"--job_endpoint=127.0.0.1:{ports['job-service']}",
           "--environment_type=EXTERNAL",
           f"--environment_config=127.0.0.1:{ports['worker-pool']}",
           "--job_server_timeout=900"]  # the job's state stream is a single RPC this long
    for proc in procs.values():
        proc.terminate()
        proc.wait(timeout=30)


def _block_records(ledger_url, block):
    """The serialized tf.Examples of a block, decrypted with its registered key, sorted."""
    from sage_tfx.ledger import keys, open_ledger
    from sage_tfx.streams import blockfiles
    with open_ledger(ledger_url) as ledger:
        [key] = [k for k in ledger.block_keys(STREAM) if k.block_id == block.block_id]
    files = sorted(glob.glob(os.path.join(block.location, "part-*.tfrecord.gz.tink")))
    assert files
    return sorted(r for f in files for r in blockfiles.read_block_file(
        f, key.unwrap(keys.provider()), blockfiles.file_aad(STREAM, block.block_id, f)))


def _ledger_blocks(ledger_url):
    from sage_tfx.ledger import open_ledger
    with open_ledger(ledger_url) as ledger:
        return ledger.blocks(STREAM)


def _run_transform(root, ledger_url, beam_args):
    """Gate -> BlockExampleGen -> ImportSchemaGen -> DPTransform (seeded analyzers, the given
    Beam flags) under LocalDagRunner; returns the transformed records, sorted."""
    import tensorflow as tf
    from ml_metadata.metadata_store import metadata_store
    from tfx import v1 as tfx

    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components import BlockExampleGen, DPTransform, SageGate
    from sage_tfx.pipelines.flights_plan import SCHEMA_PATH

    metadata_path = str(root / "mlmd.db")
    gate = SageGate(ledger_url=ledger_url, stream=STREAM, window_last=WINDOW,
                    plan=PrivacyPlan.of(PlanPart("transform", TRANSFORM_EPSILON)))
    example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
    schema_gen = tfx.components.ImportSchemaGen(schema_file=SCHEMA_PATH)
    transform = DPTransform(
        examples=example_gen.outputs["examples"], schema=schema_gen.outputs["schema"],
        grant=gate.outputs["grant"], preprocessing_fn="seeded_preprocessing.preprocessing_fn",
        ledger_url=ledger_url, force_tf_compat_v1=True).with_beam_pipeline_args(beam_args)
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="portable-transform", pipeline_root=str(root / "tfx"),
        components=[gate, example_gen, schema_gen, transform], enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path)))
    store = metadata_store.MetadataStore(
        tfx.orchestration.metadata.sqlite_metadata_connection_config(metadata_path))
    [examples] = [a for a in store.get_artifacts_by_type("Examples")
                  if "transformed_examples" in a.uri]
    rows = []
    for path in sorted(glob.glob(os.path.join(examples.uri, "Split-*", "*.gz"))):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            ex = tf.train.Example.FromString(record.numpy())
            rows.append(tuple(sorted((k, tuple(v.float_list.value))
                                     for k, v in ex.features.feature.items())))
    return sorted(rows)


def test_portable_runner_splits_and_transforms_like_direct_runner(flights_blocks, portable_flags,
                                                                  tmp_path):
    direct_root, direct_url, block_ids = flights_blocks
    portable_root = tmp_path / "portable"
    portable_url = f"sqlite:///{tmp_path}/portable-ledger.db"

    # 1. The splitter: the same blocks, the same records, the same ledger state.
    start = time.monotonic()
    split = split_flights(portable_root, portable_url, pipeline_options=portable_flags)
    print(f"portable split: {time.monotonic() - start:.1f}s")
    assert [b.block_id for b in split.blocks] == block_ids
    direct, portable = _ledger_blocks(direct_url), _ledger_blocks(portable_url)
    strip = lambda b: {k: v for k, v in vars(b).items() if k != "location"}  # noqa: E731
    assert [strip(b) for b in portable] == [strip(b) for b in direct]
    for d, p in zip(direct, portable):
        assert d.location.startswith(str(direct_root)) and p.location.startswith(
            str(portable_root))
        assert _block_records(portable_url, p) == _block_records(direct_url, d), d.block_id

    # 2. DP Transform (its analyzers draw the noise inside Beam) on each runner.
    direct_rows = _run_transform(tmp_path / "t-direct", direct_url, [])
    start = time.monotonic()
    portable_rows = _run_transform(tmp_path / "t-portable", portable_url, portable_flags)
    print(f"portable DP Transform pipeline: {time.monotonic() - start:.1f}s")
    assert len(portable_rows) == sum(b.records for b in direct[-WINDOW:])
    assert portable_rows == direct_rows
    means = {dict(r)["dep_delay_mean"] for r in portable_rows}
    assert len(means) == 1  # one DP release, broadcast

    # The ledger: each run charged the plan once to the same blocks.
    d_spent, d_grants, d_bad, _ = spent(direct_url)
    p_spent, p_grants, p_bad, _ = spent(portable_url)
    assert d_spent == p_spent and d_bad == p_bad == []
    assert [(g.block_ids, g.epsilon, g.delta) for g in p_grants] == [
        (g.block_ids, g.epsilon, g.delta) for g in d_grants] == [
        (tuple(block_ids[-WINDOW:]), TRANSFORM_EPSILON, 0.0)]
