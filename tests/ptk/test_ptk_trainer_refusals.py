"""PTKTrainer's executor refuses every grant that is not exactly what the PTK spends, before
reading data, and leaves the lake unchanged (the success path is in test_ptk_pipeline_e2e)."""
import json
import os

import pytest

from ptk_data import HS, HS_CONFIG

pytestmark = pytest.mark.slow
STREAM = "events"


@pytest.fixture
def setup(tmp_path):
    from sage_tfx.ledger import BlockSpec, open_ledger
    from sage_tfx.ptk import PTKStore, StoreConfig

    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-6, granularity="day")
        ledger.add_blocks(STREAM, [BlockSpec(d, location=str(tmp_path / d), records=10)
                                   for d in ("d1", "d2")])
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2,
                             menu=[(0.5, 200)])
    store.close()
    return url, pid, tmp_path


def _run(url, pid, tmp_path, grant, *, examples_grant_id=None):
    from tfx.types import standard_artifacts

    from sage_tfx.components.artifacts import SageGrant, write_grant
    from sage_tfx.components.gate.spec import GRANT_KEY
    from sage_tfx.components.ptk_trainer import executor, spec

    g = SageGrant()
    g.uri = str(tmp_path / "grant")
    write_grant(g, grant, stream=STREAM, run_id=grant.run_id, context="default", ledger_url=url)
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    examples.split_names = '["train"]'
    examples.set_string_custom_property("grant_id", examples_grant_id or grant.grant_id)
    state = spec.PTKState()
    state.uri = str(tmp_path / "state")
    executor.Executor().Do(
        {spec.EXAMPLES_KEY: [examples], GRANT_KEY: [g]}, {spec.PTK_STATE_KEY: [state]},
        {spec.LEDGER_URL_KEY: url, spec.PTK_ID_KEY: pid, spec.WINDOW_INDEX_KEY: 0})


def _versions(url, pid):
    from sage_tfx.ptk.lake import Lake
    lake = Lake(url)
    try:
        return lake.version(pid)
    finally:
        lake.close()


def test_a_grant_charging_other_than_the_ptk_spends_is_refused(setup):
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import open_ledger

    url, pid, tmp_path = setup
    with open_ledger(url) as ledger:   # histstats at eps 0.5 spends (0.5, 0): delta 1e-7 differs
        grant = ledger.request(STREAM, run_id="r-delta", blocks=["d1"], epsilon=0.5,
                               delta=1e-7).grant
    with pytest.raises(MissingGrantError, match="must charge exactly what the PTK spends"):
        _run(url, pid, tmp_path, grant)
    assert _versions(url, pid) is None
    assert not os.path.exists(tmp_path / "state" / "state.json")


def test_a_grant_the_ledger_did_not_issue_is_refused(setup):
    import dataclasses

    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import open_ledger

    url, pid, tmp_path = setup
    with open_ledger(url) as ledger:
        grant = ledger.request(STREAM, run_id="r-ok", blocks=["d1"], epsilon=0.5,
                               delta=0.0).grant
    forged = dataclasses.replace(grant, epsilon=0.25)   # the file says less than was charged
    with pytest.raises(MissingGrantError, match="epsilon"):
        _run(url, pid, tmp_path, forged)
    unknown = dataclasses.replace(grant, grant_id="f" * 32)
    with pytest.raises(MissingGrantError, match="not in ledger"):
        _run(url, pid, tmp_path, unknown)
    assert _versions(url, pid) is None


def test_examples_read_under_another_grant_are_refused(setup):
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import open_ledger

    url, pid, tmp_path = setup
    with open_ledger(url) as ledger:
        grant = ledger.request(STREAM, run_id="r-ok", blocks=["d2"], epsilon=0.5,
                               delta=0.0).grant
    with pytest.raises(MissingGrantError, match="not read under this grant"):
        _run(url, pid, tmp_path, grant, examples_grant_id="0" * 32)
    assert _versions(url, pid) is None
    with open_ledger(url) as ledger:
        assert json.dumps(sorted(b.epsilon_spent for b in ledger.blocks(STREAM))) == "[0.0, 0.5]"
