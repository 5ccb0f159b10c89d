"""BlockExampleGen executor: the granted blocks, and nothing else, into an Examples artifact.

Sage §3.2: data leaves block storage only under a released grant, whose blocks the ledger charged
first. The grant file in the SageGrant artifact is only a pointer: before any file is opened the
executor looks the grant up in the ledger, requires it to be released, requires grant.json and the
artifact's properties to agree with the ledger's record, and then reads the block locations the
*ledger* records (never the ones in the file). An edited grant.json therefore cannot widen a run's
access to other blocks. Block files are encrypted: the ledger hands out the *wrapped* data keys
of the released grant's blocks only (``Ledger.grant_keys``, authorized like a charge on the
grant's context), and the Beam workers unwrap them with the key-encryption key of
``$SAGE_KEY_PROVIDER`` and decrypt (``sage_tfx.streams.reading``). No key material enters the
exec properties recorded in MLMD: the granted files and their wrapped keys travel in an internal
property handed to the Beam read only.

Reading: one Beam read over all granted files, whatever the number of blocks:
``beam.Create(files) | Reshuffle | FlatMap(decrypt + parse TFRecord framing)``. Measured with
``benchmarks/read_blocks.py`` on 1,000 one-file day-blocks of 20 records on the shared 2-core
machine (runs vary ~2x with load): this read 1.0-4.1 s; ``ReadAllFromTFRecord`` 3.7-9.3 s (Beam
checks record CRCs in pure Python); a Flatten of one ``ReadFromTFRecord`` per file 557 s; the whole
``Do()`` (ledger check, read, 2:1 split, write) 12-16 s (before encryption;
``benchmarks/sage/bench_block_crypto.py`` measures the encrypted read). One ExampleGen split per
block does not scale either (100 day-splits: 79 s and 3.3 GB, against 4.7 s for one split listing
1,000 day-blocks' files). Records are split into the output
splits by TFX's own deterministic hash partition (``BaseExampleGenExecutor``), and written in the
standard ExampleGen layout (``Split-<name>/data_tfrecord-*.gz``, ``split_names``, payload
format), so StatisticsGen, Transform and Trainer read them unchanged.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Sequence

import apache_beam as beam
from absl import logging
from tfx import types
from tfx.components.example_gen import base_example_gen_executor
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import proto_utils

from sage_tfx.ledger import accounting, secrets
from sage_tfx.streams import reading
from sage_tfx.components import artifacts
from sage_tfx.components.block_example_gen import spec
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import RELEASED, Grant, Ledger, open_ledger

# Internal exec property: the granted data files (``reading.GrantedFile``: path, block, wrapped
# key, KEK spec), handed from Do() to the Beam read; never recorded in MLMD.
GRANTED_FILES_KEY = "_sage_granted_files"
# The single input "split" of the ExampleGen machinery (its pattern is unused: files come from
# the grant).
INPUT_SPLIT_NAME = "granted_blocks"


def _event_text(grant: Grant) -> str:
    return accounting.event_to_json(grant.event) if grant.event is not None else ""


def verify_grant(grant: Grant, ledger: Ledger, ledger_url: str) -> Grant:
    """Checks a grant read from an artifact against the ledger's record of it.

    Args:
      grant: the grant parsed from grant.json.
      ledger: the ledger that must have issued it.
      ledger_url: the ledger's URL (for messages).

    Returns:
      The ledger's own record of the grant (its block locations are the ones to read).

    Raises:
      MissingGrantError: the ledger has no such grant, it is not released, or any field of the
        file (stream, run id, context, mode, cost, blocks, locations) differs from the record.
    """
    try:
        recorded = ledger.grant(grant.grant_id)
    except InvalidRequestError as e:
        raise MissingGrantError(
            f"grant {grant.grant_id!r} is not in ledger {secrets.redact(ledger_url)}: no block "
            "data may be read "
            "without a grant the ledger issued") from e
    if recorded.status != RELEASED:
        raise MissingGrantError(
            f"grant {grant.grant_id} in ledger {secrets.redact(ledger_url)} is {recorded.status}, "
            "not "
            f"{RELEASED}: its blocks' data was not released")
    mismatches = []
    for field in ("stream", "run_id", "context", "mode", "epsilon", "delta", "status"):
        if getattr(grant, field) != getattr(recorded, field):
            mismatches.append(f"{field}: file {getattr(grant, field)!r}, "
                              f"ledger {getattr(recorded, field)!r}")
    if _event_text(grant) != _event_text(recorded):
        mismatches.append("event differs")
    if grant.block_ids != recorded.block_ids:
        extra = sorted(set(grant.block_ids) - set(recorded.block_ids))
        mismatches.append(f"blocks differ (not granted: {extra[:10]})" if extra
                          else "blocks differ")
    else:
        moved = [b.block_id for b, r in zip(grant.blocks, recorded.blocks)
                 if b.location != r.location]
        if moved:
            mismatches.append(f"locations of block(s) {moved[:10]} differ from the ledger's")
    if mismatches:
        raise MissingGrantError(
            f"grant.json of grant {grant.grant_id} does not match ledger "
            f"{secrets.redact(ledger_url)} "
            f"({'; '.join(mismatches)}): the grant file was altered; refusing to read any block")
    return recorded


def granted_files(grant: Grant, ledger: Ledger) -> List[reading.GrantedFile]:
    """The data files of a released grant's blocks, at the ledger's locations, each with its
    block's wrapped key (``reading.granted_files``; TFX's filesystem lists them).

    Raises:
      FileNotFoundError: a granted block with records has no data file in block storage.
      RetiredBlockError: a granted block's key was destroyed.
    """
    return reading.granted_files(ledger, grant, glob=fileio.glob)


def _open(path: str):
    if "://" in path:
        import tensorflow as tf
        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb")


def read_granted_file(f: reading.GrantedFile) -> Iterator[bytes]:
    """The records of one granted block file, decrypted on this worker."""
    return reading.read_granted_file(f, opener=_open)


def read_gzip_tfrecords(path: str) -> Iterator[bytes]:
    """The records of one gzip TFRecord file (TensorFlow's C++ reader; CRCs are checked): the
    files of an Examples artifact, not block files."""
    import tensorflow as tf
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    yield from tf.compat.v1.io.tf_record_iterator(path, options=options)


@beam.ptransform_fn
@beam.typehints.with_input_types(beam.Pipeline)
def _ReadGrantedBlocks(pipeline: beam.Pipeline, exec_properties: Dict[str, Any],
                       split_pattern: str) -> beam.pvalue.PCollection:
    """Reads the serialized tf.Examples of every granted file in one Beam read."""
    del split_pattern  # the files come from the verified grant
    files: Sequence[reading.GrantedFile] = exec_properties[GRANTED_FILES_KEY]
    records = (pipeline
               | "GrantedFiles" >> beam.Create(list(files))
               # beam.Create makes one bundle; spread the files over workers.
               | "SpreadFiles" >> beam.Reshuffle()
               | "ReadBlocks" >> beam.FlatMap(read_granted_file).with_output_types(bytes))
    output_config = example_gen_pb2.Output()
    proto_utils.json_to_proto(exec_properties[spec.OUTPUT_CONFIG_KEY], output_config)
    if output_config.split_config.partition_feature_name:
        import tensorflow as tf  # partition by feature needs parsed examples
        records = records | "ParseExamples" >> beam.Map(tf.train.Example.FromString)
    return records


class Executor(base_example_gen_executor.BaseExampleGenExecutor):
    """Reads the blocks of a verified, released grant into train/eval (or configured) splits."""

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:
        return _ReadGrantedBlocks

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Verifies the grant against the ledger, then writes the granted records as Examples.

        Args:
          input_dict: ``grant``: a list of one SageGrant artifact.
          output_dict: ``examples``: a list of one Examples artifact.
          exec_properties: the keys of ``sage_tfx.components.block_example_gen.spec``.

        Raises:
          MissingGrantError: the grant is a denial, missing, not released, unknown to the ledger,
            or its file disagrees with the ledger.
          FileNotFoundError: a granted block's data is missing from block storage.
          RetiredBlockError: a granted block's key was destroyed (it retired since the grant).
        """
        grant_artifact = artifact_utils.get_single_instance(input_dict[spec.GRANT_INPUT_KEY])
        grant = artifacts.read_grant(grant_artifact)
        issued_by = grant_artifact.ledger_url
        ledger_url = exec_properties.get(spec.LEDGER_URL_KEY) or issued_by
        if not ledger_url:
            raise MissingGrantError(
                f"grant artifact {grant_artifact.uri} records no ledger_url and none was given")
        if issued_by and issued_by != ledger_url:
            raise MissingGrantError(
                f"grant {grant.grant_id} was issued by ledger {secrets.redact(issued_by)}, but "
                f"this BlockExampleGen only trusts ledger {secrets.redact(ledger_url)}")
        mismatched = [k for k in ("stream", "run_id") if getattr(grant_artifact, k)
                      and getattr(grant_artifact, k) != getattr(grant, k)]
        if mismatched:
            raise MissingGrantError(
                f"grant artifact {grant_artifact.uri}: properties {mismatched} differ from its "
                "grant.json: the grant file was altered")
        with open_ledger(ledger_url) as ledger:
            recorded = verify_grant(grant, ledger, ledger_url)
            files = granted_files(recorded, ledger)
        logging.info("BlockExampleGen: grant %s (run %s, stream %s): reading %d block(s), %d "
                     "file(s)", recorded.grant_id, recorded.run_id, recorded.stream,
                     len(recorded.blocks), len(files))

        props = dict(exec_properties)
        props[standard_component_specs.INPUT_CONFIG_KEY] = proto_utils.proto_to_json(
            example_gen_pb2.Input(splits=[
                example_gen_pb2.Input.Split(name=INPUT_SPLIT_NAME, pattern="*")]))
        props[GRANTED_FILES_KEY] = files
        super().Do(input_dict, output_dict, props)

        for examples in output_dict[spec.EXAMPLES_KEY]:
            examples.set_string_custom_property(spec.GRANT_ID_PROPERTY, recorded.grant_id)
            examples.set_string_custom_property(spec.STREAM_PROPERTY, recorded.stream)
            examples.set_string_custom_property(spec.RUN_ID_PROPERTY, recorded.run_id)
            examples.set_string_custom_property(spec.BLOCK_IDS_PROPERTY,
                                                json.dumps(list(recorded.block_ids)))
            examples.set_int_custom_property(spec.NUM_BLOCKS_PROPERTY, len(recorded.blocks))
