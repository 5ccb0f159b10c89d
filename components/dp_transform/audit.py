"""Audit of the tf.Transform analyzers a ``preprocessing_fn`` registers: DP, public, or refused.

Why: a stock tf.Transform analyzer (``tft.mean``, ``tft.vocabulary``, ``tft.scale_to_0_1``,
``tft.quantiles``, ...) bakes its *exact* result into the transform graph that ships with the
model, so noise added after it (e.g. to ``tft.sum``'s output) is not DP. ``DPTransform``
therefore inspects every trace of the ``preprocessing_fn`` — tf.Transform traces it several
times, each in a fresh graph, the first time before any data is read — and refuses the run unless
every analyzer is

* a **DP analyzer**: a release built by :mod:`sage_tfx.components.dp_transform.analyzers` — a
  ``tft.experimental.ptransform_analyzer`` whose PTransform is that module's noise-once release —
  whose name, ε and DpEvent match a charge on the run's budget in the same trace (so a
  hand-built release that skipped the budget is refused too), or
* **public**: every input feature its inputs depend on is declared in ``public_features``.

How analyzers are found: tf.Transform registers each analyzer output in the trace graph's
collections ``tft_all_replacements`` (TF2 tracing) / ``tft_tensor_replacements`` (TF1) as a
``TensorSink`` whose ``future`` is the root of the analyzer's node graph
(``TensorSource(tensors) -> CacheableCombineAccumulate -> ... -> Extract...``). The audit walks
that node graph to the ``TensorSource`` s, then walks the TF graph from their tensors up through
op inputs and control inputs, and attributes the analyzer to every input feature whose tensors
(``inputs[name]``, all components of a SparseTensor / RaggedTensor) it reaches. This is data
flow attribution, so masking, gathering or conditioning a public feature on a private one makes
the analyzer private too. An analyzer that reaches no input feature (e.g. over constants, or over
outputs of DP analyzers, which are post-processing) is allowed.

Declaring a feature public asserts that everything an exact analyzer over it reveals — its
values, and how many records carry it — may be released without DP.

Threat model: the audit catches the *mistake* of using a stock analyzer (the tf.Transform API is
the way a preprocessing_fn computes dataset-level values); it is not a sandbox. The module file
is trusted code, as in stock TFX: Python run while tracing could open data files itself and bake
constants, and a custom ``tft.experimental.ptransform_analyzer`` runs arbitrary Beam code (it is
attributed to the features of its tensor inputs like any other analyzer, so declare such inputs
public only if the PTransform reads nothing else).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import tensorflow as tf
from tensorflow_transform import analyzer_nodes

from sage_tfx.ledger import accounting
from sage_tfx.components.dp_transform import budget as budget_lib
from sage_tfx.components.dp_transform import privacy
from sage_tfx.components.dp_transform import vocabulary
from sage_tfx.errors import InvalidPrivacyParameterError, SageError

DP = "dp"
PUBLIC = "public"

# tft API name (a name-scope component of the analyzer) -> the DP analyzer to use instead. The
# drop-ins of ``sage_tfx.components.dp_transform.tft`` carry tft's names: the stock call with the
# privacy parameters named here.
_TFT = "sage_tfx.components.dp_transform.tft"
_DP_ALTERNATIVES = {
    "mean": "tft.mean(..., lower=, upper=) (dp_mean)",
    "mean_and_var": "tft.var(..., lower=, upper=) (dp_mean_and_var)",
    "var": "tft.var(..., lower=, upper=) (dp_var)",
    "scale_to_z_score": "tft.scale_to_z_score(..., lower=, upper=) (dp_scale_to_z_score)",
    "sum": "tft.sum(..., lower=, upper=) (dp_sum)",
    "size": "tft.size(...) (dp_count)",
    "count_per_key": "dp_group_by_count",
    "min": "tft.min(..., lower=, upper=) (dp_min_max)",
    "max": "tft.max(..., lower=, upper=) (dp_min_max)",
    "min_and_max": "dp_min_max",
    "scale_to_0_1": "tft.scale_to_0_1(..., lower=, upper=) (dp_scale_to_0_1)",
    "scale_by_min_max": "dp_scale_to_0_1",
    "quantiles": "tft.quantiles(..., lower=, upper=) (dp_quantiles)",
    "bucketize": "tft.bucketize(..., lower=, upper=) (dp_bucketize)",
    "histogram": "dp_histogram",
    "vocabulary": "tft.vocabulary(...) (dp_vocabulary: DP partition selection)",
    "compute_and_apply_vocabulary": "tft.compute_and_apply_vocabulary(...) "
                                    "(dp_compute_and_apply_vocabulary: DP partition selection)",
}


class NonDPAnalyzerError(SageError, ValueError):
    """The preprocessing_fn uses a tf.Transform analyzer that is not DP on non-public features."""


@dataclasses.dataclass(frozen=True)
class AnalyzerUse:
    """One analyzer of a trace: its name, ``dp`` or ``public``, the input features it reads.

    ``features`` is empty for DP analyzers (they may read any feature) and lists the (public)
    features a public analyzer depends on.
    """

    name: str
    kind: str
    features: tuple[str, ...] = ()
    operations: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "features": list(self.features),
                "operations": list(self.operations)}


def bind_epsilon(preprocessing_fn: Callable[..., Any], epsilon: float,
                 delta: Optional[float] = None) -> Callable[..., Any]:
    """Binds ``epsilon`` (and ``delta``) if the function takes them (List. 1:
    ``preprocessing_fn(inputs, epsilon)``; a function with DP vocabularies may take ``delta``).
    """
    try:
        parameters = inspect.signature(preprocessing_fn).parameters
    except (TypeError, ValueError):
        return preprocessing_fn
    bound = {}
    if "epsilon" in parameters:
        bound["epsilon"] = epsilon
    if "delta" in parameters and delta is not None:
        bound["delta"] = delta
    return functools.partial(preprocessing_fn, **bound) if bound else preprocessing_fn


def _label_scope(label: str) -> str:
    """E.g. ``CacheableCombineMerge[scale_to_z_score#mean_and_var]`` -> its scope with ``/``."""
    if "[" in label and label.endswith("]"):
        label = label[label.index("[") + 1:-1]
    return label.replace("#", "/")


def _ancestors(ops: Iterable[tf.Operation]) -> set:
    """Every op the given ops depend on (data and control inputs), themselves included."""
    seen: set = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def feature_sources(inputs: Mapping[str, Any]) -> dict:
    """Maps every op an input feature's tensors come from to the feature name(s)."""
    sources: dict = {}
    for name, value in inputs.items():
        ops = []
        for tensor in tf.nest.flatten(value, expand_composites=True):
            op = getattr(tensor, "op", None)
            if op is not None:
                ops.append(op)
        for op in _ancestors(ops):
            sources.setdefault(op, set()).add(name)
    return sources


def replacement_sinks(graph: Any) -> list:
    """The analyzer outputs (``TensorSink`` s) registered in a trace graph, once each."""
    sinks, seen = [], set()
    for key in (analyzer_nodes.ALL_REPLACEMENTS, analyzer_nodes.TENSOR_REPLACEMENTS):
        for sink in graph.get_collection(key):
            if id(sink) not in seen:
                seen.add(id(sink))
                sinks.append(sink)
    return sinks


def _operation_nodes(value_node: Any) -> list:
    """The analyzer's node graph above one output (OperationNodes, each once)."""
    out, seen, stack = [], set(), [value_node.parent_operation]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        out.append(node)
        stack.extend(v.parent_operation for v in node.inputs)
    return out


def _dp_release(sink: Any, nodes: Sequence[Any]) -> Optional[Any]:
    """The DP analyzers' release PTransform if the sink is exactly one (TensorSource -> it)."""
    head = sink.future.parent_operation.operation_def
    if not (isinstance(head, analyzer_nodes.PTransform)
            and isinstance(head.ptransform, vocabulary.DP_RELEASE_TYPES)):
        return None
    for node in nodes:
        if node.operation_def is not head and not isinstance(node.operation_def,
                                                              analyzer_nodes.TensorSource):
            return None
    return head.ptransform


def _hint(name: str) -> str:
    """The DP analyzer replacing the outermost tft API in the analyzer's name scope."""
    for part in name.split("/"):
        if part in _DP_ALTERNATIVES:
            return _DP_ALTERNATIVES[part]
    return "a DP analyzer"


def audit_sinks(sinks: Sequence[Any], sources: Mapping[Any, set], public_features: Iterable[str],
                spends: Sequence[budget_lib.DPSpend]) -> tuple[AnalyzerUse, ...]:
    """Classifies the analyzers of one trace; raises on any that is neither DP nor public.

    Args:
      sinks: the trace's new ``TensorSink`` s (:func:`replacement_sinks`).
      sources: :func:`feature_sources` of the trace's inputs.
      public_features: the features declared public.
      spends: the budget's spends in this trace.

    Returns:
      One :class:`AnalyzerUse` per analyzer, in registration order.

    Raises:
      NonDPAnalyzerError: an analyzer reads a feature that is not public and is not a DP
        analyzer; or a DP release that was not charged to the budget (or charged differently).
    """
    public = frozenset(public_features)
    uses: dict[str, AnalyzerUse] = {}
    refused: dict[str, AnalyzerUse] = {}
    releases: dict[str, Any] = {}
    for sink in sinks:
        nodes = _operation_nodes(sink.future)
        release = _dp_release(sink, nodes)
        if release is not None:
            name = release._name  # pylint: disable=protected-access
            releases[name] = release
            uses.setdefault(name, AnalyzerUse(name, DP, (), ("PTransform",)))
            continue
        source_defs = [n.operation_def for n in nodes
                       if isinstance(n.operation_def, analyzer_nodes.TensorSource)]
        name = (_label_scope(source_defs[0].label) if source_defs
                else _label_scope(sink.future.parent_operation.operation_def.label))
        tensors = [t for d in source_defs for t in d.tensors]
        features: set = set()
        for op in _ancestors(t.op for t in tensors):
            features |= sources.get(op, set())
        operations = tuple(sorted({type(n.operation_def).__name__ for n in nodes
                                   if not isinstance(n.operation_def,
                                                     analyzer_nodes.TensorSource)}))
        previous = refused.get(name) or uses.get(name)
        if previous is not None:  # several outputs of one analyzer: merge
            features |= set(previous.features)
            operations = tuple(sorted(set(operations) | set(previous.operations)))
        use = AnalyzerUse(name, PUBLIC, tuple(sorted(features)), operations)
        if features - public:
            refused[name] = use
            uses.pop(name, None)
        else:
            uses[name] = use
    if refused:
        lines = []
        for use in refused.values():
            private = sorted(set(use.features) - public)
            lines.append(f"  - {use.name!r} (tf.Transform {', '.join(use.operations)}) reads "
                         f"feature(s) {private} which are not declared public; DP instead: "
                         f"{_hint(use.name)}")
        needed = sorted({f for use in refused.values() for f in use.features} - public)
        raise NonDPAnalyzerError(
            f"DPTransform refuses {len(refused)} non-DP tf.Transform analyzer(s):\n"
            + "\n".join(lines)
            + "\nA stock tf.Transform analyzer bakes its exact result into the transform graph, "
            "which is not differentially private. Fix: compute the statistic with a DP analyzer, "
            f"which spends the grant's transform epsilon: `from {_TFT.rsplit('.', 1)[0]} import "
            "tft` in place of `import tensorflow_transform as tft` gives tft's analyzers DP "
            "versions under their own names (with the parameters above), and "
            "sage_tfx.components.dp_transform.analyzers has the dp_* analyzers (dp_mean, dp_sum, "
            "dp_count, dp_min_max, dp_scale_to_0_1, dp_quantiles, dp_histogram, "
            "dp_group_by_*, dp_vocabulary, dp_scale_to_z_score, dp_bucketize); or, only if the "
            "feature's values may be released exactly, declare it public: "
            f"DPTransform(..., public_features={needed}).")
    _check_releases_charged(releases, spends)
    return tuple(uses.values())


def _check_releases_charged(releases: Mapping[str, Any],
                            spends: Sequence[budget_lib.DPSpend]) -> None:
    charged = {s.name: s for s in spends}
    uncharged = sorted(set(releases) - set(charged))
    unreleased = sorted(set(charged) - set(releases))
    if uncharged or unreleased:
        raise NonDPAnalyzerError(
            f"DP releases and budget charges of this trace differ: released without a charge "
            f"{uncharged}, charged without a release {unreleased}. Build DP statistics only "
            "with the analyzers of sage_tfx.components.dp_transform.analyzers")
    for name, release in releases.items():
        query = release._query  # pylint: disable=protected-access
        spend = charged[name]
        runs_delta = getattr(query, "delta", 0.0)
        if (accounting.exact(query.epsilon) != accounting.exact(spend.epsilon)
                or accounting.exact(runs_delta) != accounting.exact(spend.delta)
                or accounting.event_to_json(query.dp_event())
                != accounting.event_to_json(spend.event)):
            raise NonDPAnalyzerError(
                f"DP release {name!r} runs epsilon={query.epsilon!r}, delta={runs_delta!r} "
                f"({accounting.event_to_json(query.dp_event())}) but charged "
                f"epsilon={spend.epsilon!r}, delta={spend.delta!r} "
                f"({accounting.event_to_json(spend.event)})")


class AuditedPreprocessingFn:
    """The user's ``preprocessing_fn`` with every trace audited; run it inside DPPreprocessingFn.

    Per trace: maps ``inputs`` to features, calls the user function, audits the analyzers it
    registered (:func:`audit_sinks`) and, for an rdp plan, checks that the trace's DP releases
    compose exactly the planned Laplace mechanisms. Everything is checked while tracing, so a
    refused ``preprocessing_fn`` fails in tf.Transform's first trace, before any data is read
    and before anything is written.

    Attributes:
      analyzer_uses: the analyzers of the latest trace in this process.
    """

    def __init__(self, preprocessing_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]], *,
                 public_features: Iterable[str] = (),
                 planned_event_json: Optional[str] = None) -> None:
        self.preprocessing_fn = preprocessing_fn
        self.public_features = frozenset(public_features)
        self.planned_event_json = planned_event_json
        self.analyzer_uses: tuple[AnalyzerUse, ...] = ()

    def __call__(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        graph = tf.compat.v1.get_default_graph()
        budget = budget_lib.active_budget()
        sources = feature_sources(inputs)
        before = {id(s) for s in replacement_sinks(graph)}
        outputs = self.preprocessing_fn(inputs)
        new = [s for s in replacement_sinks(graph) if id(s) not in before]
        spends = budget.trace_spends(graph)
        self.analyzer_uses = audit_sinks(new, sources, self.public_features, spends)
        if self.planned_event_json is not None:
            planned = accounting.event_from_json(self.planned_event_json)
            import dp_accounting
            spent = (dp_accounting.ComposedDpEvent([s.event for s in spends]) if spends
                     else dp_accounting.NoOpDpEvent())
            if not privacy.events_match(spent, planned):
                raise InvalidPrivacyParameterError(
                    "the preprocessing_fn's DP analyzers run other Laplace mechanisms than the "
                    f"plan's transform part: spent {accounting.event_to_json(spent)}, planned "
                    f"{self.planned_event_json}. In rdp mode the transform part must be the "
                    "composition of exactly the analyzers' events (compute it with "
                    "sage_tfx.components.dp_transform.privacy.trace_dp_event)")
        return outputs


def uses_to_json(uses: Iterable[AnalyzerUse]) -> str:
    return json.dumps([u.to_dict() for u in uses], sort_keys=True)
