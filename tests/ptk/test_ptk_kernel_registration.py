"""The store registers every ptklib kernel of Tab. 1 rows 1-3 through register_ptk (its declared
event checked against dp_accounting for each menu ε), trains it on a window under a ledger grant
and stores a state the kernel's featurizer reads back from the lake."""
import numpy as np
import pytest

from ptk_data import SMALL
from test_ptk_counts_kernel import CFG as COUNTS_CFG, data as counts_data
from test_ptk_hpf_kernel import CFG as HPF_CFG, data as hpf_data
from test_ptk_trees_kernel import CFG as TREES_CFG, data as trees_data

KERNELS = [("sage_tfx.ptk.kernels.counts", COUNTS_CFG, counts_data),
           ("sage_tfx.ptk.kernels.trees", TREES_CFG, trees_data),
           ("sage_tfx.ptk.kernels.hpf", HPF_CFG, hpf_data)]


def with_users(cols, seed):
    n = len(cols["y"])
    return dict(cols, user=np.array([f"u{seed}-{i}" for i in range(n)]))


@pytest.mark.parametrize("module,config,make", KERNELS,
                         ids=[k[0].rsplit(".", 1)[1] for k in KERNELS])
def test_the_store_registers_and_trains_the_kernel(make_store, module, config, make):
    import importlib
    store = make_store(config=SMALL)
    store.advance_window(with_users(make(3000, 0), 0), user_key="user")
    pid = store.register_ptk(module.rsplit(".", 1)[-1], 1, config=config, tau=0.5,
                             menu=[(0.5, 1000), (1.0, 500)])
    assert isinstance(pid, str) and pid.startswith("ptk-"), pid
    out = store.advance_window(with_users(make(3000, 1), 1), user_key="user")
    assert [t.ptk_id for t in out.trained] == [pid]
    ptk = store.get_ptk(pid)
    assert ptk.version == 1 and ptk.model_state is not None
    feats = importlib.import_module(module).featurize(make(5, 2), ptk.model_state, config)
    assert feats and all(len(v) == 5 for v in feats.values())


@pytest.mark.parametrize("module,config,make", KERNELS,
                         ids=[k[0].rsplit(".", 1)[1] for k in KERNELS])
def test_default_noise_is_opendp_and_the_state_is_json(module, config, make):
    import importlib
    import json

    from sage_tfx.ptk.abstraction import batches_of
    kernel = importlib.import_module(module)
    state = kernel.train_dp(batches_of(make(400, 3)), 1.0, None, None, config=config)
    json.dumps(state)
    losses = kernel.eval(batches_of(make(100, 4)), state, config=config)
    assert losses.size and losses.min() >= 0 and losses.max() <= 1
