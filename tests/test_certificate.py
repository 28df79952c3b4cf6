"""Certificates never overclaim, survive a JSON round trip, and gates decide promotion."""

import numpy as np
import pytest

from fedunlearn.certify import (BOUNDED_APPROXIMATION, EMPIRICAL_ONLY, EXACT_RETRAIN, FORMAL, NOT_CERTIFIED,
                                Certificate, certificate_for)
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
    from fedunlearn.unlearning.registry import get_method_class

    assert certificate_for(Retrain, outcome(rounds=2)).guarantee == EXACT_RETRAIN
    # An assumption cannot make an empirical claim an overclaim: it stays empirical.
    finetune = get_method_class("finetune")
    assert certificate_for(finetune, outcome(assumptions={"anything": False})).guarantee == EMPIRICAL_ONLY
    with pytest.raises(ValueError, match="exists for several settings"):
        get_method_class("retrain")
    with pytest.raises(ValueError, match="unknown unlearning method"):
        get_method_class("nope")


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
