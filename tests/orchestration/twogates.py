"""A pipeline of two SageGates (issue 23): each gate is its own ledger request, on every
orchestrator.

Both gates ask for the same window at the same ε, so a pipeline run must charge each granted block
twice; two gates that derived one run id would replay one grant and charge once. The gates read
no data, so the blocks are ledger entries only (no files).
"""
import json
import os

STREAM = "events"
BLOCKS = ("b0", "b1", "b2")
WINDOW = 2                 # each gate asks for the 2 most recent blocks with budget left
GATE_EPSILON = 0.25        # per gate; a run charges each granted block 2 × 0.25
GATE_IDS = ("GateA", "GateB")


def make_ledger(root, ledger_url=None):
    """A ledger with STREAM (ε_g = 1) and its BLOCKS; returns its URL."""
    from sage_tfx.ledger import BlockSpec, open_ledger
    url = ledger_url or f"sqlite:///{root}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-5)
        ledger.add_blocks(STREAM, [BlockSpec(b, os.path.join(str(root), "blocks", b))
                                   for b in BLOCKS])
    return url


def create_pipeline(pipeline_name, pipeline_root, metadata_path, ledger_url):
    """GateA and GateB, independent, each ``window_last=WINDOW`` at ``GATE_EPSILON``."""
    from tfx import v1 as tfx
    from sage_tfx.components.gate.component import SageGate

    gates = [SageGate(ledger_url=ledger_url, stream=STREAM, window_last=WINDOW,
                      epsilon=GATE_EPSILON).with_id(gate_id) for gate_id in GATE_IDS]
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, components=gates,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path))


def charged(ledger_url):
    """({block: (ε spent, charges)}, {run id: grant}, consistency problems) of STREAM."""
    from sage_tfx.ledger import open_ledger
    with open_ledger(ledger_url) as ledger:
        return ({b.block_id: (b.epsilon_spent, b.charges) for b in ledger.blocks(STREAM)},
                {g.run_id: g for g in ledger.grants(STREAM)}, ledger.check_consistency(STREAM))


def check_two_grants(ledger_url, pipeline_name, pipeline_run_id=None):
    """Asserts one grant per gate, each charged: the window's blocks spent 2 × GATE_EPSILON.

    The run ids are ``<pipeline>.<gate id>.<pipeline run id>``, one pipeline run id for both
    (``pipeline_run_id``, or whatever LocalDagRunner chose when None).
    """
    from sage_tfx.components.gate.executor import derive_run_id
    by_block, grants, problems = charged(ledger_url)
    if pipeline_run_id is None:
        prefix = derive_run_id(pipeline_name, GATE_IDS[0], "")
        pipeline_run_id = min(grants)[len(prefix):]
    expected = {derive_run_id(pipeline_name, g, pipeline_run_id) for g in GATE_IDS}
    assert set(grants) == expected, sorted(grants)
    assert len({g.grant_id for g in grants.values()}) == 2
    window = BLOCKS[-WINDOW:]
    assert all(g.block_ids == window and g.epsilon == GATE_EPSILON for g in grants.values())
    assert by_block == {b: ((2 * GATE_EPSILON, 2) if b in window else (0.0, 0)) for b in BLOCKS}
    assert problems == []


AIRFLOW_DAG = '''"""Airflow DAG of the two-gate test pipeline (tests/orchestration/twogates.py)."""
import json
import os

from sage_tfx.pipelines import orchestration
from twogates import create_pipeline

DAG = orchestration.airflow_dag(create_pipeline(**json.loads(os.environ["TWO_GATES_CONFIG"])))
'''


def airflow_env(pipeline_name, pipeline_root, metadata_path, ledger_url):
    """The environment the DAG file above reads its pipeline from."""
    return {"TWO_GATES_CONFIG": json.dumps(dict(
        pipeline_name=pipeline_name, pipeline_root=str(pipeline_root),
        metadata_path=str(metadata_path), ledger_url=ledger_url))}
