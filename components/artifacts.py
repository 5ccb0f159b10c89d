"""Artifact types of sage-tfx components: the ledger's decision as a TFX artifact.

Sage §3.2 (Sage Access Control): a pipeline reaches block storage only through a grant the ledger
issued after charging the blocks. ``SageGate`` writes its decision into a :class:`SageGrant`
artifact; ``BlockExampleGen`` reads the grant (and re-checks it against the ledger) before it
touches any block.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from tfx.dsl.io import fileio
from tfx.types.artifact import Artifact

from sage_tfx.errors import MissingGrantError
from sage_tfx.ledger import Grant, secrets

# On-disk layout (see SageGrant).
GRANT_FILE_NAME = "grant.json"
GRANTED_FILE_NAME = "GRANTED"
DENIED_FILE_NAME = "DENIED"

# The decision, as an int custom property (like the Evaluator's 'blessed').
GRANTED_KEY = "granted"
GRANTED_VALUE = 1
DENIED_VALUE = 0

# Property names.
STREAM_KEY = "stream"
CONTEXT_KEY = "context"
RUN_ID_KEY = "run_id"
GRANT_ID_KEY = "grant_id"
EPSILON_KEY = "epsilon"
DELTA_KEY = "delta"
EVENT_JSON_KEY = "event_json"
LEDGER_URL_KEY = "ledger_url"
NUM_BLOCKS_KEY = "num_blocks"
BLOCK_IDS_KEY = "block_ids"
MODE_KEY = "mode"
REASON_KEY = "reason"
# Every custom property write_grant may set (a denial sets the first five and ``granted``).
GRANT_PROPERTY_KEYS = (STREAM_KEY, CONTEXT_KEY, RUN_ID_KEY, LEDGER_URL_KEY, REASON_KEY,
                       GRANT_ID_KEY, NUM_BLOCKS_KEY, BLOCK_IDS_KEY, MODE_KEY, EPSILON_KEY,
                       DELTA_KEY, EVENT_JSON_KEY)


def _custom_property(key: str, kind: str, doc: str) -> property:
    """A SageGrant attribute stored as an MLMD custom property of type ``kind``.

    Custom properties (not declared PROPERTIES) are what KFP v2 IR carries for a custom artifact
    type (its compiler rejects declared properties of a custom type), and they read back the
    same whether LocalDagRunner, Airflow or a Kubeflow pod rebuilt the artifact.
    """
    getter = {"string": Artifact.get_string_custom_property,
              "int": Artifact.get_int_custom_property,
              "float": Artifact.get_float_custom_property}[kind]
    setter = {"string": Artifact.set_string_custom_property,
              "int": Artifact.set_int_custom_property,
              "float": Artifact.set_float_custom_property}[kind]
    return property(lambda self: getter(self, key), lambda self, value: setter(self, key, value),
                    doc=doc)


class SageGrant(Artifact):
    """The ledger's decision on one run's request for blocks: a grant or a denial.

    Exactly one marker file is written, as with the Evaluator's ``ModelBlessing``, and the int
    custom property ``granted`` (1 / 0) says the same, so ``tfx.dsl.Cond`` works downstream::

        gate = SageGate(ledger_url=..., stream="flights", window_last=30, epsilon=0.1, delta=1e-7)
        with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
            example_gen = BlockExampleGen(grant=gate.outputs["grant"])

    * File structure:
        - ``{uri}/``
            - ``GRANTED``: empty marker, the ledger granted the request, and
            - ``grant.json``: the grant, ``sage_tfx.ledger.Grant.to_json()`` (grant id, run id,
              stream, context, mode, epsilon / delta or DpEvent, granted blocks with their
              storage locations, status "released").
          or
            - ``DENIED``: marker holding the ledger's reason for the denial (UTF-8 text).

    * Custom properties (ML Metadata; also attributes of this class, e.g. ``grant.ledger_url``).
      The type declares no PROPERTIES: Kubeflow Pipelines v2 IR cannot carry declared properties
      of a custom artifact type, custom properties travel with the artifact everywhere.
        - ``granted``: 1 if granted, 0 if denied.
        - ``stream``, ``context``, ``run_id``: what was requested (always set).
        - ``ledger_url``: the ledger that decided (always set): the reference the gate was
          given (``env:SAGE_LEDGER_URL``, resolved again by each reader) or a URL whose
          password, if any, is redacted — never a secret.
        - ``reason``: why the request was denied (denials only).
        - ``grant_id``, ``num_blocks``, ``block_ids`` (JSON list of the granted block ids, in
          ledger order), ``mode`` (``basic`` | ``rdp``): the grant (grants only).
        - ``epsilon``, ``delta``: the charged cost (basic-mode grants).
        - ``event_json``: the charged dp_accounting DpEvent,
          ``sage_tfx.ledger.accounting.event_to_json`` (rdp-mode grants).

    These make every ledger decision visible in ML Metadata: the lineage of a Model leads to its
    SageGrant, which answers "which blocks trained this model, at what privacy cost"
    (``sage_tfx.pipelines.lineage``).
    """

    TYPE_NAME = "sage_tfx.SageGrant"

    stream = _custom_property(STREAM_KEY, "string", "the requested stream")
    context = _custom_property(CONTEXT_KEY, "string", "the ledger context charged")
    run_id = _custom_property(RUN_ID_KEY, "string", "the ledger run id")
    grant_id = _custom_property(GRANT_ID_KEY, "string", "the grant id ('' for a denial)")
    epsilon = _custom_property(EPSILON_KEY, "float", "charged ε (basic mode)")
    delta = _custom_property(DELTA_KEY, "float", "charged δ (basic mode)")
    event_json = _custom_property(EVENT_JSON_KEY, "string", "charged DpEvent (rdp mode), JSON")
    ledger_url = _custom_property(LEDGER_URL_KEY, "string",
                                  "the ledger that decided: a reference (env:NAME, file:/path) "
                                  "or a URL without password")
    num_blocks = _custom_property(NUM_BLOCKS_KEY, "int", "how many blocks were granted")
    block_ids = _custom_property(BLOCK_IDS_KEY, "string", "granted block ids, a JSON list")
    mode = _custom_property(MODE_KEY, "string", "the stream's accounting mode")
    reason = _custom_property(REASON_KEY, "string", "why the request was denied")


def _write_text(path: str, text: str) -> None:
    with fileio.open(path, "w") as f:
        f.write(text)


def _read_text(path: str) -> str:
    with fileio.open(path, "r") as f:
        text = f.read()
    return text.decode("utf-8") if isinstance(text, bytes) else text


def write_grant(artifact: SageGrant, grant: Optional[Grant], *, stream: str, run_id: str,
                context: str, ledger_url: str, reason: str = "") -> None:
    """Writes a ledger decision into a SageGrant artifact (files and properties).

    Args:
      artifact: the output artifact; its ``uri`` directory is created if missing.
      grant: the released grant, or None for a denial.
      stream, run_id, context: what was requested.
      ledger_url: the ledger that decided.
      reason: why the request was denied (required for a denial).

    Raises:
      ValueError: a denial without a reason, or a grant that was not released.
    """
    if grant is None and not reason:
        raise ValueError("a denial needs the ledger's reason")
    if grant is not None and grant.status != "released":
        raise ValueError(f"grant {grant.grant_id} is {grant.status}: only a released grant can "
                         "be handed to a pipeline")
    fileio.makedirs(artifact.uri)
    for name in (GRANT_FILE_NAME, GRANTED_FILE_NAME, DENIED_FILE_NAME):
        path = os.path.join(artifact.uri, name)
        if fileio.exists(path):  # an artifact holds exactly one decision
            fileio.remove(path)
    for key in (*GRANT_PROPERTY_KEYS, GRANTED_KEY):  # nothing of an earlier decision remains
        if key in artifact.mlmd_artifact.custom_properties:
            del artifact.mlmd_artifact.custom_properties[key]
    # Custom properties set by key (not by attribute): this works on any artifact object of the
    # type, however the orchestrator rebuilt it.
    artifact.set_string_custom_property(STREAM_KEY, stream)
    artifact.set_string_custom_property(RUN_ID_KEY, run_id)
    artifact.set_string_custom_property(CONTEXT_KEY, context)
    artifact.set_string_custom_property(LEDGER_URL_KEY, secrets.redact(ledger_url))
    if grant is None:
        _write_text(os.path.join(artifact.uri, DENIED_FILE_NAME), reason)
        artifact.set_string_custom_property(REASON_KEY, reason)
        artifact.set_int_custom_property(GRANTED_KEY, DENIED_VALUE)
        return
    _write_text(os.path.join(artifact.uri, GRANT_FILE_NAME), grant.to_json())
    _write_text(os.path.join(artifact.uri, GRANTED_FILE_NAME), "")
    artifact.set_string_custom_property(GRANT_ID_KEY, grant.grant_id)
    artifact.set_int_custom_property(NUM_BLOCKS_KEY, len(grant.blocks))
    artifact.set_string_custom_property(BLOCK_IDS_KEY, json.dumps(list(grant.block_ids)))
    artifact.set_string_custom_property(MODE_KEY, grant.mode)
    if grant.epsilon is not None:
        artifact.set_float_custom_property(EPSILON_KEY, float(grant.epsilon))
    if grant.delta is not None:
        artifact.set_float_custom_property(DELTA_KEY, float(grant.delta))
    if grant.event is not None:
        from sage_tfx.ledger import accounting
        artifact.set_string_custom_property(EVENT_JSON_KEY, accounting.event_to_json(grant.event))
    artifact.set_int_custom_property(GRANTED_KEY, GRANTED_VALUE)


def single_artifact(artifacts_dict, key: str, *, component: str, what: str) -> Artifact:
    """The one artifact under ``key`` of an executor's input or output dict.

    Raises:
      MissingGrantError: for the grant channel (nothing was charged for this run);
      ValueError: for any other channel with zero or several artifacts.
    """
    items = artifacts_dict.get(key) or []
    if len(items) != 1:
        error = MissingGrantError if "SageGrant" in what else ValueError
        raise error(f"{component} needs exactly one {what} in '{key}', got {len(items)}")
    return items[0]


def is_granted(artifact: Artifact) -> bool:
    """Whether a SageGrant artifact holds a grant (GRANTED marker and ``granted`` == 1)."""
    return (artifact.has_custom_property(GRANTED_KEY)
            and artifact.get_int_custom_property(GRANTED_KEY) == GRANTED_VALUE
            and fileio.exists(os.path.join(artifact.uri, GRANTED_FILE_NAME)))


def denial_reason(artifact: Artifact) -> Optional[str]:
    """The ledger's reason if the artifact is a denial, else None."""
    path = os.path.join(artifact.uri, DENIED_FILE_NAME)
    return _read_text(path) if fileio.exists(path) else None


def read_grant(artifact: Artifact) -> Grant:
    """Reads the grant held by a SageGrant artifact.

    This only parses the artifact: whoever reads block data must also check the grant against
    the ledger (``BlockExampleGen`` does).

    Raises:
      MissingGrantError: the artifact is a denial, holds no grant, or its files and properties
        disagree.
    """
    if artifact.type_name != SageGrant.TYPE_NAME:
        raise MissingGrantError(
            f"expected a {SageGrant.TYPE_NAME} artifact from SageGate, got {artifact.type_name}")
    reason = denial_reason(artifact)
    if reason is not None:
        raise MissingGrantError(
            f"the ledger denied run {artifact.get_string_custom_property(RUN_ID_KEY)!r} on stream "
            f"{artifact.get_string_custom_property(STREAM_KEY)!r}: {reason}. "
            "No block data may be read; run the reading components under "
            "tfx.dsl.Cond(grant.future()[0].custom_property('granted') == 1) "
            "to skip them on a denial")
    path = os.path.join(artifact.uri, GRANT_FILE_NAME)
    if not fileio.exists(path) or not fileio.exists(os.path.join(artifact.uri, GRANTED_FILE_NAME)):
        raise MissingGrantError(
            f"no grant in artifact {artifact.uri}: neither {GRANTED_FILE_NAME} + {GRANT_FILE_NAME} "
            f"nor {DENIED_FILE_NAME} was written (was SageGate run?)")
    if not (artifact.has_custom_property(GRANTED_KEY)
            and artifact.get_int_custom_property(GRANTED_KEY) == GRANTED_VALUE):
        raise MissingGrantError(
            f"artifact {artifact.uri} has a {GRANT_FILE_NAME} but its '{GRANTED_KEY}' property "
            "is not 1")
    try:
        grant = Grant.from_json(_read_text(path))
    except (ValueError, KeyError, TypeError) as e:
        raise MissingGrantError(f"unreadable {path}: {e}") from e
    recorded = artifact.get_string_custom_property(GRANT_ID_KEY)
    if recorded and recorded != grant.grant_id:
        raise MissingGrantError(
            f"{path} names grant {grant.grant_id} but the artifact records grant "
            f"{recorded}: the grant file was altered")
    return grant
