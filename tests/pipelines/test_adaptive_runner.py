"""The adaptive runner's loop over a real ledger, with a stand-in iteration (no TFX)."""
import pytest

from sage_tfx.adaptive import SearchConfig
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.pipelines.adaptive_runner import PipelineSpec, run_adaptive
from sage_tfx.dp.validation import Outcome


def _blocks(n):
    return [BlockSpec(f"d{i:03d}", f"/store/d{i:03d}", records=100) for i in range(n)]


def test_iterations_double_until_accept_and_gate_replays_the_charge(tmp_path):
    """ACCEPT needs ε ≥ 0.4 on ≥ 2 blocks; the stand-in plays the gate by re-requesting the same
    run id (which must replay, not charge twice)."""
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    seen = []

    def iteration(*, pipeline_name, run_id, blocks, epsilon, delta, need_eps, need_blocks):
        d = led.request("s", run_id=run_id, blocks=blocks, epsilon=epsilon, delta=delta)
        assert d.granted and d.replayed  # charged once, by the allocator, before the run
        seen.append((run_id, len(blocks), epsilon))
        ok = epsilon >= need_eps and len(blocks) >= need_blocks
        return (Outcome.ACCEPT if ok else Outcome.RETRY), {}

    spec = PipelineSpec("p", SearchConfig(epsilon0=0.1, delta=1e-8, min_blocks=2),
                        iteration_kwargs=(("need_eps", 0.4), ("need_blocks", 2)))
    logs = run_adaptive(led, "s", _blocks(12), [spec], iteration, progress=lambda m: None)
    assert [log.record.outcome for log in logs][-1] == Outcome.ACCEPT
    eps = [e for _, _, e in seen]
    assert eps[0] == 0.1 and all(b >= a for a, b in zip(eps, eps[1:]))
    assert max(eps) >= 0.4
    # Every iteration's charge is in the ledger exactly once, on exactly its blocks.
    grants = {g.run_id: g for g in led.grants("s")}
    assert sorted(grants) == sorted(r for r, _, _ in seen)
    assert led.check_consistency("s") == []
    spent = sum(b.epsilon_spent for b in led.blocks("s"))
    assert spent == pytest.approx(sum(g.epsilon * len(g.blocks) for g in grants.values()))


def test_two_pipelines_share_new_blocks(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    runs = []

    def iteration(*, pipeline_name, run_id, blocks, epsilon, delta):
        runs.append(pipeline_name)
        return (Outcome.ACCEPT if epsilon >= 0.2 else Outcome.RETRY), {}

    specs = [PipelineSpec("a", SearchConfig(epsilon0=0.05, min_blocks=1)),
             PipelineSpec("b", SearchConfig(epsilon0=0.05, min_blocks=1), arrive_at=1)]
    logs = run_adaptive(led, "s", _blocks(10), specs, iteration, progress=lambda m: None)
    finals = {log.pipeline: log.record.outcome for log in logs}
    assert finals == {"a": Outcome.ACCEPT, "b": Outcome.ACCEPT}
    assert {"a", "b"} <= set(runs)
    assert all(b.epsilon_spent <= 1.0 for b in led.blocks("s"))
    assert led.check_consistency("s") == []


def test_validator_reject_continues_the_search_unless_final(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)

    def iteration(*, pipeline_name, run_id, blocks, epsilon, delta):
        return (Outcome.ACCEPT if epsilon >= 0.2 else Outcome.REJECT), {}

    logs = run_adaptive(led, "s", _blocks(6), [PipelineSpec("p", SearchConfig(epsilon0=0.1))],
                        iteration, progress=lambda m: None)
    assert [log.record.outcome for log in logs] == [Outcome.RETRY, Outcome.ACCEPT]
    assert logs[0].detail["validator_outcome"] == "REJECT"
    led2 = open_ledger(f"sqlite:///{tmp_path}/l2.db")
    led2.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    logs = run_adaptive(led2, "s", _blocks(6),
                        [PipelineSpec("p", SearchConfig(epsilon0=0.1), final_reject=True)],
                        iteration, progress=lambda m: None)
    assert [log.record.outcome for log in logs] == [Outcome.REJECT]


def test_every_step_is_anchored_outside_the_ledger(tmp_path):
    from sage_tfx.ledger.anchor import verify_anchors, write_anchor
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    anchors, steps = str(tmp_path / "anchors.jsonl"), []

    def on_step(step):
        steps.append(step)
        write_anchor(led, anchors)

    spec = PipelineSpec("p", SearchConfig(epsilon0=0.1, delta=1e-8, min_blocks=2))
    run_adaptive(led, "s", _blocks(5), [spec], lambda **kw: (Outcome.RETRY, {}),
                 progress=lambda m: None, on_step=on_step)
    assert steps == list(range(5))
    report = verify_anchors(led, anchors)
    assert report.ok and report.anchors == 5
