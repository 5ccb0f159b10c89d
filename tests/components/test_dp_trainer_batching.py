"""Poisson batches built in Beam (components/dp_trainer/batching.py) have the distribution the
accountant assumes: every step once, each labelled example in each step independently with
probability q (sizes Binomial(n, q)), truncation at B exactly as often as P[Binomial(n, q) > B]."""
import collections
import os

import numpy as np
import pytest
from scipy import stats

from blockdata import make_example

pytestmark = pytest.mark.slow

N, UNLABELLED, Q, STEPS = 600, 57, 0.05, 240


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import tensorflow as tf
    root = tmp_path_factory.mktemp("batching")
    os.makedirs(root / "Split-train")
    for k in range(2):
        with tf.io.TFRecordWriter(str(root / "Split-train" / f"d-{k}.gz"), options="GZIP") as w:
            for i in range(k, N + UNLABELLED, 2):
                feats = {"id": i}
                if i < N:
                    feats["label"] = float(i % 3)
                w.write(make_example(feats).SerializeToString())
    return [str(root / "Split-train" / "*")]


def _run(tmp_path, files, **kw):
    import apache_beam as beam
    from sage_tfx.components.dp_trainer import batching
    out = str(tmp_path / "batches")
    with beam.Pipeline() as p:
        batching.count_examples(p, files, "label", str(tmp_path))
    with beam.Pipeline() as p:
        batching.write_batches(p, files, out, label_key="label", sampling_probability=Q,
                               steps=STEPS, **kw)
    steps = collections.Counter()
    sizes = {}
    ids = {}
    import tensorflow as tf
    for path in batching.batch_files(out):
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            step, examples = batching.parse_batch_record(record.numpy())
            steps[step] += 1
            sizes[step] = len(examples)
            ids[step] = [tf.train.Example.FromString(e).features.feature["id"].int64_list.value[0]
                         for e in examples]
    return batching.read_count(str(tmp_path)), steps, sizes, ids, batching.read_stats(out)


def test_spilled_batches_are_exactly_poisson(tmp_path, files):
    n, steps, sizes, ids, stats_file = _run(tmp_path, files, max_batch_size=8, oversize="spill")
    assert n == N                                         # unlabelled records are not counted
    assert set(steps) == set(range(STEPS)) and set(steps.values()) == {1}   # every step, once
    for step_ids in ids.values():
        assert len(set(step_ids)) == len(step_ids) and max(step_ids, default=0) < N
    z = (np.array([sizes[t] for t in range(STEPS)]) - N * Q) / np.sqrt(N * Q * (1 - Q))
    assert stats.chi2.sf(float(np.sum(z ** 2)), STEPS) > 1e-3   # sizes: Binomial(N, Q)
    assert max(sizes.values()) > 8                         # spill kept steps above B whole
    assert stats_file == {"steps": STEPS, "truncated_steps": 0, "dropped_examples": 0}
    per_example = collections.Counter(i for step_ids in ids.values() for i in step_ids)
    joins = np.array([per_example.get(i, 0) for i in range(N)])
    assert abs(joins.mean() - STEPS * Q) < 4 * np.sqrt(STEPS * Q * (1 - Q) / N)


def test_truncated_batches_are_truncated_at_the_rate_the_accountant_assumes(tmp_path, files):
    """With B at the 80th percentile of Binomial(N, Q), a step is truncated with probability
    P[Binomial(N, Q) > B] (≈ 0.2): the observed rate is within a binomial test of it, and the
    recorded count is the observed one. (The accounting bounds the same event's probability by
    T · P[Binomial(n + 1, q) > B], sage_tfx.dp.poisson_batching.)"""
    b = int(stats.binom.ppf(0.8, N, Q))
    p_over = float(stats.binom.sf(b, N, Q))
    _, steps, sizes, _, stats_file = _run(tmp_path, files, max_batch_size=b,
                                          oversize="truncate")
    assert set(steps) == set(range(STEPS)) and max(sizes.values()) <= b
    truncated = sum(1 for s in sizes.values() if s == b)   # full steps: truncated or exactly B
    assert stats_file["truncated_steps"] <= truncated
    assert stats.binomtest(stats_file["truncated_steps"], STEPS, p_over).pvalue > 1e-6
    assert stats_file["dropped_examples"] >= stats_file["truncated_steps"]
