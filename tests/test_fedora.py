"""FedORA: the uncertainty loss and its maximum, the projected dual update (both forms), the
asymmetric batches and what crosses party boundaries, and label unlearning on wine-vfl."""

import math

import numpy as np
import pytest
import torch

from fedunlearn.certify.certificate import CONSTRAINT_SATISFIED, certificate_for
from fedunlearn.config import TrainConfig
from fedunlearn.federation.vertical import VerticalState, load_vertical
from fedunlearn.unlearning import FedORA, get_method, resolve_request
from fedunlearn.unlearning.fedora import (FORGOTTEN_AT_MOST_CHANCE, as_label_rate, dual_update, entropy, kl_to_uniform,
                                          output_bias, suppression_shift, uncertainty_loss)
from fedunlearn.unlearning.registry import get_method_class

CPU = torch.device("cpu")
CONFIG = TrainConfig(rounds=20, lr=0.05, batch_size=16)


@pytest.fixture(scope="module")
def fed_state(tmp_path_factory) -> VerticalState:
    from stores.workspace import PROJECT_ROOT, init_workspace, reproduce

    root = init_workspace(tmp_path_factory.mktemp("fedora") / "workspace", template=PROJECT_ROOT)
    reproduce(root, "wine-vfl")
    federation = load_vertical("wine-vfl", root, CPU, config=CONFIG, seed=0)
    return VerticalState.from_federation(federation, federation.fit().state)


# --- the uncertainty loss ---------------------------------------------------------------------------

@pytest.mark.parametrize("classes", [2, 3, 10])
def test_entropy_minus_kl_to_uniform_is_twice_the_entropy_minus_log_c(classes):
    logits = torch.randn(64, classes, generator=torch.Generator().manual_seed(classes)) * 3
    h = entropy(logits)
    assert torch.allclose(h - kl_to_uniform(logits), 2 * h - math.log(classes), atol=1e-5)
    assert torch.allclose(uncertainty_loss(logits, omega=2.0), (2.0 * (2 * h - math.log(classes))).sum(), atol=1e-4)


def test_the_uncertainty_loss_is_maximal_at_uniform_predictions():
    uniform = torch.zeros(5, 10, requires_grad=True)  # equal logits: P = U
    top = uncertainty_loss(uniform, omega=2.0)
    assert float(top.detach()) == pytest.approx(5 * 2.0 * math.log(10))  # ω·log C per sample
    top.backward()
    assert torch.allclose(uniform.grad, torch.zeros_like(uniform.grad), atol=1e-6)  # a stationary point
    for scale in (0.01, 0.1, 1.0, 10.0):  # any non-uniform prediction is less uncertain
        assert float(uncertainty_loss(scale * torch.randn(5, 10), omega=2.0)) < float(top.detach())
    assert float(uncertainty_loss(torch.tensor([[30.0, 0.0, 0.0]]), 1.0)) == pytest.approx(-math.log(3), abs=1e-4)


# --- the dual variables -----------------------------------------------------------------------------

def test_the_projected_dual_update_keeps_omega_nonnegative_in_both_forms():
    generator = torch.Generator().manual_seed(0)
    omega = torch.rand(1000, generator=generator)
    gradient = 5 * torch.randn(1000, generator=generator)  # many entries above γ: Ω + σ(γ − g) < 0
    updated = dual_update(omega, sigma=0.5, gamma=0.3, value=gradient)
    assert (updated >= 0).all() and (updated == 0).any()
    assert torch.equal(updated, torch.maximum(torch.zeros(()), omega + 0.5 * (0.3 - gradient)))
    scalar = dual_update(torch.tensor(0.2), sigma=1.0, gamma=1.0, value=torch.tensor(4.0))  # L_u ≫ γ
    assert scalar.ndim == 0 and float(scalar) == 0.0
    assert float(dual_update(torch.tensor(0.2), 1.0, 1.0, torch.tensor(-1.0))) == pytest.approx(2.2)


@pytest.mark.parametrize("form", ["elementwise", "scalar"])
def test_a_run_records_its_dual_form_and_keeps_every_omega_nonnegative(fed_state, form):
    batch = resolve_request("class", [1], fed_state.clients, num_classes=3)
    outcome = FedORA(dual=form, iterations=8, sigma=0.2).unlearn(fed_state, batch)
    numbers = outcome.certificate_inputs
    assert numbers["dual_form"] == outcome.notes["dual_form"] == form
    duals = numbers["dual_variables"]
    if form == "scalar":
        assert duals["omega"] >= 0
    else:
        assert set(duals) == {"party_000", "party_001", "party_002"}
        assert all(d["min"] >= 0 and d["max"] > 0 for d in duals.values())


# --- the iteration ------------------------------------------------------------------------------------

def test_full_forget_batch_then_ceil_delta_retained_mini_batches_per_iteration(fed_state):
    batch = resolve_request("class", [2], fed_state.clients, num_classes=3)
    forget, retained = fed_state.positions(batch)
    federation = fed_state.federation
    calls, messages = [], []
    backprop = federation.backprop
    federation.backprop = lambda positions, *args: calls.append(positions) or backprop(positions, *args)
    federation.channel.observers.append(messages.append)
    try:
        outcome = FedORA(iterations=4, patience=0, delta=0.25, dual="scalar").unlearn(fed_state, batch)
    finally:
        del federation.backprop
        federation.channel.observers.clear()
    substeps = math.ceil(0.25 * len(retained) / CONFIG.batch_size)
    iterations = outcome.certificate_inputs["iterations"]
    assert outcome.certificate_inputs["remaining_steps_per_iteration"] == substeps
    # One more full forget batch at the end: it measures the model the run returns.
    assert len(calls) == iterations * (1 + substeps) + 1
    for k in range(iterations):
        first, *rest = calls[k * (1 + substeps):(k + 1) * (1 + substeps)]
        assert torch.equal(first, forget)  # the full forget set, once per iteration
        assert all(len(b) <= CONFIG.batch_size and not torch.isin(b, forget).any() for b in rest)
    # Only embeddings, their gradients and a few scalars (Ω, ‖ΔΘ‖² shares, τ and σ) cross.
    assert {m.kind for m in messages} == {"embedding", "gradient", "scalar"}
    assert all(m.tensor.numel() <= 2 for m in messages if m.kind == "scalar")
    assert all(m.tensor.shape[1:] == (16,) for m in messages if m.kind != "scalar")
    assert len(outcome.certificate_inputs["step_sizes"]) == iterations


def test_fedora_is_registered_for_vfl_sample_and_class_requests_only():
    assert isinstance(get_method("fedora", setting="vfl", kind="sample"), FedORA)
    with pytest.raises(ValueError, match="does not support setting 'hfl'"):
        get_method("fedora", setting="hfl")
    with pytest.raises(ValueError, match="does not support setting 'vfl', kind 'client'"):
        get_method("fedora", setting="vfl", kind="client")
    with pytest.raises(ValueError, match="fedora: dual must be one of elementwise, scalar"):
        FedORA(dual="vector")
    with pytest.raises(ValueError, match="fedora: beta must be in"):
        FedORA(alpha=0.5, beta=0.6)


def test_label_unlearning_on_wine_drives_the_forgotten_class_to_uniform_predictions(fed_state):
    """Default hyperparameters, class 0 (49 of 142 training samples)."""
    batch = resolve_request("class", [0], fed_state.clients, num_classes=3)
    retrain = get_method("retrain", setting="vfl").unlearn(fed_state, batch)
    outcome = get_method("fedora").unlearn(fed_state, batch)

    forget, test = fed_state.forget_data(batch), fed_state.test
    model, reference = fed_state.model_from(outcome.state), fed_state.model_from(retrain.state)
    with torch.no_grad():
        forget_logits = model(forget.x)
    chance = 1 / 3
    assert float(entropy(forget_logits).mean()) >= 0.95 * math.log(3)  # near log C
    # Near-uniform predictions: the argmax of a near-tie is at chance, within two binomial standard
    # errors (a model that still recognised the class would score near 1).
    forget_acc = float((forget_logits.argmax(1) == forget.y).float().mean())
    assert forget_acc <= chance + 2 * math.sqrt(chance * (1 - chance) / len(forget))
    others = test.y != 0

    def accuracy_on_others(m):
        with torch.no_grad():
            return float((m(test.x[others]).argmax(1) == test.y[others]).float().mean())

    assert accuracy_on_others(model) >= accuracy_on_others(reference) - 0.05
    certificate = certificate_for(get_method_class("fedora"), outcome, batch_id=batch.batch_id)
    assert certificate.guarantee == certificate.claimed == CONSTRAINT_SATISFIED
    numbers = certificate.numbers
    assert numbers["L_u"] >= numbers["gamma"] == pytest.approx(0.9 * 2.0 * math.log(3) * len(forget))
    assert numbers["iterations"] <= 60 and len(numbers["step_sizes"]) == numbers["iterations"]
    # A third of wine is forgotten and the full forget batch runs every iteration: here FedORA
    # costs more than retraining (it pays off when |D_u| is small next to |D_r|·epochs).
    assert outcome.cost.comm_bytes > 0 and outcome.cost.flops > 0


def test_a_constraint_left_unmet_is_not_certified(fed_state):
    batch = resolve_request("class", [0], fed_state.clients, num_classes=3)
    outcome = FedORA(iterations=2, gamma=0.99).unlearn(fed_state, batch)
    certificate = certificate_for(get_method_class("fedora"), outcome)
    assert not outcome.certificate_inputs["satisfied"]
    assert certificate.guarantee == "not certified" and "final L_u >= gamma" in certificate.notes[0]
    assert np.isfinite(outcome.certificate_inputs["L_u"])


# --- class requests: the forgotten classes settled below the remaining ones -----------------------------

def test_the_suppression_shift_is_the_smallest_that_leaves_a_chance_share_near_the_top():
    generator = torch.Generator().manual_seed(0)
    logits = 0.05 * torch.randn(200, 5, generator=generator)  # near-uniform: a knife's edge
    labels = torch.tensor([0, 1] * 100)
    assert as_label_rate(logits, labels, 0.5) == 1.0  # every label within the margin of the top
    shift = suppression_shift(logits, labels, [0, 1], margin=0.5, chance=0.2)
    lowered = logits.clone()
    lowered[:, [0, 1]] -= shift
    assert shift > 0.5 and as_label_rate(lowered, labels, 0.5) <= 0.2
    lowered[:, [0, 1]] += 2e-4  # any smaller shift leaves more than the chance share
    assert as_label_rate(lowered, labels, 0.5) > 0.2
    # Already well below the remaining classes: nothing to lower.
    settled = logits.clone()
    settled[:, [0, 1]] -= 3.0
    assert suppression_shift(settled, labels, [0, 1], margin=0.5, chance=0.2) == 0.0
    # A row whose other forgotten class is far above its own label is not counted, whatever the shift.
    other = torch.tensor([[0.0, 5.0, 0.0]])
    assert suppression_shift(other.repeat(10, 1), torch.zeros(10, dtype=torch.long), [0, 1], 0.5, 0.0) == 0.0


def test_the_output_bias_is_the_last_linear_layer_over_the_classes():
    top = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3))
    assert output_bias(top, 3) is top[2].bias
    with pytest.raises(ValueError, match="no output bias over the 3 classes"):
        output_bias(torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False)), 3)


def forget_logits(fed_state, outcome, batch) -> tuple[torch.Tensor, torch.Tensor]:
    forget = fed_state.forget_data(batch)
    with torch.no_grad():
        return fed_state.model_from(outcome.state)(forget.x), forget.y


def test_a_run_whose_logits_are_perturbed_by_1e_6_ends_on_the_same_side_of_chance(fed_state):
    """Class 0 of wine (chance 1/3): the run as it is and the run with every logit of the top model
    perturbed by 1e-6 (another machine's float arithmetic) both end with the forgotten class
    predicted below chance — by a margin, so a perturbation of the final logits cannot flip it."""
    batch = resolve_request("class", [0], fed_state.clients, num_classes=3)
    top = fed_state.federation.active.model["top"]
    generator = torch.Generator().manual_seed(1)
    noise = top.register_forward_hook(lambda _m, _i, out: out + 1e-6 * torch.randn(out.shape, generator=generator))
    try:
        perturbed = get_method("fedora").unlearn(fed_state, batch)
    finally:
        noise.remove()
    plain = get_method("fedora").unlearn(fed_state, batch)
    for outcome in (plain, perturbed):
        numbers = outcome.certificate_inputs
        assert numbers["forgotten_as_label_rate"] <= numbers["chance"] == pytest.approx(1 / 3)
        assert numbers["assumptions"][FORGOTTEN_AT_MOST_CHANCE] and numbers["satisfied"]
        logits, labels = forget_logits(fed_state, outcome, batch)
        for draw in range(20):  # the evaluation's own float noise on top
            shaken = logits + 1e-6 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(draw))
            assert as_label_rate(shaken, labels, 0.0) <= numbers["forgotten_as_label_rate"] <= 1 / 3
    # The paper's iteration alone ends near uniform: most forget samples within the margin of the top,
    # where the float arithmetic decides the argmax.
    paper = FedORA(class_margin=None).unlearn(fed_state, batch)
    assert as_label_rate(*forget_logits(fed_state, paper, batch), 0.5) > 1 / 3


def test_a_class_request_still_recognised_is_not_certified_whatever_l_u_says(fed_state):
    batch = resolve_request("class", [0], fed_state.clients, num_classes=3)
    early = FedORA(iterations=1, class_margin=None, gamma=-0.99).unlearn(fed_state, batch)  # γ met at once
    certificate = certificate_for(get_method_class("fedora"), early)
    assert early.certificate_inputs["satisfied"] and early.certificate_inputs["forgotten_as_label_rate"] > 1 / 3
    assert certificate.guarantee == "not certified" and FORGOTTEN_AT_MOST_CHANCE in certificate.notes[0]
    # A sample request states no class figures and makes no such assumption.
    samples = resolve_request("sample", list(fed_state.forget_data(batch).sample_ids[:5]), fed_state.clients)
    numbers = FedORA(iterations=2).unlearn(fed_state, samples).certificate_inputs
    assert "forgotten_as_label_rate" not in numbers and FORGOTTEN_AT_MOST_CHANCE not in numbers["assumptions"]


def test_the_run_stops_at_the_first_model_after_patience_that_meets_the_constraint(fed_state):
    batch = resolve_request("class", [0], fed_state.clients, num_classes=3)
    numbers = FedORA(patience=3).unlearn(fed_state, batch).certificate_inputs
    assert numbers["stopped_by_rule"] and numbers["satisfied"]
    assert numbers["iterations"] >= numbers["first_satisfied_iteration"] - 1 + 3
    capped = FedORA(iterations=2, gamma=0.99).unlearn(fed_state, batch).certificate_inputs
    assert not capped["stopped_by_rule"] and capped["iterations"] == 2
