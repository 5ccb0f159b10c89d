"""Release once: a grant buys one release per name; replays return it byte for byte."""
import multiprocessing
import os

import pytest

from sage_tfx.errors import (GrantStateError, InvalidRequestError, MissingGrantError,
                             ReleaseConflictError)
from sage_tfx.ledger import BlockSpec, open_ledger, releases


def _ledger(url, n=4):
    led = open_ledger(url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"b{i}", f"/data/b{i}") for i in range(n)])
    return led


def _grant(led, run_id="r1", **kw):
    return led.request("s", run_id=run_id, blocks=["b0", "b1"], epsilon=0.1, **kw).grant


def test_a_value_is_recorded_once_and_a_different_one_refused(ledger_url):
    led = _ledger(ledger_url)
    g = _grant(led)
    first = led.record_release(g.grant_id, "stats/mean", value=b"\x00noisy 1")
    assert first.digest == releases.digest_bytes(b"\x00noisy 1") and first.size == 8
    assert first.stream == "s" and first.run_id == "r1" and first.principal == "local"
    again = led.record_release(g.grant_id, "stats/mean", value=b"\x00noisy 1")
    assert again == first
    with pytest.raises(ReleaseConflictError, match=first.digest[:16]):
        led.record_release(g.grant_id, "stats/mean", value=b"\x00noisy 2")
    assert led.recorded_release(g.grant_id, "stats/mean").value == b"\x00noisy 1"
    other = led.record_release(g.grant_id, "stats/count", value=b"7")
    assert {r.name for r in led.releases(g.grant_id)} == {"stats/mean", "stats/count"}
    assert other.value == b"7"
    kinds = [e.kind for e in led.audit_log("s")]
    assert kinds.count("record_release") == 2
    assert led.check_consistency("s") == [] and led.verify_audit().ok


def test_bad_release_calls_change_nothing(ledger_url):
    led = _ledger(ledger_url)
    reserved = _grant(led, "res", release=False)
    g = _grant(led, "r2")
    n = len(led.audit_log())
    with pytest.raises(GrantStateError, match="reserved"):
        led.record_release(reserved.grant_id, "x", value=b"1")
    with pytest.raises(InvalidRequestError, match="unknown grant"):
        led.record_release("nope", "x", value=b"1")
    for bad in ("", "/x", "a b", "x" * 300, None, 3):
        with pytest.raises(InvalidRequestError):
            led.record_release(g.grant_id, bad, value=b"1")
    with pytest.raises(InvalidRequestError):
        led.record_release(g.grant_id, "x", value=b"1", digest="0" * 64)
    with pytest.raises(InvalidRequestError):
        led.record_release(g.grant_id, "x", digest="zz", location="/tmp/x")
    with pytest.raises(InvalidRequestError):
        led.record_release(g.grant_id, "x", digest="0" * 64)
    with pytest.raises(InvalidRequestError):
        led.record_release(g.grant_id, "x", value="text, not bytes")
    led.cancel(reserved.grant_id)
    with pytest.raises(GrantStateError, match="cancelled"):
        led.record_release(reserved.grant_id, "x", value=b"1")
    assert len(led.audit_log()) == n + 1  # only the cancel
    assert led.releases(g.grant_id) == []


def test_release_value_once_never_draws_again(ledger_url):
    led = _ledger(ledger_url)
    g = _grant(led)
    draws = []

    def produce():
        draws.append(os.urandom(16))
        return draws[-1]

    first = releases.release_value_once(led, g.grant_id, "noisy", produce)
    assert not first.replayed and first.value == draws[0]
    led.close()
    led = open_ledger(ledger_url)  # a new process / connection
    for _ in range(3):
        again = releases.release_value_once(led, g.grant_id, "noisy", produce)
        assert again.replayed and again.value == draws[0]
    assert len(draws) == 1


def _race(url, grant_id, out):
    led = open_ledger(url)
    outcome = releases.release_value_once(led, grant_id, "raced", lambda: os.urandom(32))
    out.put((outcome.value, outcome.replayed))


def test_concurrent_processes_publish_one_release(ledger_url):
    led = _ledger(ledger_url)
    g = _grant(led)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(ledger_url, g.grant_id, q)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    values = {v for v, _ in results}
    assert len(values) == 1
    assert sum(not replayed for _, replayed in results) == 1
    assert led.recorded_release(g.grant_id, "raced").value == values.pop()
    assert len(led.releases(g.grant_id)) == 1


def _write_model(path, payload: bytes):
    os.makedirs(os.path.join(path, "variables"))
    with open(os.path.join(path, "saved_model.pb"), "wb") as f:
        f.write(payload)
    with open(os.path.join(path, "variables", "w.bin"), "wb") as f:
        f.write(payload[::-1])


@pytest.mark.parametrize("max_inline", [releases.MAX_VALUE_BYTES, 0])
def test_a_tree_is_released_once_and_materialized_on_replay(ledger_url, tmp_path, max_inline):
    led = _ledger(ledger_url)
    g = _grant(led)
    calls = []

    def produce_into(path):
        calls.append(path)
        _write_model(path, os.urandom(64))

    first_dir = str(tmp_path / "exec1" / "model")
    out = releases.release_tree_once(led, g.grant_id, "trainer/model", first_dir, produce_into,
                                     max_inline=max_inline)
    assert not out.replayed and len(calls) == 1
    assert (out.release.value is None) == (max_inline == 0)
    digest = releases.tree_digest(first_dir)
    assert out.release.digest == digest
    second_dir = str(tmp_path / "exec2" / "model")  # a retried execution's new output URI
    again = releases.release_tree_once(led, g.grant_id, "trainer/model", second_dir,
                                       produce_into, max_inline=max_inline)
    assert again.replayed and len(calls) == 1
    assert releases.tree_digest(second_dir) == digest
    with open(os.path.join(second_dir, "saved_model.pb"), "rb") as a, \
            open(os.path.join(first_dir, "saved_model.pb"), "rb") as b:
        assert a.read() == b.read()
    assert not [p for p in os.listdir(tmp_path / "exec1") if p.startswith(".sage-release")]
    if max_inline == 0:  # a location release whose files were altered is refused, not re-drawn
        with open(os.path.join(first_dir, "saved_model.pb"), "ab") as f:
            f.write(b"tampered")
        with pytest.raises(MissingGrantError, match="gone or altered"):
            releases.release_tree_once(led, g.grant_id, "trainer/model",
                                       str(tmp_path / "exec3"), produce_into,
                                       max_inline=max_inline)
        assert len(calls) == 1


def test_consistency_reports_an_altered_release(ledger_url):
    led = _ledger(ledger_url)
    g = _grant(led)
    led.record_release(g.grant_id, "x", value=b"12345")
    assert led.check_consistency("s") == []
    led._q("UPDATE releases SET value = ?", (b"54321",))
    problems = led.check_consistency("s")
    assert any("do not match the digest" in p for p in problems)
    with pytest.raises(MissingGrantError, match="altered"):
        releases.release_value_once(led, g.grant_id, "x", lambda: b"new")


def test_tree_digest_depends_on_names_and_contents_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write_model(str(a), b"same")
    _write_model(str(b), b"same")
    os.utime(b / "saved_model.pb", (1, 1))
    os.chmod(b / "saved_model.pb", 0o600)
    assert releases.tree_digest(str(a)) == releases.tree_digest(str(b))
    (b / "extra").write_bytes(b"")
    assert releases.tree_digest(str(a)) != releases.tree_digest(str(b))


def _tar(members):
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("members", [
    [("../escaped", "file", b"x")],
    [("/abs/escaped", "file", b"x")],
    [("link", "link", "/"), ("link/escaped", "file", b"x")],
    [("ok/../../escaped", "file", b"x")],
])
def test_recorded_bytes_cannot_write_outside_the_output(ledger_url, tmp_path, members):
    """The ledger's database is not this process: a recorded tree holding links, absolute or
    escaping names is refused, and nothing is written outside the output directory."""
    led = _ledger(ledger_url)
    g = _grant(led)
    led.record_release(g.grant_id, "t", value=_tar(members))
    out = tmp_path / "deep" / "out"
    with pytest.raises(MissingGrantError):
        releases.release_tree_once(led, g.grant_id, "t", str(out), lambda p: None)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "deep" / "escaped").exists()
    assert not os.path.exists("/abs/escaped")


def test_a_large_tree_is_recorded_before_it_is_published(ledger_url, tmp_path):
    """An output that could not be recorded is never left where outputs are read; a process
    stopped between recording and moving the tree into place is finished by the replay."""
    led = _ledger(ledger_url)
    reserved = _grant(led, "res", release=False)
    out = tmp_path / "exec1" / "model"
    with pytest.raises(GrantStateError):
        releases.release_tree_once(led, reserved.grant_id, "m", str(out),
                                   lambda p: _write_model(p, os.urandom(64)), max_inline=0)
    assert not out.exists() and os.listdir(tmp_path / "exec1") == []
    g = _grant(led, "r9")
    real_replace = os.replace

    def stop(src, dst):  # the process dies right after the record, before the move
        raise KeyboardInterrupt

    os.replace = stop
    try:
        with pytest.raises(KeyboardInterrupt):
            releases.release_tree_once(led, g.grant_id, "m", str(out),
                                       lambda p: _write_model(p, b"first draw"), max_inline=0)
    finally:
        os.replace = real_replace
    assert not out.exists()
    again = releases.release_tree_once(led, g.grant_id, "m", str(out),
                                       lambda p: pytest.fail("drew again"), max_inline=0)
    assert again.replayed and (out / "saved_model.pb").read_bytes() == b"first draw"


def test_a_plan_part_has_one_spender(ledger_url):
    """One spend per plan part: the first spender's claim stands; the same spender's claim is
    returned again (a replay), any other spender is refused before and at its claim."""
    led = _ledger(ledger_url)
    g = _grant(led)
    assert releases.part_release_name("train", "model") == "train/model"
    releases.check_part_claim(led, g.grant_id, "train", "DPTrainer")   # nothing claimed yet
    first = releases.claim_part(led, g.grant_id, "train", "DPTrainer")
    assert first.name == "part/train"
    assert releases.claim_part(led, g.grant_id, "train", "DPTrainer") == first
    releases.check_part_claim(led, g.grant_id, "train", "DPTrainer")
    for other in ("DnDTrainer", "DPBaggingTrainer"):
        with pytest.raises(ReleaseConflictError, match="'train' .* spent by DPTrainer"):
            releases.check_part_claim(led, g.grant_id, "train", other)
        with pytest.raises(ReleaseConflictError, match=f"{other} may not spend it"):
            releases.claim_part(led, g.grant_id, "train", other)
    # other parts of the same grant are claimed independently
    releases.claim_part(led, g.grant_id, "validate", "DPModelValidator")
    assert {r.name for r in led.releases(g.grant_id)} == {"part/train", "part/validate"}
    with pytest.raises(InvalidRequestError):
        releases.part_release_name("bad part", "model")
    assert led.check_consistency("s") == [] and led.verify_audit().ok


def _claim_race(url, grant_id, spender, q):
    with open_ledger(url) as led:
        try:
            releases.claim_part(led, grant_id, "train", spender)
            q.put(spender)
        except ReleaseConflictError:
            q.put(None)


def test_racing_spenders_of_one_part_get_one_claim(ledger_url):
    led = _ledger(ledger_url)
    g = _grant(led)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    spenders = ["DPTrainer", "DnDTrainer", "DPBaggingTrainer", "PTKTrainer"]
    procs = [ctx.Process(target=_claim_race, args=(ledger_url, g.grant_id, s, q))
             for s in spenders]
    for p in procs:
        p.start()
    won = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    winners = [w for w in won if w is not None]
    assert len(winners) == 1
    for s in spenders:
        if s != winners[0]:
            with pytest.raises(ReleaseConflictError):
                releases.check_part_claim(led, g.grant_id, "train", s)
