"""In-graph count featurization (``pyramid.graph``) against the Python featurizer, and the
``tf_siphash`` hash family: same buckets in TF and Python, in every process."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from sage_tfx.dp import counts as C
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid import CountSpec, NonCategoricalError, PyramidStore, UnknownFeatureError

KINDS = {"user": "bytes", "item": "int64"}


def frame(n=500, seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 60, n)
    return pd.DataFrame({"user": [f"u{u}" for u in user], "item": rng.integers(0, 6, n),
                         "y": (rng.random(n) < 0.1 + 0.08 * (user % 10)).astype(int)})


def snapshot(tmp_path, **kw):
    spec = CountSpec(groups=("user", "item", ("user", "item")), label="y", width=128,
                     epsilon=kw.pop("epsilon", 40.0), hash_family="tf_siphash", **kw)
    s = PyramidStore(spec, str(tmp_path / f"pyr-{spec.digest()}"), retention=3,
                     noise=SeededNoise(3), max_variance=0.02)
    for w in range(2):
        s.open_window(w)
        s.observe(frame(seed=w))
        s.seal()
    return s.featurization()


def examples(df, drop=()):
    import tensorflow as tf
    out = []
    for i, r in enumerate(df.itertuples()):
        ex = tf.train.Example()
        if not (i % 7 == 0 and "user" in drop):
            ex.features.feature["user"].bytes_list.value.append(r.user.encode())
        ex.features.feature["item"].int64_list.value.append(int(r.item))
        ex.features.feature["y"].int64_list.value.append(int(r.y))
        out.append(ex.SerializeToString())
    return out


def test_text_encoding_is_unambiguous_and_tf_expressible():
    E = C.encode_key_text
    assert E(1) == E(1.0) == E(np.int64(1)) == E(True) == b"I1" != E("1") == b"S1"
    assert E(b"ab") == E("ab") and E(None) == E(float("nan")) == b"N"
    assert E(("a:b", "c")) != E(("a", "b:c")) and E(("ab", "")) != E(("a", "b"))
    with pytest.raises(InvalidRequestError, match="bin it"):
        E(2.5)
    with pytest.raises(InvalidRequestError):
        CountSpec(groups=("a",), label="y", hash_family="md5")
    spec = CountSpec(groups=("a",), label="y")
    assert "hash_family" not in spec.to_json()          # digests of existing specs unchanged
    sip = CountSpec(groups=("a",), label="y", hash_family="tf_siphash")
    assert CountSpec.from_json(sip.to_json()) == sip and sip.digest() != spec.digest()


@pytest.mark.slow
@pytest.mark.parametrize("kind,depth,continuous", [
    ("count_median", 5, False), ("count_median", 4, False), ("count_min", 5, False),
    ("count_median", 5, True)])
def test_in_graph_features_equal_the_python_featurizer(tmp_path, kind, depth, continuous):
    import tensorflow as tf
    from sage_tfx.pyramid.graph import featurizer_module
    feat = snapshot(tmp_path, kind=kind, depth=depth)
    if continuous:                  # float cells, as sealed on an rdp stream (Laplace noise)
        rng = np.random.default_rng(5)
        feat.cells = {k: v + rng.laplace(0, 0.5, v.shape) for k, v in feat.cells.items()}
    df = frame(n=300, seed=9)
    df.loc[::7, "user"] = None                  # missing values hash as the "N" key
    expected = feat.featurize(df)
    module = featurizer_module(feat, KINDS)
    got = module.featurize_serialized(tf.constant(examples(df, drop=("user",)))).numpy()
    np.testing.assert_array_equal(got, expected)
    # Both back-off and real rates occur, so the comparison covers both branches.
    p_user = expected[:, 0]
    assert np.sum(p_user == np.float32(feat.prior[1])) > 5
    assert np.sum(p_user != np.float32(feat.prior[1])) > 50
    ok = df["user"].notna().to_numpy()
    raw = module.featurize({"user": tf.constant(df["user"][ok].astype(str).tolist()),
                            "item": tf.constant(df["item"][ok].to_numpy(), tf.int64)}).numpy()
    np.testing.assert_array_equal(raw, expected[ok])


@pytest.mark.slow
def test_tf_siphash_sketch_sensitivity_and_uniformity():
    sk = C.CountSketch("count_median", 5, 64, 3, b"salt", hash_family="tf_siphash")
    sk.add(["a", ("x", 1), 3], np.array([0, 1, 2]))
    before = sk.cells.copy()
    sk.add(["zz"], np.array([1]))
    diff = sk.cells - before
    assert np.abs(diff).sum() == 5 and np.all(np.abs(diff[:, :, [0, 2]]) == 0)
    b, s = C.key_hashes(list(range(20000)), b"s", 5, 16, "tf_siphash")
    assert b.min() >= 0 and b.max() < 16
    for r in range(5):
        assert stats.chisquare(np.bincount(b[:, r], minlength=16)).pvalue > 1e-4
    assert abs(s.mean()) < 0.03
    assert not np.array_equal(b[:, 0], b[:, 1])                    # rows hash independently
    with pytest.raises(InvalidRequestError):
        sk.merge(C.CountSketch("count_median", 5, 64, 3, b"salt"))  # blake2b: other buckets


@pytest.mark.slow
def test_saved_featurizer_in_another_process_matches(tmp_path):
    from sage_tfx.pyramid.graph import example_feature_kinds, save_featurizer
    feat = snapshot(tmp_path)
    df = frame(n=200, seed=11)
    recs = examples(df)
    assert example_feature_kinds(recs[0], ["user", "item"]) == KINDS
    no_user = examples(df.iloc[:1], drop=("user",))[0]      # row 0: its user is dropped
    assert example_feature_kinds(iter([no_user, recs[1]]), ["user", "item"]) == KINDS
    with pytest.raises(NonCategoricalError):
        import tensorflow as tf
        ex = tf.train.Example()
        ex.features.feature["user"].float_list.value.append(1.5)
        example_feature_kinds(ex.SerializeToString(), ["user"])
    with pytest.raises(UnknownFeatureError):
        example_feature_kinds(recs[0], ["nope"])
    path = str(tmp_path / "featurizer")
    save_featurizer(feat, path, KINDS)
    np.save(tmp_path / "recs.npy", np.array(recs, dtype=object), allow_pickle=True)
    code = ("import sys, json, numpy as np, tensorflow as tf\n"
            "from sage_tfx.dp.counts import key_hashes\n"
            "recs = np.load(sys.argv[2], allow_pickle=True).tolist()\n"
            "f = tf.saved_model.load(sys.argv[1]).signatures['serving_default']\n"
            "x = f(examples=tf.constant(recs))['features'].numpy()\n"
            "b, s = key_hashes(['a', ('x', 1), 3, None], b'salt', 5, 1024, 'tf_siphash')\n"
            "print(json.dumps([x.tolist(), b.tolist(), s.tolist()]))\n")
    out = subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "recs.npy")],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "7", "TF_CPP_MIN_LOG_LEVEL": "3"})
    x, b, s = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_array_equal(np.array(x, np.float32), feat.featurize(df))
    b0, s0 = C.key_hashes(["a", ("x", 1), 3, None], b"salt", 5, 1024, "tf_siphash")
    assert b == b0.tolist() and s == s0.tolist()
    assert C.key_hashes(["a"], b"other", 5, 1024, "tf_siphash")[0].tolist() != b0[:1].tolist()


@pytest.mark.slow
def test_in_graph_featurizer_refuses_what_it_cannot_compute(tmp_path):
    from sage_tfx.pyramid import Featurization
    from sage_tfx.pyramid.graph import featurizer_module
    feat = snapshot(tmp_path)
    blake = Featurization(CountSpec(groups=feat.spec.groups, label="y", width=128),
                          feat.cells, feat.prior_counts, feat.noise_var)
    with pytest.raises(InvalidRequestError, match="tf_siphash"):
        featurizer_module(blake, KINDS)
    with pytest.raises(UnknownFeatureError):
        featurizer_module(feat, {"user": "bytes"})
    with pytest.raises(NonCategoricalError):
        featurizer_module(feat, {"user": "bytes", "item": "float"})
