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
from fedunlearn.unlearning.fedora import dual_update, entropy, kl_to_uniform, uncertainty_loss
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
    assert len(calls) == iterations * (1 + substeps)
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
