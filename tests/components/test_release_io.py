"""components/release_io.py: an executor's output directory released once per grant.

Stand-in outputs (a directory of random bytes: a new draw would differ) instead of a TFX run.
"""
import os

import pytest

pytestmark = pytest.mark.slow  # imports TFX

NAME = "test/output"


@pytest.fixture
def ledger(tmp_path):
    from sage_tfx.ledger import BlockSpec, open_ledger
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec("b", f"{tmp_path}/b")])
    led.grant_id = led.request("s", run_id="r", blocks=["b"], epsilon=0.5).grant.grant_id
    return led


class Draw:
    """produce_into: writes fresh random bytes (a new draw every call), counting calls."""

    def __init__(self, size=256):
        self.size, self.calls = size, 0

    def __call__(self, staging):
        self.calls += 1
        os.makedirs(os.path.join(staging, "sub"))
        with open(os.path.join(staging, "sub", "noisy.bin"), "wb") as f:
            f.write(os.urandom(self.size))


def _artifact(uri):
    from tfx.types import standard_artifacts
    a = standard_artifacts.Model()
    a.uri = str(uri)
    return a


def _files(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                out[os.path.relpath(os.path.join(dirpath, n), root)] = f.read()
    return out


def test_replays_into_other_directories_carry_the_recorded_tree(ledger, tmp_path):
    from sage_tfx.components import release_io
    draw = Draw()
    first, again = _artifact(tmp_path / "a"), _artifact(tmp_path / "b")
    out = release_io.release_artifact_once(ledger, ledger.grant_id, NAME, first, draw,
                                           request={"k": 1}, component="Test")
    assert not out.replayed and first.get_int_custom_property("replayed") == 0
    out2 = release_io.release_artifact_once(ledger, ledger.grant_id, NAME, again, draw,
                                            request={"k": 1}, component="Test")
    assert out2.replayed and again.get_int_custom_property("replayed") == 1 and draw.calls == 1
    assert _files(first.uri) == _files(again.uri)
    assert set(_files(first.uri)) == {"sub/noisy.bin", release_io.RELEASE_FILE_NAME}
    assert again.get_string_custom_property("release_digest") == out.release.digest
    assert again.get_string_custom_property("release_name") == NAME
    assert ledger.check_consistency("s") == []


def test_another_request_publishes_nothing_and_keeps_the_recorded_location(ledger, tmp_path):
    """A tree over the inline limit is recorded by location: a refused replay into that very
    directory must not delete it."""
    from sage_tfx.components import release_io
    from sage_tfx.errors import ReleaseConflictError
    from sage_tfx.ledger import releases
    first = _artifact(tmp_path / "a")
    rec = releases.release_tree_once(  # recorded by location (max_inline=0)
        ledger, ledger.grant_id, NAME, first.uri,
        lambda d: (Draw()(d), open(os.path.join(d, release_io.RELEASE_FILE_NAME), "w").write(
            '{"name":"test/output","request":{"k":1}}')), max_inline=0).release
    assert rec.location == os.path.abspath(first.uri) and rec.value is None
    kept = _files(first.uri)
    with pytest.raises(ReleaseConflictError, match="Test refused to publish") as e:
        release_io.release_artifact_once(ledger, ledger.grant_id, NAME, _artifact(first.uri),
                                         Draw(), request={"k": 2}, component="Test")
    assert "k: 1 then, 2 now" in str(e.value)
    assert _files(first.uri) == kept  # the recorded location survives
    other = _artifact(tmp_path / "other")
    with pytest.raises(ReleaseConflictError):
        release_io.release_artifact_once(ledger, ledger.grant_id, NAME, other, Draw(),
                                         request={"k": 2}, component="Test")
    assert not os.path.exists(other.uri)  # nothing published
    assert len(ledger.releases(ledger.grant_id)) == 1


def test_a_remote_uri_is_staged_locally_and_recorded_inline(ledger, monkeypatch):
    """``ram://`` (TensorFlow's in-memory file system) stands in for a bucket."""
    from tfx.dsl.io import fileio
    from sage_tfx.components import release_io
    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.ledger import releases
    draw = Draw()
    a, b = _artifact("ram://run1/out"), _artifact("ram://run2/out")
    out = release_io.release_artifact_once(ledger, ledger.grant_id, NAME, a, draw,
                                           request=None, component="Test")
    assert out.release.value is not None  # inline: no local path is ever a location
    release_io.release_artifact_once(ledger, ledger.grant_id, NAME, b, draw, request=None,
                                     component="Test")
    assert draw.calls == 1 and b.get_int_custom_property("replayed") == 1
    read = lambda uri: fileio.open(f"{uri}/sub/noisy.bin", "rb").read()  # noqa: E731
    assert read(a.uri) == read(b.uri)
    assert release_io.tree_digest(a.uri) == release_io.tree_digest(b.uri) == out.release.digest
    # Over the inline limit, a remote output is refused before anything is recorded.
    monkeypatch.setattr(releases, "MAX_VALUE_BYTES", 1000)
    with pytest.raises(InvalidRequestError, match="at most 1000 bytes"):
        release_io.release_artifact_once(ledger, ledger.grant_id, "test/big", _artifact(
            "ram://run3/out"), Draw(4096), request=None, component="Test")
    assert [r.name for r in ledger.releases(ledger.grant_id)] == [NAME]


def test_the_ledger_to_ask_is_the_grants_unless_pinned(tmp_path):
    from sage_tfx.components import artifacts, release_io
    from sage_tfx.errors import MissingGrantError
    grant = artifacts.SageGrant()
    grant.uri = str(tmp_path / "g")
    with pytest.raises(MissingGrantError, match="records no ledger_url"):
        release_io.ledger_url_for(grant, None, component="Test")
    grant.set_string_custom_property("ledger_url", "sqlite:///a.db")
    assert release_io.ledger_url_for(grant, None, component="Test") == "sqlite:///a.db"
    with pytest.raises(MissingGrantError, match=r"\*\*\*"):  # the pinned URL, redacted
        release_io.ledger_url_for(grant, "postgresql://u:secret@h/db", component="Test")
