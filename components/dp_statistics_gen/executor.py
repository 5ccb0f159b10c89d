"""DPStatisticsGen executor: DP feature statistics of every split, in StatisticsGen's layout.

Privacy. The statistics spend exactly the plan part ``plan_part`` (default ``statistics``),
which the gate charged with the run's other parts (``privacy.part_budget``): every declared
feature's counts, histogram, sums and vocabulary are released once per split by the mechanisms
of :mod:`sage_tfx.dp.feature_statistics`, at shares of the part that never add up to more than
it. Splits are disjoint (BlockExampleGen's per-record hash partition; the Examples must record
this grant), so every split is released at the whole part (parallel composition).

Everything written (``Split-<name>/FeatureStats.pb``, ``dp_statistics.json``, properties, logs)
is a post-processing of that release. Exact aggregates exist only inside the Beam job and this
executor's memory, until the noise is added.

Released once. The artifact's tree is recorded against the grant under
``part_release_name(plan_part, "statistics")`` with the run's request (the configuration, ε, δ
and the splits) before it is published (``release_io.release_artifact_once``, which claims the
part for DPStatisticsGen). A retried or re-run execution under the same grant materializes the
recorded tree byte for byte without reading an example or drawing noise (``replayed`` = 1);
other statistics under the same grant (another configuration, other splits) are refused with
``ReleaseConflictError`` and nothing is published.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List

from absl import logging
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils
from tfx.utils import json_utils

from sage_tfx.components import artifacts, plan_io, release_io
from sage_tfx.components.block_example_gen.executor import verify_grant
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dp_statistics_gen import privacy, spec, stats_proto
from sage_tfx.components.dp_statistics_gen.beam_flow import aggregate_splits
from sage_tfx.components.dp_validator.data import eval_files
from sage_tfx.dp import feature_statistics_release as release_lib
from sage_tfx.dp.feature_statistics import StatisticsConfig
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import open_ledger, releases

COMPONENT = "DPStatisticsGen"
RELEASE_OUTPUT = "statistics"


def config_from_exec_properties(exec_properties: Dict[str, Any]) -> StatisticsConfig:
    """The declared features and post-processing parameters.

    Raises:
      InvalidRequestError, InvalidPrivacyParameterError: a malformed configuration.
    """
    text = exec_properties.get(spec.FEATURES_JSON_KEY)
    if not isinstance(text, str):
        raise InvalidRequestError(f"{spec.FEATURES_JSON_KEY} must be the JSON of a "
                                  f"StatisticsConfig, got {text!r}")
    return StatisticsConfig.from_json(text)


def plan_part_name(exec_properties: Dict[str, Any]) -> str:
    name = exec_properties.get(spec.PLAN_PART_KEY) or spec.DEFAULT_PLAN_PART
    releases.check_release_name(releases.part_release_name(name, RELEASE_OUTPUT))
    return name


def split_names(examples: types.Artifact, exec_properties: Dict[str, Any]) -> List[str]:
    """The splits of ``examples`` to describe: all but ``exclude_splits`` (StatisticsGen's rule).

    Raises:
      ValueError: a malformed exclude_splits, or no split left.
    """
    exclude = json_utils.loads(exec_properties.get(spec.EXCLUDE_SPLITS_KEY) or "null") or []
    if not isinstance(exclude, list):
        raise ValueError(f"exclude_splits must be a JSON list, got {exclude!r}")
    names = [s for s in artifact_utils.decode_split_names(examples.split_names)
             if s not in exclude]
    if not names:
        raise ValueError(f"no splits left in the Examples artifact {examples.uri} (excluded: "
                         f"{exclude})")
    return names


def split_files(examples: types.Artifact, split: str) -> List[str]:
    """The gzip tf.Example TFRecord files of one split (ValueError for another layout)."""
    return eval_files(examples, split, component=COMPONENT)


def check_examples_grant(examples: types.Artifact, grant_id: str) -> None:
    """Requires Examples read under this grant (BlockExampleGen's): their splits partition the
    granted records, which is what lets every split spend the whole part.

    Raises:
      MissingGrantError: Examples that record no grant, or another one.
    """
    recorded = (examples.get_string_custom_property(EXAMPLES_GRANT_ID)
                if examples.has_custom_property(EXAMPLES_GRANT_ID) else "")
    if recorded != grant_id:
        raise MissingGrantError(
            f"the Examples ({examples.uri}) record grant {recorded!r}, not {grant_id!r}: "
            f"{COMPONENT} describes Examples that BlockExampleGen read under the grant whose "
            "plan pays for the statistics (their splits are disjoint, so each split is released "
            "at the whole part)")


def release_request(config: StatisticsConfig, part: str, epsilon: float, delta: float,
                    splits: List[str]) -> dict:
    """What a DPStatisticsGen run asks, recorded with its release (the examples themselves are
    fixed by the grant)."""
    return {"component": COMPONENT, "plan_part": part, "config": config.to_dict(),
            "epsilon": epsilon, "delta": delta, "splits": splits}


def write_statistics(out_dir: str, config: StatisticsConfig, epsilon: float, delta: float,
                     aggregates: Dict[str, tuple]) -> Dict[str, release_lib.SplitStatistics]:
    """Draws every split's release (OpenDP noise, never seeded) and writes it in
    StatisticsGen's layout plus ``dp_statistics.json``; returns the post-processed statistics."""
    budget = config.budget(epsilon, delta)
    out = {}
    for split, (totals, vocabularies) in aggregates.items():
        noisy = release_lib.release(config, budget, totals, vocabularies)
        summary = release_lib.summarize(config, budget, noisy)
        folder = os.path.join(out_dir, f"Split-{split}")  # artifact_utils.get_split_uri's
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, spec.STATS_FILE_NAME), "wb") as f:
            f.write(stats_proto.to_proto(summary).SerializeToString(deterministic=True))
        out[split] = summary
    with open(os.path.join(out_dir, spec.DP_FILE_NAME), "w") as f:
        f.write(json.dumps({"config": config.to_dict(), "budget_per_split": budget.to_dict(),
                            "splits": list(aggregates)}, sort_keys=True, indent=2))
    return out


class Executor(base_beam_executor.BaseBeamExecutor):
    """Computes DP statistics of every split at the plan part's (ε, δ)."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Reads the plan, aggregates every split with Beam, releases the DP statistics once.

        Args:
          input_dict: ``examples`` (Examples read by BlockExampleGen under the grant) and
            ``grant`` (SageGrant); one artifact each.
          output_dict: ``statistics``: a list of one ExampleStatistics artifact.
          exec_properties: the keys of ``sage_tfx.components.dp_statistics_gen.spec``.

        Raises:
          MissingGrantError: no grant, a denial, no plan, no such part, a part that cannot pay
            for the configuration, Examples of another grant, or a grant the ledger does not
            confirm. Raised before any example is read.
          ReleaseConflictError: the grant already released other statistics under the part.
          ValueError: a bad configuration or Examples layout.
        """
        self._log_startup(input_dict, output_dict, exec_properties)
        statistics = artifact_utils.get_single_instance(output_dict[spec.STATISTICS_KEY])
        examples = artifact_utils.get_single_instance(input_dict[spec.EXAMPLES_KEY])
        grant_artifact = artifact_utils.get_single_instance(input_dict[spec.GRANT_INPUT_KEY])
        config = config_from_exec_properties(exec_properties)
        part = plan_part_name(exec_properties)
        plan = plan_io.read_plan(grant_artifact)
        grant = artifacts.read_grant(grant_artifact)
        epsilon, delta = privacy.part_budget(plan, part, config)
        check_examples_grant(examples, grant.grant_id)
        splits = split_names(examples, exec_properties)
        files = {split: split_files(examples, split) for split in splits}
        url = release_io.ledger_url_for(grant_artifact, exec_properties.get(spec.LEDGER_URL_KEY),
                                        component=COMPONENT)
        request = release_request(config, part, epsilon, delta, splits)

        def produce_into(staging: str) -> None:
            with tempfile.TemporaryDirectory(prefix="sage-dpstats-") as scratch:
                aggregates = aggregate_splits(self._make_beam_pipeline, config, files, scratch)
            write_statistics(staging, config, epsilon, delta, aggregates)

        with open_ledger(url) as ledger:
            grant = verify_grant(grant, ledger, ledger.redacted_url)
            release_io.release_artifact_once(
                ledger, grant.grant_id, releases.part_release_name(part, RELEASE_OUTPUT),
                statistics, produce_into, request=request, component=COMPONENT, part=part)
        statistics.split_names = artifact_utils.encode_split_names(splits)
        statistics.span = examples.span
        statistics.set_string_custom_property(spec.GRANT_ID_PROPERTY, grant.grant_id)
        statistics.set_string_custom_property(spec.PLAN_PART_PROPERTY, part)
        statistics.set_float_custom_property(spec.EPSILON_PROPERTY, epsilon)
        statistics.set_float_custom_property(spec.DELTA_PROPERTY, delta)
        logging.info("%s: DP statistics of splits %s under grant %s (part %r: epsilon=%s, "
                     "delta=%s per split) written to %s", COMPONENT, splits, grant.grant_id,
                     part, epsilon, delta, statistics.uri)
