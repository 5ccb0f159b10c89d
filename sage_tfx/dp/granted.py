"""DP releases under a ledger grant, released once: statistics, validations, AdaSSP.

The ledger charges a run before any data is read (Sage §3.2); what the charge buys is *one*
release of each named output (:mod:`sage_tfx.ledger.releases`). A library call that reads a
grant's blocks and draws noise goes through this module, so a retried or restarted run that
replays the grant gets the recorded release back, byte for byte, and never draws new noise::

    from sage_tfx.dp.granted import validate_once
    result, replayed = validate_once(
        ledger, grant.grant_id, "mean-delay/mean", validator,
        lambda: read_float_feature(ledger, grant, "dep_delay"), epsilon=0.1)

Each release is recorded inline as canonical JSON ``{"request": ..., "release": ...}``:

* ``release`` is the DP output (a JSON value: the noisy statistic, a validation result, AdaSSP's
  released moments and weights);
* ``request`` is what was asked (the configuration, ε, digests of inputs that the grant does not
  fix). It is part of the record, so a replay with the same request returns the recorded
  release, and a replay with a *different* request under the same grant and name is refused
  with :class:`~sage_tfx.errors.ReleaseConflictError` naming the first: a new question needs a
  new grant. A failed attempt records nothing, so it binds nothing.

The value returned is always decoded from the recorded bytes, so the first run and every
replay return the same thing. Inputs may be given lazily (a callable): a replay never reads the
data. This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Optional, Union

from sage_tfx.dp import adassp as adassp_lib
from sage_tfx.dp import dpsgd
from sage_tfx.dp.validation import ValidationResult
from sage_tfx.errors import InvalidRequestError, ReleaseConflictError
from sage_tfx.ledger import accounting
from sage_tfx.ledger.releases import Release, check_release_name, release_value_once

__all__ = ["JsonRelease", "canonical_json", "check_request", "release_json_once",
           "validate_once", "adassp_once", "describe_validator"]

REQUEST_KEY = "request"
RELEASE_KEY = "release"

Lazy = Union[Any, Callable[[], Any]]


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no spaces, floats as their shortest round-trip
    repr (NaN and ±Infinity allowed), ASCII only.

    Raises:
      InvalidRequestError: ``obj`` is not made of JSON values (dicts with string keys, lists,
        strings, numbers, booleans, None).
    """
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True,
                          ensure_ascii=True).encode("ascii")
    except (TypeError, ValueError) as e:
        raise InvalidRequestError(f"a release and its request must be JSON values: {e}") from e


def _short(value: Any, limit: int = 80) -> str:
    text = canonical_json(value).decode("ascii")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def check_request(first: Release, recorded: Any, request: Any) -> None:
    """Raises ReleaseConflictError unless ``request`` is the request recorded with ``first``.

    The message names the first release (digest, time, principal) and the fields that differ.
    """
    if canonical_json(recorded) == canonical_json(request):
        return
    if isinstance(recorded, dict) and isinstance(request, dict):
        keys = sorted(set(recorded) | set(request), key=str)
        differ = [f"{k}: {_short(recorded.get(k))} then, {_short(request.get(k))} now"
                  for k in keys if canonical_json(recorded.get(k)) != canonical_json(
                      request.get(k))]
    else:
        differ = [f"{_short(recorded)} then, {_short(request)} now"]
    raise ReleaseConflictError(
        f"grant {first.grant_id} already released {first.name!r} (sha256 {first.digest[:16]}…, "
        f"{first.created_at}, by {first.principal}) for another request ({'; '.join(differ)}): "
        "one charge buys one release; replay the same request, or ask the ledger for a new grant")


@dataclasses.dataclass(frozen=True)
class JsonRelease:
    """A JSON release under a grant: the decoded value, its recorded bytes, replayed or not."""

    value: Any
    data: bytes
    replayed: bool
    release: Release


def release_json_once(ledger, grant_id: str, name: str, produce: Callable[[], Any], *,
                      request: Any = None) -> JsonRelease:
    """The JSON release (grant, name): the recorded one, or ``produce()``'s, recorded first.

    Args:
      ledger: the ledger that issued the grant (a released grant).
      grant_id: the grant paying for the release.
      name: the release name, deterministic per output (``check_release_name``).
      produce: draws the noise and returns the release as a JSON value; called only when
        nothing is recorded under (grant, name).
      request: what was asked (a JSON value), recorded with the release.

    Returns:
      The JsonRelease; ``value`` is decoded from the recorded bytes.

    Raises:
      ReleaseConflictError: the grant released ``name`` for another request.
      InvalidRequestError: a bad name, or a release or request that is not JSON.
      GrantStateError, PermissionDeniedError: from ``Ledger.record_release``.
    """
    check_release_name(name)
    request_bytes = canonical_json(request)  # fail early on a request that is not JSON

    def make() -> bytes:
        return canonical_json({REQUEST_KEY: json.loads(request_bytes), RELEASE_KEY: produce()})

    out = release_value_once(ledger, grant_id, name, make)
    record = json.loads(out.value)
    if not isinstance(record, dict) or set(record) != {REQUEST_KEY, RELEASE_KEY}:
        raise ReleaseConflictError(
            f"grant {grant_id} already released {name!r} (sha256 {out.release.digest[:16]}…) "
            "in another format than a request-bound JSON release: it cannot be replayed here")
    check_request(out.release, record[REQUEST_KEY], json.loads(request_bytes))
    return JsonRelease(record[RELEASE_KEY], out.value, out.replayed, out.release)


def _get(value: Lazy) -> Any:
    return value() if callable(value) else value


def describe_validator(validator: Any, epsilon: float) -> dict:
    """A validator's request fields: its class, SLA, target, η, bound and the DpEvent it spends."""
    bound = getattr(validator, "loss_bound", None)
    if bound is None:
        bound = getattr(validator, "value_bound", None)
    return {"validator": type(validator).__name__, "sla": getattr(validator, "sla", None),
            "target": validator.target, "eta": validator.eta, "bound": bound,
            "epsilon": epsilon, "event": accounting.event_to_dict(validator.dp_event(epsilon))}


def validate_once(ledger, grant_id: str, name: str, validator: Any, values: Lazy, *,
                  epsilon: float, request: Optional[dict] = None
                  ) -> tuple[ValidationResult, bool]:
    """``validator.validate(values, epsilon=epsilon)`` under a grant, released once.

    Args:
      ledger, grant_id, name: as :func:`release_json_once`.
      validator: a Sage validator of :mod:`sage_tfx.dp.validation` (OpenDP noise).
      values: the per-example values, or a callable returning them (not called on a replay).
      epsilon: the ε of the validation (consumed in full by the first run only).
      request: further request fields (e.g. the digest of the model validated).

    Returns:
      (the ValidationResult as recorded, whether it was replayed).

    Raises:
      ReleaseConflictError: the grant released ``name`` for another request.
      InvalidPrivacyParameterError: a bad ε (before anything is read).
    """
    epsilon = accounting.check_epsilon(epsilon)
    full = {**describe_validator(validator, epsilon), **(request or {})}
    out = release_json_once(
        ledger, grant_id, name,
        lambda: validator.validate(_get(values), epsilon=epsilon).to_dict(), request=full)
    return ValidationResult.from_dict(out.value), out.replayed


def adassp_once(ledger, grant_id: str, name: str, features: Lazy, labels: Lazy, *,
                epsilon: float, delta: float, x_bound: float, y_bound: float,
                rho: float = adassp_lib.DEFAULT_RHO, accountant: str = dpsgd.PLD,
                request: Optional[dict] = None) -> tuple[adassp_lib.AdaSSPResult, bool]:
    """:func:`sage_tfx.dp.adassp.adassp` under a grant, released once (OpenDP noise).

    ``features`` and ``labels`` may be callables (not called on a replay). The recorded release
    is the whole :class:`AdaSSPResult` (weights, released moments, the DpEvent).

    Returns:
      (the AdaSSPResult as recorded, whether it was replayed).

    Raises:
      ReleaseConflictError: the grant released ``name`` for another request.
      InvalidPrivacyParameterError, ValueError: as ``adassp`` (parameters checked first).
    """
    epsilon = accounting.check_epsilon(epsilon)
    delta = accounting.check_delta(delta, allow_zero=False)
    x_bound = accounting.check_positive(x_bound, "x_bound")
    y_bound = accounting.check_positive(y_bound, "y_bound")
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0 < rho < 1:
        raise ValueError(f"rho must lie in (0, 1), got {rho!r}")
    dpsgd.check_accountant(accountant)
    params = dict(epsilon=epsilon, delta=delta, x_bound=x_bound, y_bound=y_bound,
                  rho=float(rho), accountant=accountant)
    full = {"mechanism": "adassp", **params, **(request or {})}
    out = release_json_once(
        ledger, grant_id, name,
        lambda: adassp_lib.adassp(_get(features), _get(labels), **params).to_dict(),
        request=full)
    return adassp_lib.AdaSSPResult.from_dict(out.value), out.replayed

