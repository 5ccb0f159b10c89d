"""PyramidCountTable -> PyramidSnapshot -> PyramidTransform executors on real block storage."""
import json
import os

import numpy as np
import pandas as pd
import pytest

from blockdata import make_example, read_examples, write_block_file
from sage_tfx.streams.blocks import block_location

pytestmark = pytest.mark.slow

STREAM = "obs"
BLOCKS = ("d0", "d1", "d2")


def rows(block, n=60):
    rng = np.random.default_rng(BLOCKS.index(block))
    u = rng.integers(0, 8, n)
    return [{"user": f"u{a}", "item": int(b), "y": int(a % 3 == 0)}
            for a, b in zip(u, rng.integers(0, 4, n))]


@pytest.fixture
def setup(tmp_path):
    from sage_tfx.ledger import open_ledger
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as led:
        led.create_stream(STREAM, epsilon_g=3.0, delta_g=0.0)
        for b in BLOCKS:
            loc = block_location(str(tmp_path / "blocks"), STREAM, b)
            write_block_file(loc, [make_example(r) for r in rows(b)])
            led.add_block(STREAM, b, location=loc, records=60)
    return url


def grant_artifact(tmp_path, url, run_id, blocks, epsilon, name="grant"):
    from sage_tfx.components import artifacts
    from sage_tfx.ledger import open_ledger
    art = artifacts.SageGrant()
    art.uri = str(tmp_path / name)
    with open_ledger(url) as led:
        d = led.request(STREAM, run_id=run_id, blocks=list(blocks), epsilon=epsilon)
    artifacts.write_grant(art, d.grant, stream=STREAM, run_id=run_id, context="default",
                          ledger_url=url, reason=d.reason)
    return art


def test_count_snapshot_transform(tmp_path, setup):
    from tfx.types import standard_artifacts
    from sage_tfx.components.pyramid_artifacts import PyramidFeaturization, PyramidWindowTable
    from sage_tfx.components.pyramid_counts import executor as counts, spec as cs
    from sage_tfx.components.pyramid_snapshot import executor as snap, spec as ss
    from sage_tfx.components.pyramid_transform import executor as tr, spec as ts
    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pyramid import CountSpec, Featurization, pyramid_run_id

    url = setup
    spec = CountSpec(groups=("user", "item"), label="y", width=64, epsilon=1.0,
                     hash_family="tf_siphash")
    store = str(tmp_path / "store")
    props = {cs.LEDGER_URL_KEY: url, cs.STORE_DIR_KEY: store, cs.WINDOW_KEY: 0,
             cs.RETENTION_KEY: 2, cs.SPEC_JSON_KEY: json.dumps(spec.to_json())}

    # A grant of the wrong run id pays for something else: refused, nothing sealed.
    bad = grant_artifact(tmp_path, url, "not-pyramid", BLOCKS[:2], 1.0, name="bad")
    out = PyramidWindowTable()
    out.uri = str(tmp_path / "wt_bad")
    with pytest.raises(InvalidRequestError, match="does not pay"):
        counts.Executor().Do({cs.GRANT_INPUT_KEY: [bad]}, {cs.WINDOW_TABLE_KEY: [out]}, props)
    assert not os.listdir(os.path.join(store, "sealed"))

    run_id = pyramid_run_id(STREAM, spec, 0)
    good = grant_artifact(tmp_path, url, run_id, BLOCKS[:2], 1.0)
    out = PyramidWindowTable()
    out.uri = str(tmp_path / "wt")
    os.makedirs(out.uri)
    counts.Executor().Do({cs.GRANT_INPUT_KEY: [good]}, {cs.WINDOW_TABLE_KEY: [out]}, props)
    meta = json.load(open(os.path.join(out.uri, "window.json")))
    assert meta["run_id"] == run_id and meta["epsilon"] == 1.0
    assert meta["noise_scales"][0] == pytest.approx(3 * 5 / 1.0)   # (2 groups + prior) h / eps
    with open_ledger(url) as led:
        spent = {b.block_id: b.epsilon_spent for b in led.blocks(STREAM)}
        assert spent == {"d0": 2.0, "d1": 2.0, "d2": 0.0}         # the bad grant + this one
    # A retried node re-emits the sealed window: no new noise, no new charge.
    out2 = PyramidWindowTable()
    out2.uri = str(tmp_path / "wt2")
    os.makedirs(out2.uri)
    counts.Executor().Do({cs.GRANT_INPUT_KEY: [good]}, {cs.WINDOW_TABLE_KEY: [out2]}, props)
    assert json.load(open(os.path.join(out2.uri, "window.json")))["replayed"]
    # Re-executed with another store_dir (the gate replays the grant): the recorded tables,
    # byte for byte, from the ledger; no block read, no new noise, no new charge.
    out3 = PyramidWindowTable()
    out3.uri = str(tmp_path / "wt3")
    os.makedirs(out3.uri)
    counts.Executor().Do({cs.GRANT_INPUT_KEY: [good]}, {cs.WINDOW_TABLE_KEY: [out3]},
                         dict(props, **{cs.STORE_DIR_KEY: str(tmp_path / "store3")}))
    tables = {open(os.path.join(o.uri, "tables.npz"), "rb").read() for o in (out, out2, out3)}
    tables.add(open(tmp_path / "store3" / "sealed" / "w0.npz", "rb").read())
    assert len(tables) == 1
    with open_ledger(url) as led:
        assert {b.block_id: b.epsilon_spent for b in led.blocks(STREAM)} == spent
        released = led.releases(meta["grant_id"])
        assert len(released) == 1 and released[0].value == tables.pop()
        assert led.check_consistency(STREAM) == []

    feat_art = PyramidFeaturization()
    feat_art.uri = str(tmp_path / "feat")
    os.makedirs(feat_art.uri)
    snap.Executor().Do({ss.WINDOW_TABLE_KEY: [out]}, {ss.FEATURIZATION_KEY: [feat_art]},
                       {ss.STORE_DIR_KEY: store, ss.SPEC_JSON_KEY: json.dumps(spec.to_json()),
                        ss.RETENTION_KEY: 2, ss.MAX_VARIANCE_KEY: 0.05})
    feat = Featurization.load(os.path.join(feat_art.uri, "featurization.npz"))
    assert feat.windows == (0,)

    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "ex")
    write_block_file(os.path.join(examples.uri, "Split-train"),
                     [make_example(r) for r in rows("d2")], "data_tfrecord-0.gz")
    examples.split_names = '["train"]'
    outex = standard_artifacts.Examples()
    outex.uri = str(tmp_path / "tex")
    graph = standard_artifacts.TransformGraph()
    graph.uri = str(tmp_path / "graph")
    tr.Executor().Do({ts.EXAMPLES_KEY: [examples], ts.FEATURIZATION_KEY: [feat_art]},
                     {ts.TRANSFORMED_EXAMPLES_KEY: [outex], ts.TRANSFORM_GRAPH_KEY: [graph]},
                     {ts.BATCH_SIZE_KEY: 16})
    assert os.path.exists(os.path.join(graph.uri, "pyramid_featurizer", "saved_model.pb"))
    got = read_examples(os.path.join(outex.uri, "Split-train", "*.gz"))
    assert len(got) == 60
    names = feat.feature_names()
    x = np.array([[e.features.feature[n].float_list.value[0] for n in names] for e in got])
    expected = feat.featurize(pd.DataFrame(rows("d2")))
    # Beam may reorder records: compare as multisets of rows.
    assert np.allclose(np.sort(x, axis=0), np.sort(expected, axis=0), atol=1e-6)
    assert sorted(e.features.feature["y"].int64_list.value[0] for e in got) == \
        sorted(r["y"] for r in rows("d2"))

    # A BLAKE2b-hashed snapshot cannot be read by a TF graph: refused, nothing written.
    blake = CountSpec(groups=("user", "item"), label="y", width=64, epsilon=1.0)
    feat_b = PyramidFeaturization()
    feat_b.uri = str(tmp_path / "feat_b")
    os.makedirs(feat_b.uri)
    Featurization(blake, {n: c for n, c in feat.cells.items()}, feat.prior_counts,
                  feat.noise_var, (0,)).save(os.path.join(feat_b.uri, "featurization.npz"))
    graph_b = standard_artifacts.TransformGraph()
    graph_b.uri = str(tmp_path / "graph_b")
    with pytest.raises(InvalidRequestError, match="tf_siphash"):
        tr.Executor().Do({ts.EXAMPLES_KEY: [examples], ts.FEATURIZATION_KEY: [feat_b]},
                         {ts.TRANSFORMED_EXAMPLES_KEY: [outex], ts.TRANSFORM_GRAPH_KEY: [graph_b]},
                         {ts.BATCH_SIZE_KEY: 16})
    assert not os.path.exists(graph_b.uri)


def test_count_table_on_an_rdp_stream(tmp_path):
    """The gate's event pays for the window; sealing adds no charge; a retry re-emits."""
    from sage_tfx.components import artifacts
    from sage_tfx.components.pyramid_artifacts import PyramidWindowTable
    from sage_tfx.components.pyramid_counts import executor as counts, spec as cs
    from sage_tfx.ledger import accounting, open_ledger
    from sage_tfx.pyramid import CountSpec, pyramid_run_id, window_event
    url = f"sqlite:///{tmp_path}/ledger.db"
    spec = CountSpec(groups=("user",), label="y", width=64, epsilon=1.0)
    run_id = pyramid_run_id(STREAM, spec, 0)
    with open_ledger(url) as led:
        led.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-5, mode=accounting.RDP)
        loc = block_location(str(tmp_path / "blocks"), STREAM, "d0")
        write_block_file(loc, [make_example(r) for r in rows("d0")])
        led.add_block(STREAM, "d0", location=loc, records=60)
        d = led.request(STREAM, run_id=run_id, blocks=["d0"], event=window_event(spec))
        spent = led.block(STREAM, "d0").epsilon_spent
    grant = artifacts.SageGrant()
    grant.uri = str(tmp_path / "grant")
    artifacts.write_grant(grant, d.grant, stream=STREAM, run_id=run_id, context="default",
                          ledger_url=url, reason=d.reason)
    props = {cs.LEDGER_URL_KEY: url, cs.STORE_DIR_KEY: str(tmp_path / "store"), cs.WINDOW_KEY: 0,
             cs.RETENTION_KEY: 2, cs.SPEC_JSON_KEY: json.dumps(spec.to_json())}
    for name in ("wt", "wt2"):
        out = PyramidWindowTable()
        out.uri = str(tmp_path / name)
        os.makedirs(out.uri)
        counts.Executor().Do({cs.GRANT_INPUT_KEY: [grant]}, {cs.WINDOW_TABLE_KEY: [out]}, props)
        meta = json.load(open(os.path.join(out.uri, "window.json")))
        assert meta["epsilon"] == 1.0 and meta.get("replayed", False) == (name == "wt2")
    with open_ledger(url) as led:
        assert led.block(STREAM, "d0").epsilon_spent == spent > 0
        assert len(led.grants(STREAM)) == 1


def test_components_validate_arguments():
    from tfx import types
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.pyramid_counts.component import PyramidCountTable
    from sage_tfx.pyramid import CountSpec
    spec = CountSpec(groups=("user",), label="y", width=64)
    grant = types.Channel(type=SageGrant)
    for bad in (dict(window=-1), dict(retention=0), dict(spec="nope")):
        kw = dict(grant=grant, ledger_url="sqlite:///x.db", store_dir="/tmp/x", spec=spec,
                  window=0, retention=2)
        kw.update(bad)
        with pytest.raises(ValueError):
            PyramidCountTable(**kw)
    c = PyramidCountTable(grant=grant, ledger_url="sqlite:///x.db", store_dir="/tmp/x",
                          spec=spec, window=0, retention=2)
    assert set(c.outputs) == {"window_table"}


def test_tree_spec_passes_through_count_table_and_snapshot(tmp_path, setup):
    """A tree spec: windows 0 and 1 sealed by the executor from their gate grants; the snapshot
    reads node (1, 0) alone; window 1 re-run in another store directory replays its nodes."""
    from sage_tfx.components.pyramid_artifacts import PyramidFeaturization, PyramidWindowTable
    from sage_tfx.components.pyramid_counts import executor as counts, spec as cs
    from sage_tfx.components.pyramid_snapshot import executor as snap, spec as ss
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pyramid import CountSpec, Featurization, pyramid_run_id
    from sage_tfx.pyramid.treestore import node_path, node_release_name

    url = setup
    spec = CountSpec(groups=("user",), label="y", width=64, epsilon=1.0, aggregation="tree",
                     levels=1)
    grants = [grant_artifact(tmp_path, url, pyramid_run_id(STREAM, spec, w), [BLOCKS[w]], 1.0,
                             name=f"g{w}") for w in (0, 1)]
    for store, windows in (("store", (0, 1)), ("store2", (1,))):
        for w in windows:
            out = PyramidWindowTable()
            out.uri = str(tmp_path / f"{store}-wt{w}")
            os.makedirs(out.uri)
            counts.Executor().Do({cs.GRANT_INPUT_KEY: [grants[w]]}, {cs.WINDOW_TABLE_KEY: [out]},
                                 {cs.LEDGER_URL_KEY: url, cs.STORE_DIR_KEY: str(tmp_path / store),
                                  cs.WINDOW_KEY: w, cs.RETENTION_KEY: 2,
                                  cs.SPEC_JSON_KEY: json.dumps(spec.to_json())})
            meta = json.load(open(os.path.join(out.uri, "window.json")))
            assert meta["replayed"] == (store == "store2")
            assert meta["release"] == node_release_name(spec, 0, w)
    assert open(node_path(str(tmp_path / "store"), 0, 1), "rb").read() == \
        open(node_path(str(tmp_path / "store2"), 0, 1), "rb").read()
    # store2's live range is window 1 alone: node (1, 0) holds window 0, so it is never read
    assert not os.path.exists(node_path(str(tmp_path / "store2"), 1, 0))
    with open_ledger(url) as led:
        assert {b.block_id: b.epsilon_spent for b in led.blocks(STREAM)} == \
            {"d0": 1.0, "d1": 1.0, "d2": 0.0}
        assert led.check_consistency(STREAM) == []
    feat_art = PyramidFeaturization()
    feat_art.uri = str(tmp_path / "feat")
    os.makedirs(feat_art.uri)
    snap.Executor().Do({ss.WINDOW_TABLE_KEY: [out]}, {ss.FEATURIZATION_KEY: [feat_art]},
                       {ss.STORE_DIR_KEY: str(tmp_path / "store"),
                        ss.SPEC_JSON_KEY: json.dumps(spec.to_json()), ss.RETENTION_KEY: 2,
                        ss.MAX_VARIANCE_KEY: 0.05})
    feat = Featurization.load(os.path.join(feat_art.uri, "featurization.npz"))
    assert feat.windows == (0, 1)
    with np.load(node_path(str(tmp_path / "store"), 1, 0)) as z:
        assert np.array_equal(feat.cells["user"], z["cells__user"])
        assert feat.noise_var["user"] == json.loads(str(z["meta"]))["noise_var"]["user"]
