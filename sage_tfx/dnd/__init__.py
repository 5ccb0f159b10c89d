"""Draw-and-Discard machine learning (Pihur et al.): k model instances on a server, local-DP
updates.

``docs/papers.md`` (Draw and Discard). No TensorFlow at import. Modules:
:mod:`~sage_tfx.dnd.glm` (GLMs as flat vectors), :mod:`~sage_tfx.dnd.client` (Alg. 1 and the
privacy units), :mod:`~sage_tfx.dnd.noise` (the float-safe vector Gaussian sampler),
:mod:`~sage_tfx.dnd.laplace` (the float-safe vector Laplace sampler of the L1 units),
:mod:`~sage_tfx.dnd.state` (Alg. 2 and the paper's alternative strategies),
:mod:`~sage_tfx.dnd.spam` (the calibrated spam check), :mod:`~sage_tfx.dnd.budget` (ledger grants
and their enforcement), :mod:`~sage_tfx.dnd.theory` (Theorem 1, Lemmas 1–3, reported, never
charged), :mod:`~sage_tfx.dnd.server` (the HTTP service), :mod:`~sage_tfx.dnd.simulator`
(asyncio client load) and :mod:`~sage_tfx.dnd.eval`
(the paper's evaluation).
"""
from sage_tfx.dnd.client import ClientConfig, client_update
from sage_tfx.dnd.cost import cost
from sage_tfx.dnd.glm import FeatureBounds, GLMSpec
from sage_tfx.dnd.spam import SpamCheck, paper_rule
from sage_tfx.dnd.state import DnDState, initial_instances, stationary_variance

__all__ = ["ClientConfig", "client_update", "FeatureBounds", "GLMSpec", "SpamCheck", "paper_rule",
           "DnDState", "initial_instances", "stationary_variance"]
__all__ += ["cost"]
