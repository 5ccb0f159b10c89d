"""Empirical audits of training: canaries (one run) and membership inference, DP vs non-DP.

Both directions can fail: the DP-SGD model must stay below its charged ε (canaries) and near
AUC 0.5 (membership inference); the non-DP twin must exceed the charged ε and be attackable.
Tiny on purpose (load_digits, a 64-unit MLP, a few hundred rows).
"""
import pytest

from sage_tfx.dp import audit

CHARGED_EPSILON = 0.5


def test_one_run_bound_and_membership_inference_numbers():
    # All 100 guesses right: Binomial(100, p) = 100 has probability p**100 ≤ 0.05.
    p = 0.05 ** (1 / 100)
    assert audit.one_run_epsilon_lower_bound(100, 100, 0.05) == pytest.approx(
        __import__("math").log(p / (1 - p)), rel=1e-6)
    assert audit.one_run_epsilon_lower_bound(55, 100) == 0.0   # chance level: no evidence
    perfect = audit.membership_inference([0.0, 0.1, 0.2], [1.0, 2.0])
    assert perfect.auc == 1.0 and perfect.attacker_advantage == 1.0
    blind = audit.membership_inference([1.0, 1.0], [1.0, 1.0])
    assert blind.auc == 0.5 and blind.attacker_advantage == 0.0


@pytest.fixture(scope="module")
def pa():
    from sage_tfx.eval import privacy_audit
    return privacy_audit


@pytest.mark.slow
def test_canary_lower_bound_below_charged_epsilon_for_dp_far_above_without(pa):
    data = pa.digits_data(num_train=400, num_heldout=10, num_canaries=200)
    dp, guarantee = pa.canary_audit(data, dp=True, guesses_per_side=50,
                                    epsilon=CHARGED_EPSILON, epochs=20, batch_size=50)
    assert guarantee.epsilon <= CHARGED_EPSILON
    assert dp.epsilon_lower_bound < CHARGED_EPSILON, dp
    non_dp, _ = pa.canary_audit(data, dp=False, guesses_per_side=50, epochs=200,
                                batch_size=128, seed=0)
    assert non_dp.epsilon_lower_bound > 2 * CHARGED_EPSILON, non_dp


@pytest.mark.slow
def test_membership_inference_fails_on_dp_model_succeeds_on_non_dp_twin(pa):
    # 20% of train and held-out labels flipped alike: the non-DP twin memorises its flipped rows.
    data = pa.digits_data(num_train=200, num_heldout=1000, num_canaries=0, label_noise=0.2)
    dp_model, _ = pa.train(data.x_train, data.y_train, dp=True, epsilon=1.0, epochs=20,
                           batch_size=50)
    twin, _ = pa.train(data.x_train, data.y_train, dp=False, epochs=200, batch_size=128, seed=0)
    dp_report, twin_report = pa.membership_report(dp_model, data), pa.membership_report(twin, data)
    # AUC standard error here is ≈ 0.022: 0.075 is 3.4 SE from chance.
    assert abs(dp_report.auc - 0.5) < 0.075, dp_report
    assert twin_report.auc > 0.65 and twin_report.auc > dp_report.auc + 0.1, twin_report


@pytest.mark.slow
def test_flights_membership_inference_dp_near_chance_twin_memorises(pa):
    """The demo's flights regression: the DP-SGD model at the demo's ε = 0.6 stays near AUC 0.5;
    a wide non-DP twin trained long on a small training set memorises it (benchmark scale:
    250 rows, 256-256, 300 epochs, AUC 0.84)."""
    data = pa.flights_data(rows=120, heldout=600)
    report = pa.flights_membership(data, twin_hidden=(128, 128), twin_epochs=150)
    assert report["charged_epsilon"] <= 0.6
    # AUC standard error with 120 vs 600 rows is ≈ 0.029: 0.1 is 3.4 SE from chance.
    assert abs(report["dp"]["auc"] - 0.5) < 0.1, report
    assert report["non_dp"]["auc"] > 0.65, report
