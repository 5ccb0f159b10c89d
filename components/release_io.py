"""Release once, for TFX executors: an output artifact's directory or a JSON value per grant.

A DP executor retried by its orchestrator (a KFP pod retry, an Airflow task retry, a manual
re-run with the same run id) receives the replayed grant. Without this module it would draw
fresh noise and publish a second release for one charge. With it, the first run records its
release in the ledger (``sage_tfx.ledger.releases``) before the output is published, and every
later run under the same grant and release name gets that release back, byte for byte, without
drawing noise:

* :func:`release_artifact_once` — a directory output (DPTransform's ``transform_graph``, the DP
  Trainer's ``model``, a system's table): ``produce_into(staging)`` writes the output into a
  fresh directory; the tree, plus a :data:`RELEASE_FILE_NAME` holding the release name and the
  request, is recorded (inline as a deterministic tar up to 64 MiB, else by digest with the
  artifact's uri as its durable location) and only then moved into ``artifact.uri``. A replay
  materializes the recorded tree into the new uri.
* :func:`release_json_once` — a small JSON release (DPModelValidator's noisy statistics and
  decision), via :func:`sage_tfx.dp.granted.release_json_once`.

Releases are named by the plan part they spend (``releases.part_release_name``:
``"train/model"``, not ``"dp_trainer/model"``), and given ``part=`` both functions claim the part
for the component before recording (``releases.claim_part``): one spender per plan part, so a
DPTrainer and a DnDTrainer on one train part cannot both publish.

Both record the *request* (what the executor was asked: configuration, ε, digests of inputs the
grant does not fix) with the release. A replay with another request is refused with
``ReleaseConflictError`` naming the first release and the fields that differ; the artifact is
left empty, so nothing is published. A failed attempt records nothing.

Every output artifact released here carries the int custom property :data:`REPLAYED_PROPERTY`
(1: this execution published a recorded release and drew no noise; 0: it drew the release) and
the string properties :data:`RELEASE_NAME_PROPERTY` and :data:`RELEASE_DIGEST_PROPERTY`.
Ledger URLs are logged redacted.

Artifact uris must be local paths (or mounted buckets) for trees over 64 MiB; a remote uri
(``gs://``, ``s3://``, ...) is staged locally and must hold at most 64 MiB (recorded inline).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Callable, Iterable, Optional

from absl import logging
from tfx.dsl.io import fileio
from tfx.types.artifact import Artifact
from tfx.utils import io_utils

from sage_tfx.dp import granted
from sage_tfx.errors import InvalidRequestError, MissingGrantError, ReleaseConflictError
from sage_tfx.ledger import releases, secrets

REPLAYED_PROPERTY = "replayed"
RELEASE_NAME_PROPERTY = "release_name"
RELEASE_DIGEST_PROPERTY = "release_digest"
RELEASE_FILE_NAME = "sage_release.json"  # in a released tree: {"name": ..., "request": ...}


def ledger_url_for(grant_artifact: Artifact, ledger_url: Optional[str], *,
                   component: str) -> str:
    """The ledger an executor must ask about its grant: ``ledger_url`` if pinned, else the one
    that issued the grant (the SageGrant's ``ledger_url``).

    Raises:
      MissingGrantError: no ledger to ask, or a grant issued by another ledger than the pinned
        one (a grant is only as good as the ledger that holds it).
    """
    issued_by = (grant_artifact.get_string_custom_property("ledger_url")
                 if grant_artifact.has_custom_property("ledger_url") else "")
    url = ledger_url or issued_by
    if not url:
        raise MissingGrantError(
            f"grant artifact {grant_artifact.uri} records no ledger_url and {component} was "
            "given none")
    if issued_by and issued_by != url:
        raise MissingGrantError(
            f"the grant was issued by another ledger than the one {component} trusts "
            f"({secrets.redact(url)!r} pinned)")
    return url


def mark(artifacts: Iterable[Artifact], release: releases.Release, replayed: bool) -> None:
    """Records on output artifacts which release they hold and whether it was replayed."""
    for artifact in artifacts:
        artifact.set_int_custom_property(REPLAYED_PROPERTY, int(bool(replayed)))
        artifact.set_string_custom_property(RELEASE_NAME_PROPERTY, release.name)
        artifact.set_string_custom_property(RELEASE_DIGEST_PROPERTY, release.digest)


def _log(component: str, ledger, release: releases.Release, replayed: bool) -> None:
    logging.info("%s: %s release %r of grant %s (sha256 %s…) on ledger %s", component,
                 "replayed the recorded" if replayed else "recorded its", release.name,
                 release.grant_id, release.digest[:16], ledger.redacted_url)


def _conflict(component: str, e: ReleaseConflictError) -> ReleaseConflictError:
    return ReleaseConflictError(f"{component} refused to publish a second release: {e}")


def _is_remote(uri: str) -> bool:
    return "://" in uri


def _clear(uri: str) -> None:
    if fileio.exists(uri):
        io_utils.delete_dir(uri)


def release_artifact_once(ledger, grant_id: str, name: str, artifact: Artifact,
                          produce_into: Callable[[str], None], *, request: Any,
                          component: str, part: Optional[str] = None) -> releases.Outcome:
    """Releases the directory output ``artifact`` once under (grant, name).

    With ``part`` (the plan part the output spends), the part must be unclaimed or claimed by
    ``component`` before anything is produced, and is claimed for it
    (``releases.claim_part``) after the output is produced and before it is recorded: a second
    spender of the part, of any kind, fails with ``ReleaseConflictError``.

    Args:
      ledger: the ledger that issued the grant.
      grant_id: the released grant paying for the output.
      name: the release name, deterministic per output (e.g. ``"dp_transform/transform_graph"``).
      artifact: the output artifact; its uri receives the released tree.
      produce_into: ``produce_into(staging_dir)`` writes the output (draws the noise); called
        only when nothing is recorded, never on a replay.
      request: what the executor was asked (a JSON value), recorded with the release.
      component: the executor's name, for messages and logs; the part's spender.
      part: the plan part the output spends (``releases.part_release_name``), or None.

    Returns:
      The ledger Outcome (``replayed``: the tree was materialized from the record).

    Raises:
      ReleaseConflictError: the grant released ``name`` for another request; ``artifact.uri``
        is left empty.
      InvalidRequestError: a tree with a link, a remote uri and a tree over 64 MiB, or an output
        that already holds a RELEASE_FILE_NAME.
    """
    request = json.loads(granted.canonical_json(request))
    remote = _is_remote(artifact.uri)
    if part is not None:
        _check_part(ledger, grant_id, part, component)

    def produce(staging: str) -> None:
        produce_into(staging)
        if part is not None:
            _claim_part(ledger, grant_id, part, component)
        path = os.path.join(staging, RELEASE_FILE_NAME)
        if os.path.exists(path):
            raise InvalidRequestError(f"{component} wrote its own {RELEASE_FILE_NAME}")
        with open(path, "wb") as f:
            f.write(granted.canonical_json({"name": name, "request": request}))
        if remote and len(releases.tree_bytes(staging)) > releases.MAX_VALUE_BYTES:
            raise InvalidRequestError(
                f"{component}: a release into the remote uri {artifact.uri} is recorded inline "
                f"and holds at most {releases.MAX_VALUE_BYTES} bytes; use a local or mounted "
                "pipeline root for larger outputs")

    with tempfile.TemporaryDirectory(prefix="sage-release-") as tmp:
        out_dir = os.path.join(tmp, "out") if remote else artifact.uri
        try:
            out = releases.release_tree_once(ledger, grant_id, name, out_dir, produce)
        except ReleaseConflictError as e:
            raise _conflict(component, e) from e
        try:
            recorded = _read_release_file(out_dir, out.release)
            granted.check_request(out.release, recorded.get("request"), request)
        except ReleaseConflictError as e:
            location = out.release.location
            if not (location and os.path.abspath(location) == os.path.abspath(out_dir)):
                _clear(out_dir)  # never the recorded location of a large release
            raise _conflict(component, e) from e
        if remote:
            _clear(artifact.uri)
            io_utils.copy_dir(out_dir, artifact.uri)
    mark([artifact], out.release, out.replayed)
    _log(component, ledger, out.release, out.replayed)
    return out


def _check_part(ledger, grant_id: str, part: str, component: str) -> None:
    try:
        releases.check_part_claim(ledger, grant_id, part, component)
    except ReleaseConflictError as e:
        raise _conflict(component, e) from e


def _claim_part(ledger, grant_id: str, part: str, component: str) -> None:
    try:
        releases.claim_part(ledger, grant_id, part, component)
    except ReleaseConflictError as e:
        raise _conflict(component, e) from e


def _read_release_file(out_dir: str, release: releases.Release) -> dict:
    path = os.path.join(out_dir, RELEASE_FILE_NAME)
    try:
        with open(path, "rb") as f:
            recorded = json.loads(f.read())
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict) or recorded.get("name") != release.name:
        raise ReleaseConflictError(
            f"grant {release.grant_id} already released {release.name!r} (sha256 "
            f"{release.digest[:16]}…) without a request record: it was not released by this "
            "component and cannot be replayed by it")
    return recorded


def release_json_once(ledger, grant_id: str, name: str, produce: Callable[[], Any], *,
                      request: Any, component: str, artifacts: Iterable[Artifact] = (),
                      part: Optional[str] = None) -> granted.JsonRelease:
    """A JSON release once under (grant, name), marked on ``artifacts`` (see module doc).

    ``part``: the plan part the release spends, claimed for ``component`` as in
    :func:`release_artifact_once`.

    Raises:
      ReleaseConflictError: the grant released ``name`` for another request, or another
        spender claimed ``part``.
    """
    if part is not None:
        _check_part(ledger, grant_id, part, component)
        inner = produce

        def produce() -> Any:
            value = inner()
            _claim_part(ledger, grant_id, part, component)
            return value
    try:
        out = granted.release_json_once(ledger, grant_id, name, produce, request=request)
    except ReleaseConflictError as e:
        raise _conflict(component, e) from e
    mark(artifacts, out.release, out.replayed)
    _log(component, ledger, out.release, out.replayed)
    return out


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (for requests naming an input such as a module file)."""
    h = hashlib.sha256()
    with fileio.open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(uri: str) -> str:
    """:func:`sage_tfx.ledger.releases.tree_digest` of a local directory, or of a remote one
    copied to a local temporary directory first (for requests naming an input tree)."""
    if not _is_remote(uri):
        return releases.tree_digest(uri)
    with tempfile.TemporaryDirectory(prefix="sage-digest-") as tmp:
        local = os.path.join(tmp, "tree")
        io_utils.copy_dir(uri, local)
        return releases.tree_digest(local)
