"""Sealing one Pyramid window: its noisy tables, drawn once and recorded against the grant.

The tables of a window are one release of its grant (Sage's ledger, "release once"): the
``.npz`` bytes :func:`draw_tables` produces are recorded under the grant and the release name
:func:`release_name` *before* any store publishes them; a store that seals the same window again
(a retry, a restart, another process, another directory) gets the recorded bytes back and
draws no noise (:func:`release_once`). Tables of at most 64 MiB are recorded inline in the
ledger, so any store re-materializes them; larger ones by digest and the durable path of the
first store's file.
"""
from __future__ import annotations

import io
import json
import math
import os
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from sage_tfx.errors import InvalidRequestError, MissingGrantError, ReleaseConflictError
from sage_tfx.ledger import accounting
from sage_tfx.ledger.releases import MAX_VALUE_BYTES, digest_bytes, release_value_once
from sage_tfx.pyramid.featurize import CountSpec, group_keys, key_kinds
from sage_tfx.pyramid.plan import CONTINUOUS_LAPLACE, DISCRETE_GAUSSIAN, NoisePlan
from sage_tfx.pyramid.weights import select_noise_weights

__all__ = ["release_name", "draw_tables", "read_meta", "release_once", "check_replay",
           "check_grant",
           "retired_is_spent", "discrete_laplace_variance", "PRIOR"]

PRIOR = "__prior__"


def release_name(spec: CountSpec, window: int) -> str:
    """The ledger release name of one window's tables: ``pyramid/seal/<spec digest>/w<id>``."""
    return f"pyramid/seal/{spec.digest()}/w{int(window)}"


def discrete_laplace_variance(scale: float) -> float:
    """Variance of discrete Laplace P(z) ∝ exp(-|z|/scale): 2 e^{-1/s} / (1 - e^{-1/s})²."""
    q = math.exp(-1.0 / scale)
    return 2.0 * q / (1.0 - q) ** 2


def _noised(values: np.ndarray, plan: NoisePlan, i: int, noise) -> np.ndarray:
    s = float(plan.scales[i])
    if plan.mechanism == DISCRETE_GAUSSIAN:
        return np.asarray(noise.discrete_gaussian(values, s), dtype=np.int64)
    if plan.mechanism == CONTINUOUS_LAPLACE:
        return np.asarray(noise.laplace(values, s), dtype=np.float64)
    return np.asarray(noise.discrete_laplace(values, s), dtype=np.int64)


def draw_tables(frame: pd.DataFrame, spec: CountSpec, plan: NoisePlan, *, noise,
                meta: dict, weight_epsilon: Optional[float] = None, weight_quantile: float = 0.1,
                max_count: Optional[int] = None) -> bytes:
    """The window's noisy tables (and DP noise weights, if asked) as ``.npz`` bytes.

    This is the only place a window's noise is drawn. ``meta`` (window, run id, ε per table,
    scales) is stored with the tables, with the noise variances, the next weights and the key
    kinds of every counted column (``int``/``str``/...: schema, treated as public, so that
    serving refuses keys of another kind instead of silently backing off) added.
    """
    labels = frame[spec.label].to_numpy().astype(np.int64)
    arrays, noise_var = {}, {}
    for i, g in enumerate(spec.groups):
        sketch = spec.new_sketch(g)
        sketch.add(group_keys(frame, g), labels)
        arrays[f"cells__{spec.group_name(g)}"] = _noised(sketch.cells, plan, i, noise)
        noise_var[spec.group_name(g)] = plan.variance(i)
    counts = np.bincount(labels, minlength=spec.n_labels)
    prior = _noised(counts, plan, len(spec.groups), noise)
    noise_var[PRIOR] = plan.variance(len(spec.groups))
    next_weights = None
    if weight_epsilon is not None:
        next_weights = [float(v) for v in select_noise_weights(
            frame, spec, weight_epsilon, quantile=weight_quantile, max_count=max_count)]
    meta = dict(meta, noise_var=noise_var, next_weights=next_weights,
                kinds=key_kinds(frame, spec.features, spec.hash_family),
                mechanism=plan.mechanism)
    buf = io.BytesIO()
    np.savez_compressed(buf, prior=prior, meta=np.array(json.dumps(meta, sort_keys=True)),
                        **arrays)
    return buf.getvalue()


def read_meta(data: bytes) -> dict:
    """The metadata stored with a window's tables."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return json.loads(str(z["meta"]))


class _TooBig(Exception):
    def __init__(self, data: bytes):
        super().__init__(len(data))
        self.data = data


def _file_bytes(rec) -> bytes:
    """The bytes of a release recorded by digest and location, verified."""
    try:
        with open(rec.location, "rb") as f:
            data = f.read()
    except OSError:
        data = None
    if data is None or digest_bytes(data) != rec.digest:
        raise MissingGrantError(
            f"release {rec.name!r} of grant {rec.grant_id} was recorded at {rec.location}, "
            "which is gone or altered: it cannot be released again, and it is never re-drawn")
    return data


def _write_atomic(path: str, data: bytes) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def release_once(ledger, grant_id: str, name: str, produce: Callable[[], bytes],
                 location: str) -> tuple[bytes, bool]:
    """``(bytes, replayed)`` of the release ``name`` of a grant: the recorded bytes, or
    ``produce()``'s (which draws the noise), recorded first. A release too large to record
    inline is written to ``location`` and recorded by digest and that path."""
    first = ledger.recorded_release(grant_id, name)
    if first is not None and first.value is None:
        return _file_bytes(first), True

    def inline() -> bytes:
        data = produce()
        if len(data) > MAX_VALUE_BYTES:
            raise _TooBig(data)
        return data

    try:
        out = release_value_once(ledger, grant_id, name, inline)
        return out.value, out.replayed
    except _TooBig as big:
        _write_atomic(location, big.data)
        try:
            ledger.record_release(grant_id, name, digest=digest_bytes(big.data),
                                  location=os.path.abspath(location))
        except ReleaseConflictError:   # another process published first: ours is discarded
            rec = ledger.recorded_release(grant_id, name)
            return (rec.value if rec.value is not None else _file_bytes(rec)), True
        return big.data, False


def check_replay(data: bytes, plan: NoisePlan, window: int) -> None:
    """Raises ReleaseConflictError unless the recorded tables ``data`` of ``window`` were drawn
    with this seal's split of ε over the tables (its noise weights) and mechanism.

    The release name leaves the weights out on purpose: one grant buys *one* release of the
    window, so a seal with other weights must neither draw a second release nor be handed the
    first one as if it were what it asked for.
    """
    meta = read_meta(data)
    want = [float(x) for x in plan.shares.tolist()]
    got = meta.get("epsilons")
    mechanism = meta.get("mechanism", plan.mechanism)
    if got != want or mechanism != plan.mechanism:
        raise ReleaseConflictError(
            f"window {window} was released with {mechanism} noise and ε per table {got} (its "
            f"noise weights); this seal asks for {plan.mechanism} and {want}. One charge buys "
            "one release of the window: seal it again with the recorded weights to replay it")


def check_grant(ledger, grant, *, run_id: str, stream: str, blocks: Optional[Sequence[str]],
                epsilon: Optional[float], event=None, delta: float = 0.0) -> str:
    """The id of a released grant that pays for exactly this window, else InvalidRequestError.

    ``blocks=None`` / ``epsilon=None`` skip those checks (a replay of a recorded release).
    """
    from sage_tfx.ledger import RELEASED
    recorded = ledger.grant(grant.grant_id)
    problems = []
    if recorded.status != RELEASED:
        problems.append(f"status {recorded.status}")
    if recorded.run_id != run_id:
        problems.append(f"run id {recorded.run_id!r} is not {run_id!r}")
    if recorded.stream != stream:
        problems.append(f"stream {recorded.stream!r}")
    if blocks is not None and sorted(b.block_id for b in recorded.blocks) != sorted(blocks):
        problems.append("blocks differ from the window's")
    if event is not None:
        if recorded.event is None or \
                accounting.event_to_json(recorded.event) != accounting.event_to_json(event):
            problems.append(f"event {recorded.event} is not the tables' {event}")
    elif epsilon is not None and (
            recorded.epsilon is None or not math.isclose(recorded.epsilon, epsilon, rel_tol=1e-12)
            or not math.isclose(recorded.delta or 0.0, delta, rel_tol=1e-12, abs_tol=0.0)):
        problems.append(f"cost ({recorded.epsilon}, {recorded.delta}) is not ({epsilon}, {delta})")
    if problems:
        raise InvalidRequestError(f"grant {grant.grant_id} does not pay for this window: "
                                  + "; ".join(problems))
    return recorded.grant_id


def retired_is_spent(ledger, stream: str, blocks: Sequence[str], epsilon: float,
                     event=None) -> bool:
    """Whether the retired blocks among ``blocks`` are retired because they are spent: they
    cannot take this charge, or no longer admit the stream's ``retire_epsilon`` charge (the
    ledger's own retirement rule). An administrator's retirement of a block with budget left
    is not a spent budget."""
    s = ledger.stream(stream)
    spent = []
    for b in blocks:
        if ledger.block(stream, b).active:
            continue
        left = ledger.remaining(stream, b)
        if s.mode == accounting.RDP:
            room = [left["headroom"][a] for a in s.orders]
            probes = [accounting.rdp_curve(accounting.laplace_event(s.retire_epsilon), s.orders)]
            if event is not None:
                probes.append(accounting.rdp_curve(event, s.orders))
            spent.append(not all(any(c <= h for c, h in zip(p, room)) for p in probes))
        else:
            need = max(float(epsilon), s.retire_epsilon)
            spent.append(left["epsilon"] < need * (1 - 1e-12))
    return bool(spent) and all(spent)
