"""Runs one DPTransform or DPModelValidator ``Do()`` from a JSON spec, in this process or as
``python release_driver.py SPEC_JSON`` in a new one (the replay tests' retried pods).

Every run builds its own artifact objects (a SageGrant written into its own directory, as an
orchestrator hands each pod its inputs) over shared read-only examples, schema and model, and
returns what it published: the ``replayed`` property of each output and the digest of each
output directory.
"""
import json
import os
import sys


def _grant_artifact(spec, root):
    from sage_tfx.adaptive.plan import PrivacyPlan
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.ledger import Grant
    grant = Grant.from_json(spec["grant"])
    art = artifacts.SageGrant()
    art.uri = os.path.join(root, "grant")
    artifacts.write_grant(art, grant, stream=grant.stream, run_id=grant.run_id,
                          context=grant.context, ledger_url=spec["ledger_url"])
    plan_io.write_plan(art, PrivacyPlan.from_json(spec["plan"]))
    return art, grant


def _examples(spec, grant_id):
    from tfx.types import artifact_utils, standard_artifacts
    ex = standard_artifacts.Examples()
    ex.uri = spec["examples_uri"]
    ex.split_names = artifact_utils.encode_split_names(["train", "eval"])
    ex.set_string_custom_property("grant_id", grant_id)
    return ex


def _digest(uri):
    from sage_tfx.ledger.releases import tree_digest
    return tree_digest(uri)


def run_transform(spec, root, grant_art, grant):
    from tfx.types import standard_artifacts
    from sage_tfx.components.dp_transform import executor, spec as keys
    schema = standard_artifacts.Schema()
    schema.uri = spec["schema_uri"]
    graph = standard_artifacts.TransformGraph()
    graph.uri = os.path.join(root, "transform_graph")
    transformed = standard_artifacts.Examples()
    transformed.uri = os.path.join(root, "transformed_examples")
    for uri in (graph.uri, transformed.uri):
        os.makedirs(uri, exist_ok=True)
    executor.Executor().Do(
        {keys.EXAMPLES_KEY: [_examples(spec, grant.grant_id)], keys.SCHEMA_KEY: [schema],
         keys.GRANT_INPUT_KEY: [grant_art]},
        {keys.TRANSFORM_GRAPH_KEY: [graph], keys.TRANSFORMED_EXAMPLES_KEY: [transformed]},
        {keys.MODULE_FILE_KEY: spec["module_file"],
         keys.PUBLIC_FEATURES_KEY: json.dumps(spec.get("public_features", []))})
    return {"replayed": [graph.get_int_custom_property("replayed"),
                         transformed.get_int_custom_property("replayed")],
            "graph": _digest(graph.uri), "transformed": _digest(transformed.uri),
            "graph_uri": graph.uri, "transformed_uri": transformed.uri,
            "epsilon_spent": graph.get_float_custom_property("dp_epsilon_spent")}


def run_validator(spec, root, grant_art, grant):
    from tfx.types import standard_artifacts
    from sage_tfx.components.dp_validator import executor, spec as keys
    model = standard_artifacts.Model()
    model.uri = spec["model_uri"]
    # The trainer's record of the grant (a Sage trainer writes it once it verified what ran).
    model.set_string_custom_property(keys.GRANT_ID_PROPERTY, grant.grant_id)
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = os.path.join(root, "blessing")
    props = {keys.METRIC_KEY: "loss", keys.LOSS_FN_KEY: "squared_error",
             keys.TARGET_KEY: spec.get("target", 0.1), keys.LOSS_BOUND_KEY: 1.0,
             keys.ETA_KEY: 0.05, keys.LABEL_KEY: "y", keys.PREDICTION_KEY: None,
             keys.EVAL_SPLIT_KEY: "eval", keys.SIGNATURE_NAME_KEY: "serving_default",
             keys.BATCH_SIZE_KEY: 256}
    executor.Executor().Do(
        {keys.EXAMPLES_KEY: [_examples(spec, grant.grant_id)], keys.MODEL_KEY: [model],
         keys.GRANT_INPUT_KEY: [grant_art]},
        {keys.BLESSING_KEY: [blessing]}, props)
    return {"replayed": [blessing.get_int_custom_property("replayed")],
            "blessing": _digest(blessing.uri), "blessing_uri": blessing.uri,
            "outcome": blessing.get_string_custom_property("outcome")}


def run(spec):
    """Runs the spec's component under its grant into ``spec["out"]``; returns what it wrote."""
    root = spec["out"]
    os.makedirs(root, exist_ok=True)
    grant_art, grant = _grant_artifact(spec, root)
    fn = run_transform if spec["component"] == "transform" else run_validator
    return fn(spec, root, grant_art, grant)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    result = run(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
