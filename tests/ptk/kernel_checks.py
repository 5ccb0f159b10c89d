"""Checks shared by the ptklib kernel tests: a recording noise source, the discrete Laplace
moments, the declared charge through the store's resolver, and the utility gap vs ε."""
import dp_accounting
import numpy as np
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk.abstraction import batches_of
from sage_tfx.ptk.registry import default_registry


class Recorder:
    """A noise source that records every call (kind, scale) and adds no noise."""

    def __init__(self):
        self.calls = []

    def discrete_laplace(self, v, scale):
        self.calls.append(("discrete_laplace", scale))
        return np.asarray(v)

    def noisy_max(self, scores, scale, *, monotonic=False):
        self.calls.append(("noisy_max", scale, monotonic))
        return int(np.argmax(scores))

    def scales(self, kind="discrete_laplace"):
        return [c[1] for c in self.calls if c[0] == kind]


def pure_charge(module: str, eps: float, config: dict):
    """The store's view of the kernel's declared charge at ``eps``; checks dp_accounting's PLD
    epsilon of the event agrees with ``eps``."""
    charge = default_registry().get(module.rsplit(".", 1)[-1]).charge(eps, config)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(charge.event)
    assert pld.get_epsilon(1e-9) == pytest.approx(eps, abs=0.03 * max(eps, 1))
    return charge


def check_discrete_laplace_draws(draws, true, scale, cells=1):
    """Mean and std of ``draws`` (each a sum of ``cells`` noisy cells) vs discrete Laplace."""
    var = cells * 2 * np.exp(-1 / scale) / (1 - np.exp(-1 / scale)) ** 2
    assert np.mean(draws) == pytest.approx(true, abs=4 * np.sqrt(var / len(draws)))
    assert np.std(draws) == pytest.approx(np.sqrt(var), rel=0.15)


def utility_gaps(kernel, config, train, test, epsilons, seeds=range(3)):
    """Mean eval loss of ``train_dp`` at each ε minus that of ``erm`` (the non-private PTK)."""
    ref = kernel.eval(batches_of(test), kernel.erm(batches_of(train), config=config),
                      config=config).mean()
    return [np.mean([kernel.eval(batches_of(test), kernel.train_dp(
        batches_of(train), eps, None, None, config=config, noise=SeededNoise(s)),
        config=config).mean() for s in seeds]) - ref for eps in epsilons]
