"""Partition invariants: keyed-hash chunks, one unit changes exactly k teachers."""
import numpy as np
import pytest

from sage_tfx.bagging import chunk_assignment, train_teachers
from sage_tfx.errors import InvalidRequestError

SALT = b"test-salt"


def _members(chunks, n):
    """Set of unit indices per (partition, chunk)."""
    k = chunks.shape[1]
    return {
        (i,
         j): frozenset(np.flatnonzero(chunks[:, i] == j).tolist()) for i in range(
             k) for j in range(n)}


def test_one_chunk_per_partition_per_unit_and_deterministic():
    units = list(range(500))
    ch = chunk_assignment(units, k=7, n=13, salt=SALT)
    assert ch.shape == (500, 7) and ch.dtype == np.int32
    assert ch.min() >= 0 and ch.max() < 13
    assert np.array_equal(ch, chunk_assignment(units, k=7, n=13, salt=SALT))
    # a unit's chunks depend on that unit alone (not on its position or on the other units)
    assert np.array_equal(chunk_assignment([42], k=7, n=13, salt=SALT)[0], ch[42])
    assert not np.array_equal(chunk_assignment(units, k=7, n=13, salt=b"other"), ch)
    # repeated rows of one unit share their chunks; str and int ids are distinct units
    rows = chunk_assignment(["u1", "u2", "u1"], k=5, n=9, salt=SALT)
    assert np.array_equal(rows[0], rows[2])
    # balanced in expectation: every chunk within 5 sd of N/n
    big = chunk_assignment(list(range(20000)), k=3, n=20, salt=SALT)
    for i in range(3):
        sizes = np.bincount(big[:, i], minlength=20)
        assert np.all(np.abs(sizes - 1000) < 5 * np.sqrt(1000))
    # partitions are not copies of each other
    assert np.mean(big[:, 0] == big[:, 1]) < 0.1


@pytest.mark.parametrize("N", [99, 100, 101])   # around a multiple of n, where slicing breaks
def test_removing_or_adding_one_unit_changes_exactly_k_teachers(N):
    k, n = 6, 10
    units = [f"user-{u}" for u in range(N)]
    full = _members(chunk_assignment(units, k=k, n=n, salt=SALT), n)
    for removed in (0, N // 2, N - 1):
        rest = units[:removed] + units[removed + 1:]
        idx = [u for u in range(N) if u != removed]
        sub = {key: frozenset(idx[m] for m in mem)
               for key, mem in _members(chunk_assignment(rest, k=k, n=n, salt=SALT), n).items()}
        changed = [key for key in full if full[key] != sub[key]]
        assert len(changed) == k
        assert sorted(i for i, _ in changed) == list(range(k))   # one per partition
        assert all(full[key] - sub[key] == {removed} for key in changed)


def test_positional_slicing_would_break_the_invariant():
    """The paper's |D|/n slicing moves many chunk boundaries when one unit is removed."""
    perm = np.random.default_rng(0).permutation(101)
    slices = lambda order: [frozenset(order[j::10].tolist()) for j in range(10)]  # noqa: E731
    before = slices(perm)
    after = slices(perm[perm != perm[0]])
    assert sum(a != b for a, b in zip(before, after)) > 1


def test_only_the_k_teachers_of_a_removed_unit_change():
    rng = np.random.default_rng(1)
    N, d, k, n = 400, 3, 5, 8
    X = rng.normal(size=(N, d))
    y = (X[:, 0] + 0.5 * rng.normal(size=N) > 0).astype(int)
    units = np.arange(N)
    ch = chunk_assignment(units.tolist(), k=k, n=n, salt=SALT)
    full = train_teachers(X, y, ch, n=n)
    keep = units != 17
    sub = train_teachers(X[keep], y[keep], ch[keep], n=n)
    diff = np.abs(full.coef - sub.coef).max(axis=2) > 1e-12
    assert diff.sum() == k
    assert all(diff[i, ch[17, i]] for i in range(k))


@pytest.mark.parametrize("k,n", [(0, 3), (3, 0), (-1, 2), (True, 3), (2.0, 3)])
def test_bad_shapes_are_refused(k, n):
    with pytest.raises(InvalidRequestError):
        chunk_assignment([1, 2, 3], k=k, n=n, salt=SALT)


def test_bad_unit_ids_and_salt_are_refused():
    with pytest.raises(InvalidRequestError):
        chunk_assignment([1.5], k=1, n=1, salt=SALT)
    with pytest.raises(InvalidRequestError):
        chunk_assignment([1], k=1, n=1, salt=b"")
