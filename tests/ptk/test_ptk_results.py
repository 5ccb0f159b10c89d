"""The PTK store's results are frozen dataclasses whose JSON form keeps the keys clients read."""
import dataclasses
import json

import pytest

from sage_tfx.ptk.allocator import Allocation, Option, allocate
from sage_tfx.ptk.results import Delivery, Lineage, PTKVersion, Trained, WindowResult, plain


def test_window_result_json_keeps_the_wire_keys_and_is_frozen():
    done = Trained("ptk-a", 2, 512, 500, 0.25, "g1")
    skipped = Trained("ptk-b", skipped="denied: no budget")
    res = WindowResult(3, [done, skipped], [Delivery("ptk-a", 2, "http://x/cb", "pending", "e")])
    assert isinstance(res.trained, tuple) and done.trained and not skipped.trained
    assert json.loads(json.dumps(res.to_dict())) == {
        "window": 3,
        "trained": [{"ptk_id": "ptk-a", "version": 2, "n_used": 512, "n": 500, "epsilon": 0.25,
                     "grant_id": "g1"},
                    {"ptk_id": "ptk-b", "skipped": "denied: no budget"}],
        "delivered": [{"ptk_id": "ptk-a", "version": 2, "endpoint": "http://x/cb",
                       "status": "pending", "error": "e"}]}
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.window = 4


def test_lineage_is_the_version_without_its_state():
    row = {"ptk_id": "ptk-a", "version": 1, "window_index": 1, "blocks": ["w1.t0"],
           "epsilon": 0.5, "delta": 0.0, "event": "E", "grant_id": "g", "run_id": "r",
           "stream": "s", "n_used": 9, "partition_index": 0, "oldest_window": 1,
           "newest_window": 1, "state": {"means": [1.0]}, "config": {}, "created_at": "t"}
    v = PTKVersion.from_row(row)
    lin = Lineage.from_row(vars(v))
    assert v.blocks == ("w1.t0",) and set(lin.to_dict()) == set(row) - {"state", "config",
                                                                        "created_at"}
    assert lin.to_dict()["blocks"] == ["w1.t0"] and plain([lin])[0] == lin.to_dict()


def test_a_stored_plan_reads_back_as_the_same_allocation():
    plan = allocate({"a": [Option(0.5, 0.0, 100)], "b": [Option(0.5, 0.0, 50)],
                     "c": [Option(0.6, 0.0, 10)]}, epsilon_g=1.0, n_max=10**6, k_max=4)
    stored = json.loads(json.dumps(plan.to_dict()))
    back = Allocation.from_dict(stored)
    assert back == plan and back.to_dict() == stored and back.k_max == 4
    assert back.assignment("c")[1].n == 10
