"""BlockExampleGen executor: Do() on generated blocks; only granted blocks ever reach Examples.

The blocks here are encrypted as the splitter writes them (each with its own data key, two part
files per block); one test reads a plaintext block of the layout before encryption.
"""
import collections
import dataclasses
import datetime
import glob
import json
import os

import pytest

from blockdata import (DAY_BLOCKS, RECORDS_PER_BLOCK, STREAM, feature_value, make_example,
                       read_examples, write_block_file, write_encrypted_block)

pytestmark = pytest.mark.slow


def _spec(day, loc, **key):
    from sage_tfx.ledger import BlockSpec
    start = datetime.date.fromisoformat(day)
    return BlockSpec(day, loc, f"{start}T00:00:00+00:00",
                     f"{start + datetime.timedelta(days=1)}T00:00:00+00:00", RECORDS_PER_BLOCK,
                     **key)


@pytest.fixture
def block_ledger(tmp_path):
    """As tests/components/conftest.py's fixture, but every block encrypted with its own key."""
    from sage_tfx.ledger import open_ledger
    from sage_tfx.streams.blocks import block_location
    url = f"sqlite:///{tmp_path}/ledger.db"
    locations, specs = {}, []
    for day in DAY_BLOCKS:
        loc = block_location(str(tmp_path / "blocks"), STREAM, day)
        exs = [make_example({"block": day, "i": i, "x": float(i) / 7.0})
               for i in range(RECORDS_PER_BLOCK)]
        half = RECORDS_PER_BLOCK // 2
        kek_id, wrapped = write_encrypted_block(loc, STREAM, day, [exs[:half], exs[half:]])
        locations[day] = loc
        specs.append(_spec(day, loc, wrapped_key=wrapped, kek_id=kek_id))
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-5, granularity="day")
        ledger.add_blocks(STREAM, specs)
    return url, locations


@pytest.fixture(scope="module")
def mods():
    from tfx.proto import example_gen_pb2
    from tfx.utils import proto_utils
    from sage_tfx.components import artifacts
    from sage_tfx.components.block_example_gen import component, executor, spec
    return dict(artifacts=artifacts, executor=executor, spec=spec, component=component,
                pb=example_gen_pb2, proto_utils=proto_utils)


def _grant_artifact(mods, tmp_path, url, *, name="grant", **request):
    """Runs the ledger request and writes the SageGrant the way SageGate does."""
    from sage_tfx.ledger import open_ledger
    artifacts = mods["artifacts"]
    art = artifacts.SageGrant()
    art.uri = str(tmp_path / name)
    run_id = request.pop("run_id", name)
    with open_ledger(url) as ledger:
        d = ledger.request(STREAM, run_id=run_id, **request)
    artifacts.write_grant(art, d.grant, stream=STREAM, run_id=run_id, context="default",
                          ledger_url=url, reason=d.reason)
    return art


def _run(mods, tmp_path, grant_art, name="examples", output_config=None, ledger_url=None):
    from tfx.types import standard_artifacts
    spec = mods["spec"]
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / name)
    props = {
        spec.OUTPUT_CONFIG_KEY: mods["proto_utils"].proto_to_json(
            output_config or mods["component"].default_output_config()),
        spec.OUTPUT_DATA_FORMAT_KEY: mods["pb"].FORMAT_TF_EXAMPLE,
        spec.OUTPUT_FILE_FORMAT_KEY: mods["pb"].FORMAT_TFRECORDS_GZIP,
    }
    if ledger_url:
        props[spec.LEDGER_URL_KEY] = ledger_url
    recorded = dict(props)
    mods["executor"].Executor().Do({spec.GRANT_INPUT_KEY: [grant_art]},
                                  {spec.EXAMPLES_KEY: [examples]}, props)
    assert props == recorded  # the granted files and their wrapped keys never reach MLMD
    return examples


def _window(n):
    from sage_tfx.ledger import Window
    return Window(last=n)


def _blocks_in(examples_uri):
    exs = read_examples(os.path.join(examples_uri, "**", "*.gz"))
    return collections.Counter(feature_value(e, "block") for e in exs)


def _all_output_files(uri):
    return [os.path.join(d, f) for d, _, fs in os.walk(uri) for f in fs]


def test_reads_exactly_the_granted_blocks_in_example_gen_layout(mods, tmp_path, block_ledger):
    from tfx.types import artifact_utils
    url, _ = block_ledger
    granted = ["2024-01-02", "2024-01-04"]
    grant = _grant_artifact(mods, tmp_path, url, blocks=granted, epsilon=0.2)
    examples = _run(mods, tmp_path, grant)
    assert artifact_utils.decode_split_names(examples.split_names) == ["train", "eval"]
    per_split = {}
    for split in ("train", "eval"):
        split_dir = os.path.join(examples.uri, f"Split-{split}")
        files = os.listdir(split_dir)
        assert files and all(f.startswith("data_tfrecord-") and f.endswith(".gz") for f in files)
        per_split[split] = sum(_blocks_in(split_dir).values())
    # every granted record exactly once, nothing else
    assert _blocks_in(examples.uri) == {b: RECORDS_PER_BLOCK for b in granted}
    assert sum(per_split.values()) == 2 * RECORDS_PER_BLOCK
    assert per_split["train"] > per_split["eval"] > 0  # 2:1 hash buckets
    assert examples.get_string_custom_property("payload_format") == "FORMAT_TF_EXAMPLE"
    assert examples.get_string_custom_property("grant_id") == grant.grant_id
    assert json.loads(examples.get_string_custom_property("block_ids")) == granted
    assert examples.get_int_custom_property("num_blocks") == 2
    assert examples.get_string_custom_property("run_id") == grant.run_id


def test_split_is_deterministic_per_record(mods, tmp_path, block_ledger):
    url, _ = block_ledger
    grant = _grant_artifact(mods, tmp_path, url, blocks=list(DAY_BLOCKS), epsilon=0.1)
    a = _run(mods, tmp_path, grant, "a")
    b = _run(mods, tmp_path, grant, "b")
    for split in ("train", "eval"):
        ids = [sorted((feature_value(e, "block"), feature_value(e, "i")) for e in
                      read_examples(os.path.join(x.uri, f"Split-{split}", "*.gz")))
               for x in (a, b)]
        assert ids[0] == ids[1]


def test_partition_feature_name_keeps_each_block_in_one_split(mods, tmp_path, block_ledger):
    url, _ = block_ledger
    pb = mods["pb"]
    config = pb.Output(split_config=pb.SplitConfig(partition_feature_name="block", splits=[
        pb.SplitConfig.Split(name="train", hash_buckets=1),
        pb.SplitConfig.Split(name="eval", hash_buckets=1)]))
    grant = _grant_artifact(mods, tmp_path, url, blocks=list(DAY_BLOCKS), epsilon=0.1)
    examples = _run(mods, tmp_path, grant, output_config=config)
    train = _blocks_in(os.path.join(examples.uri, "Split-train"))
    evals = _blocks_in(os.path.join(examples.uri, "Split-eval"))
    assert not set(train) & set(evals)
    assert sum(train.values()) + sum(evals.values()) == 4 * RECORDS_PER_BLOCK


def test_denied_grant_fails_with_missing_grant_error_and_reads_nothing(mods, tmp_path,
                                                                       block_ledger):
    from sage_tfx.errors import MissingGrantError
    url, _ = block_ledger
    grant = _grant_artifact(mods, tmp_path, url, window=_window(2), epsilon=5.0)
    assert grant.get_int_custom_property("granted") == 0
    with pytest.raises(MissingGrantError, match="ledger denied run"):
        _run(mods, tmp_path, grant)
    assert _all_output_files(str(tmp_path / "examples")) == []


def _rewrite_grant_json(art, mods, edit):
    path = os.path.join(art.uri, mods["artifacts"].GRANT_FILE_NAME)
    with open(path) as f:
        d = json.load(f)
    edit(d)
    with open(path, "w") as f:
        json.dump(d, f)


@pytest.mark.parametrize("tamper,match", [
    # point a granted block id at another block's directory
    ("swap_location", "locations of block"),
    # add a block that was never granted
    ("add_block", "blocks differ .not granted: \\['2024-01-01'\\]"),
    # replace a granted block by another one (keeping its count)
    ("replace_block", "blocks differ"),
    # claim a grant id the ledger never issued
    ("forge_id", "does not match its grant|altered"),
])
def test_tampered_grant_json_is_rejected_before_any_read(mods, tmp_path, block_ledger, tamper,
                                                         match):
    from sage_tfx.errors import MissingGrantError
    url, locations = block_ledger
    grant = _grant_artifact(mods, tmp_path, url, blocks=["2024-01-03"], epsilon=0.2)

    def edit(d):
        if tamper == "swap_location":
            d["blocks"] = [["2024-01-03", locations["2024-01-01"]]]
        elif tamper == "add_block":
            d["blocks"].append(["2024-01-01", locations["2024-01-01"]])
        elif tamper == "replace_block":
            d["blocks"] = [["2024-01-01", locations["2024-01-01"]]]
        elif tamper == "forge_id":
            d["grant_id"] = "0" * 32
    _rewrite_grant_json(grant, mods, edit)
    with pytest.raises(MissingGrantError, match=match):
        _run(mods, tmp_path, grant)
    assert _all_output_files(str(tmp_path / "examples")) == []


def test_forged_grant_with_consistent_artifact_is_rejected_by_the_ledger(mods, tmp_path,
                                                                         block_ledger):
    """A made-up grant (file and properties agree) still needs the ledger's record."""
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import Grant, GrantedBlock
    url, locations = block_ledger
    forged = Grant("f" * 32, "evil", STREAM, "default", "basic", 0.1, 0.0, None,
                   (GrantedBlock("2024-01-01", locations["2024-01-01"]),), "released", "now")
    art = mods["artifacts"].SageGrant()
    art.uri = str(tmp_path / "forged")
    mods["artifacts"].write_grant(art, forged, stream=STREAM, run_id="evil", context="default",
                                  ledger_url=url)
    with pytest.raises(MissingGrantError, match="is not in ledger"):
        _run(mods, tmp_path, art)


def test_another_runs_grant_id_does_not_match_the_artifact(mods, tmp_path, block_ledger):
    from sage_tfx.errors import MissingGrantError
    url, _ = block_ledger
    mine = _grant_artifact(mods, tmp_path, url, name="mine", blocks=["2024-01-04"], epsilon=0.1)
    theirs = _grant_artifact(mods, tmp_path, url, name="theirs", blocks=["2024-01-01"],
                             epsilon=0.1)
    with open(os.path.join(theirs.uri, "grant.json")) as f:
        text = f.read()
    with open(os.path.join(mine.uri, "grant.json"), "w") as f:
        f.write(text)
    with pytest.raises(MissingGrantError, match="altered"):
        _run(mods, tmp_path, mine)


def test_reservation_that_was_never_released_cannot_be_read(mods, tmp_path, block_ledger):
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import GrantedBlock, open_ledger
    url, locations = block_ledger
    with open_ledger(url) as ledger:
        reserved = ledger.request(STREAM, run_id="later", blocks=["2024-01-02"], epsilon=0.1,
                                  release=False).grant
    fake = mods["artifacts"].SageGrant()
    fake.uri = str(tmp_path / "reserved")
    # A grant file claiming the reservation was released, with the block's real location.
    released_view = dataclasses.replace(
        reserved, status="released",
        blocks=(GrantedBlock("2024-01-02", locations["2024-01-02"]),))
    mods["artifacts"].write_grant(fake, released_view, stream=STREAM, run_id="later",
                                  context="default", ledger_url=url)
    with pytest.raises(MissingGrantError, match="is reserved, not released"):
        _run(mods, tmp_path, fake)


def test_grant_from_another_ledger_is_not_trusted(mods, tmp_path, block_ledger):
    from sage_tfx.errors import MissingGrantError
    url, _ = block_ledger
    grant = _grant_artifact(mods, tmp_path, url, blocks=["2024-01-04"], epsilon=0.1)
    with pytest.raises(MissingGrantError, match="only trusts ledger"):
        _run(mods, tmp_path, grant, ledger_url=f"sqlite:///{tmp_path}/other.db")


def test_block_files_read_without_a_grant_yield_no_record(block_ledger):
    import tensorflow as tf
    _, locations = block_ledger
    for loc in locations.values():
        for path in glob.glob(os.path.join(loc, "*")):
            data = open(path, "rb").read()
            assert b"2024-01" not in data  # the "block" feature's value of every record
            with pytest.raises(tf.errors.OpError):
                list(tf.compat.v1.io.tf_record_iterator(
                    path, tf.io.TFRecordOptions(compression_type="GZIP")))


def test_a_block_retired_after_the_grant_is_not_read(mods, tmp_path, block_ledger):
    from sage_tfx.errors import RetiredBlockError
    from sage_tfx.ledger import open_ledger
    url, locations = block_ledger
    grant = _grant_artifact(mods, tmp_path, url, blocks=["2024-01-01", "2024-01-02"],
                            epsilon=0.1)
    with open_ledger(url) as ledger:
        ledger.retire_block(STREAM, "2024-01-02", "deletion request")
    assert not os.path.exists(locations["2024-01-02"])  # its files went with its key
    with pytest.raises(RetiredBlockError, match="retired since the grant"):
        _run(mods, tmp_path, grant)
    assert _all_output_files(str(tmp_path / "examples")) == []


def test_a_pipeline_not_bound_to_the_context_reads_nothing(mods, tmp_path, block_ledger,
                                                           monkeypatch):
    from sage_tfx.errors import PermissionDeniedError
    from sage_tfx.ledger import open_ledger
    url, _ = block_ledger
    grant = _grant_artifact(mods, tmp_path, url, blocks=["2024-01-01"], epsilon=0.1)
    with open_ledger(url) as ledger:
        ledger.add_principal("root", ["admin"])
        outsider = ledger.add_principal("outsider", ["pipeline"])
    monkeypatch.setenv("SAGE_LEDGER_TOKEN", outsider)
    with pytest.raises(PermissionDeniedError, match="not bound"):
        _run(mods, tmp_path, grant)
    assert _all_output_files(str(tmp_path / "examples")) == []


def test_a_plaintext_block_of_the_old_layout_is_still_read(mods, tmp_path):
    from sage_tfx.ledger import open_ledger
    from sage_tfx.streams.blocks import block_location
    url = f"sqlite:///{tmp_path}/old.db"
    loc = block_location(str(tmp_path / "old"), STREAM, DAY_BLOCKS[0])
    write_block_file(loc, [make_example({"block": DAY_BLOCKS[0], "i": i})
                           for i in range(RECORDS_PER_BLOCK)])
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-5)
        ledger.add_blocks(STREAM, [_spec(DAY_BLOCKS[0], loc)])
    grant = _grant_artifact(mods, tmp_path, url, blocks=[DAY_BLOCKS[0]], epsilon=0.1)
    assert _blocks_in(_run(mods, tmp_path, grant).uri) == {DAY_BLOCKS[0]: RECORDS_PER_BLOCK}


def test_missing_block_data_is_a_clear_error(mods, tmp_path, block_ledger):
    import shutil
    url, locations = block_ledger
    shutil.rmtree(locations["2024-01-04"])
    grant = _grant_artifact(mods, tmp_path, url, blocks=["2024-01-04"], epsilon=0.1)
    with pytest.raises(FileNotFoundError, match="granted block 2024-01-04 .* has no data files"):
        _run(mods, tmp_path, grant)
