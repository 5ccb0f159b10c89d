"""Fixtures of the component tests: block storage (see blockdata.py) and a SQLite ledger."""
import datetime

import pytest

from blockdata import DAY_BLOCKS, RECORDS_PER_BLOCK, STREAM, make_example, write_block_file
from sage_tfx.streams.blocks import block_location


@pytest.fixture
def block_ledger(tmp_path):
    """A SQLite ledger with stream ``events`` (basic, ε_g = 1, δ_g = 1e-5) of 4 day blocks.

    Each block holds RECORDS_PER_BLOCK records with features ``block`` (its block id), ``i`` and
    ``x``, in two part files (so a block is more than one file).
    Returns (ledger url, {block_id: location}).
    """
    from sage_tfx.ledger import BlockSpec, open_ledger
    url = f"sqlite:///{tmp_path}/ledger.db"
    root = str(tmp_path / "blocks")
    locations = {}
    specs = []
    for day in DAY_BLOCKS:
        loc = block_location(root, STREAM, day)
        exs = [make_example({"block": day, "i": i, "x": float(i) / 7.0})
               for i in range(RECORDS_PER_BLOCK)]
        half = RECORDS_PER_BLOCK // 2
        write_block_file(loc, exs[:half], "part-00000-of-00002.tfrecord.gz")
        write_block_file(loc, exs[half:], "part-00001-of-00002.tfrecord.gz")
        locations[day] = loc
        start = datetime.date.fromisoformat(day)
        specs.append(BlockSpec(day, loc, f"{start}T00:00:00+00:00",
                               f"{start + datetime.timedelta(days=1)}T00:00:00+00:00",
                               RECORDS_PER_BLOCK))
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-5, granularity="day")
        ledger.add_blocks(STREAM, specs)
    return url, locations
