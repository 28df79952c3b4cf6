"""Certificates never overclaim, survive a JSON round trip, and gates decide promotion."""

import numpy as np
import pytest

from fedunlearn.certify import (BOUNDED_APPROXIMATION, EMPIRICAL_ONLY, EXACT_RETRAIN, FORMAL, NOT_CERTIFIED,
                                Certificate, Gates, certificate_for, evaluate_gates)
from fedunlearn.unlearning import Outcome, UnlearningMethod


class FormalMethod(UnlearningMethod):
    name = "formal_stub"
    settings = frozenset({"dfl"})
    request_kinds = frozenset({"sample"})
    guarantee = FORMAL

    def _unlearn(self, fed_state, batch, monitor):
        raise NotImplementedError


class BoundedMethod(FormalMethod):
    name, guarantee = "bounded_stub", BOUNDED_APPROXIMATION


def outcome(**certificate_inputs) -> Outcome:
    return Outcome(state={}, certificate_inputs=certificate_inputs)


def test_formal_guarantee_holds_only_when_every_assumption_holds():
    assumptions = {"strongly_convex": True, "lipschitz_loss": True, "lipschitz_hessian": True}
    cert = certificate_for(FormalMethod, outcome(epsilon=1.0, delta=1e-5, assumptions=assumptions))
    assert cert.guarantee == FORMAL and cert.claimed == FORMAL and cert.notes == []
    assert cert.numbers == {"epsilon": 1.0, "delta": 1e-5} and cert.assumptions == assumptions


def test_formal_guarantee_is_downgraded_when_an_assumption_fails():
    inputs = outcome(epsilon=1.0, assumptions={"strongly_convex": False, "lipschitz_loss": True})
    cert = certificate_for(FormalMethod(), inputs, scenario="mnist_dfl", batch_id="batch-1")
    assert cert.guarantee == NOT_CERTIFIED and cert.claimed == FORMAL
    assert "strongly_convex" in cert.notes[0] and "lipschitz_loss" not in cert.notes[0]


def test_formal_guarantee_without_checked_assumptions_is_not_certified():
    cert = certificate_for(FormalMethod, outcome(epsilon=1.0))
    assert cert.guarantee == NOT_CERTIFIED and "no assumptions were checked" in cert.notes[0]


def test_caller_checked_assumptions_override_the_methods():
    inputs = outcome(assumptions={"strongly_convex": True})
    assert certificate_for(FormalMethod, inputs, assumptions={"strongly_convex": False}).guarantee == NOT_CERTIFIED
    assert certificate_for(BoundedMethod, outcome(cg_residual=1e-4)).guarantee == BOUNDED_APPROXIMATION
    assert certificate_for(BoundedMethod, outcome(assumptions={"cg_converged": False})).guarantee == NOT_CERTIFIED


def test_registered_names_resolve_to_their_guarantee_class():
    from fedunlearn.unlearning import Retrain

    assert certificate_for(Retrain, outcome(rounds=2)).guarantee == EXACT_RETRAIN
    # An assumption cannot make an empirical claim an overclaim: it stays empirical.
    assert certificate_for("finetune", outcome(assumptions={"anything": False})).guarantee == EMPIRICAL_ONLY
    with pytest.raises(ValueError, match="exists for several settings"):
        certificate_for("retrain", outcome())
    with pytest.raises(ValueError, match="unknown unlearning method"):
        certificate_for("nope", outcome())


def test_certificate_json_round_trip():
    cert = certificate_for(FormalMethod, outcome(sigma=np.float32(0.5), residuals=np.array([0.1, 0.2]),
                                                 assumptions={"strongly_convex": np.bool_(True)}),
                           scenario="breast_dfl", request={"kind": "sample", "ids": ["a", "b"]}, batch_id="batch-9")
    text = cert.to_json()
    assert "formal (ε,δ)" in text
    again = Certificate.from_json(text)
    assert again == cert
    assert again.numbers == {"sigma": 0.5, "residuals": pytest.approx([0.1, 0.2])}


def test_unknown_guarantee_class_is_rejected():
    with pytest.raises(ValueError, match="unknown guarantee class 'certified'"):
        Certificate(method="x", guarantee="certified", claimed=EMPIRICAL_ONLY)


RETRAIN_ROW = {"test_acc": 0.90, "forget_acc": 0.80, "mia_auc": 0.52, "bd_asr": 0.01}


def test_gates_pass_within_tolerances():
    row = {"test_acc": 0.89, "forget_acc": 0.83, "mia_auc": 0.55, "bd_asr": 0.05}
    result = evaluate_gates(row, RETRAIN_ROW, Gates(max_backdoor_asr=0.1))
    assert result.passed
    assert [c["name"] for c in result.checks] == ["abs_gap_test_acc", "abs_gap_forget_acc", "abs_gap_mia_auc",
                                                 "bd_asr"]
    assert result.checks[1]["value"] == pytest.approx(0.03) and result.checks[1]["limit"] == 0.05


def test_gates_fail_on_a_gap_a_missing_metric_or_nan():
    too_far = evaluate_gates({**RETRAIN_ROW, "forget_acc": 0.95}, RETRAIN_ROW, Gates())
    assert not too_far.passed
    assert [c["name"] for c in too_far.checks if not c["passed"]] == ["abs_gap_forget_acc"]
    missing = evaluate_gates({"test_acc": 0.9, "forget_acc": 0.8}, RETRAIN_ROW, Gates())
    assert not missing.passed and missing.checks[2] == {"name": "abs_gap_mia_auc", "value": None, "limit": 0.05,
                                                        "passed": False}
    assert not evaluate_gates({**RETRAIN_ROW, "test_acc": float("nan")}, RETRAIN_ROW, Gates()).passed
    assert not evaluate_gates({**RETRAIN_ROW, "bd_asr": 0.6}, RETRAIN_ROW, Gates(max_backdoor_asr=0.1)).passed


def test_gates_can_be_switched_off_and_pick_the_mia_metric():
    row = {"test_acc": 0.5, "forget_acc": 0.8, "mia_auc": 0.9, "mia_yeom_auc": 0.53}
    retrain = {**RETRAIN_ROW, "mia_yeom_auc": 0.52}
    gates = Gates(max_test_acc_gap=None, mia_metric="mia_yeom_auc")
    result = evaluate_gates(row, retrain, gates)
    assert result.passed and [c["name"] for c in result.checks] == ["abs_gap_forget_acc", "abs_gap_mia_yeom_auc"]
    with pytest.raises(ValueError):
        Gates(max_forget_acc_gap=-0.1)
