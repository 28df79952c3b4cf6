"""HF-KCU on L2-regularised logistic regression over breast_cancer, 10 IID clients, float64.

The convex oracle: the original model sits at the exact optimum of the mean objective over all
training data, and the retrained optimum is computed exactly too (Newton's method on the same
objective, written out here independently of the code under test), so the unlearning step is
measured against the truth rather than against training noise. The certificate's checks: an MLP
whose damped Hessian is indefinite (eigenvalues computed explicitly) is not certified, nor is a
step the β cap truncated. The end-to-end run on digits-hfl is in test_puf.py, on the same
federation as PUF's.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedunlearn.certify.certificate import BOUNDED_APPROXIMATION, NOT_CERTIFIED, certificate_for
from fedunlearn.config import TrainConfig
from fedunlearn.data.datasets import load_source
from fedunlearn.data.partition import assign_iid, holdout_mask
from fedunlearn.federation.fedavg import map_inline
from fedunlearn.federation.local import Tensors
from fedunlearn.unlearning import ForgetSet, FederatedState, get_method, resolve_request
from fedunlearn.unlearning.krylov import flat_objective, flatten_parameters
from fedunlearn.unlearning.registry import get_method_class
from models.logreg import LogisticRegression
from models.mlp import MLP

CPU = torch.device("cpu")
SEED = 0
L2 = 0.01
FEATURES, CLASSES = 30, 2
DIM = (FEATURES + 1) * CLASSES


@pytest.fixture(scope="module", autouse=True)
def float64():
    """The oracle needs float64 (gradient norms of 1e-10); models and FLOP probes follow the default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def explicit_objective(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean CE + (l2/2)‖θ‖² of the logistic regression, θ = (weight row-major, bias)."""
    w, b = theta[:FEATURES * CLASSES].view(CLASSES, FEATURES), theta[FEATURES * CLASSES:]
    return F.cross_entropy(x @ w.T + b, y) + 0.5 * L2 * theta.pow(2).sum()


def joined(parts: list[Tensors]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts])


def hessian(parts: list[Tensors], theta: torch.Tensor) -> torch.Tensor:
    x, y = joined(parts)
    return torch.autograd.functional.hessian(lambda t: explicit_objective(t, x, y), theta)


def grad(parts: list[Tensors], theta: torch.Tensor) -> torch.Tensor:
    x, y = joined(parts)
    return torch.autograd.functional.jacobian(lambda t: explicit_objective(t, x, y), theta)


def exact_optimum(parts: list[Tensors]) -> dict[str, torch.Tensor]:
    """Newton's method to ‖∇‖ < 1e-10 on the mean objective over ``parts``."""
    theta = torch.zeros(DIM)
    for _ in range(50):
        g = grad(parts, theta)
        if g.norm() < 1e-10:
            break
        theta = theta - torch.linalg.solve(hessian(parts, theta), g)
    assert grad(parts, theta).norm() < 1e-10
    return state_of(theta)


def state_of(theta: torch.Tensor) -> dict[str, torch.Tensor]:
    weights = FEATURES * CLASSES
    return {"linear.weight": theta[:weights].view(CLASSES, FEATURES), "linear.bias": theta[weights:]}


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state["linear.weight"].reshape(-1), state["linear.bias"]])


def distance(a, b) -> float:
    return float((flat(a) - flat(b)).norm())


@pytest.fixture(scope="module")
def federation(float64) -> FederatedState:
    data = load_source("breast_cancer")
    is_test = holdout_mask(data.sample_ids, SEED, 0.2)
    x = data.features.astype(np.float64)
    x = (x - x[~is_test].mean(0)) / x[~is_test].std(0)  # standardised on the training rows, as partitioning does

    def tensors(rows: np.ndarray) -> Tensors:
        return Tensors(torch.tensor(x[rows]), torch.tensor(data.labels[rows]), data.sample_ids[rows])

    train_rows = np.flatnonzero(~is_test)
    owner = assign_iid(data.sample_ids[train_rows], 10, SEED)
    clients = [tensors(train_rows[owner == c]) for c in range(10)]
    return FederatedState("hfl", lambda: LogisticRegression((FEATURES,), CLASSES, l2=L2), exact_optimum(clients),
                          clients, tensors(np.flatnonzero(is_test)), TrainConfig(), SEED, CPU, CLASSES)


def forget_share(federation: FederatedState, share: float, spread: bool, seed: int = 1) -> ForgetSet:
    """``share`` of all training samples, drawn from the largest client or from every client."""
    ids = np.concatenate([c.sample_ids for c in federation.clients])
    if not spread:
        ids = max(federation.clients, key=len).sample_ids
    count = round(share * sum(len(c) for c in federation.clients))
    return ForgetSet.for_sample_ids(np.random.default_rng(seed).choice(ids, size=count, replace=False),
                                        federation.clients)


NEWTON = {"hessian": "federation", "weights": "sum", "beta": None, "damping": 0.0, "cg_iterations": 40}


@pytest.mark.parametrize("share, spread", [(0.01, False), (0.05, False), (0.01, True), (0.05, True)])
def test_the_step_lands_ten_times_closer_to_the_exactly_retrained_optimum(federation, share, spread):
    batch = forget_share(federation, share, spread)
    assert spread == (len(batch.affected_clients) > 1)
    retrained = exact_optimum(federation.retained_clients(batch))
    outcome = get_method("hf-kcu", **NEWTON).unlearn(federation, batch)

    before, after = distance(federation.state, retrained), distance(outcome.state, retrained)
    assert after * 10 <= before, f"{before:.3g} -> {after:.3g}"
    # The paper's literal sign, θ − Δθ, moves away from the retrained optimum.
    literal = {k: 2 * federation.state[k] - outcome.state[k] for k in outcome.state}
    assert distance(literal, retrained) > before
    numbers = outcome.certificate_inputs
    assert max(numbers["cg_relative_residual"].values()) < 1e-8
    assert max(numbers["newton_relative_residual"].values()) < 1e-8
    assert numbers["assumptions"] == {"positive_definite_damped_hessian": True, "untruncated_newton_step": True,
                                      "newton_residual_within_tolerance": True}
    # Undamped, H_r = mean CE Hessian + l2·I has λ_min = l2 exactly (softmax's null directions); the
    # estimate, a Rayleigh quotient, is never below it.
    assert all(L2 * (1 - 1e-9) <= lam <= L2 * (1 + 1e-3) for lam in numbers["lambda_min_estimate"].values())
    assert all(1 < kappa < 1e4 for kappa in numbers["condition_estimate"].values())
    assert certificate_for(get_method_class("hf-kcu"), outcome).guarantee == BOUNDED_APPROXIMATION


def test_a_step_the_beta_cap_truncates_is_not_certified(federation):
    """The paper's β = 0.01 cuts the step to 22 % of its length here: it covers 14 % of the way to
    the retrained optimum, and a truncated step bounds nothing. Without the cap, CG converged, the
    same step is a bounded approximation — of the damped step, whose bias the certificate states."""
    batch = forget_share(federation, 0.05, spread=False)
    (client,) = batch.affected_clients
    retrained = exact_optimum(federation.retained_clients(batch))
    before = distance(federation.state, retrained)
    capped = get_method("hf-kcu", hessian="federation").unlearn(federation, batch)
    free = get_method("hf-kcu", hessian="federation", beta=None).unlearn(federation, batch)

    assert capped.certificate_inputs["scale"][client] < 0.25 and distance(capped.state, retrained) > 0.8 * before
    certificate = certificate_for(get_method_class("hf-kcu"), capped)
    assert certificate.guarantee == NOT_CERTIFIED and not certificate.assumptions["untruncated_newton_step"]
    assert certificate.notes[0].endswith("assumption(s) not satisfied: untruncated_newton_step")

    numbers = free.certificate_inputs
    assert numbers["scale"][client] == 1 and numbers["newton_relative_residual"][client] <= 1e-3
    assert certificate_for(get_method_class("hf-kcu"), free).guarantee == BOUNDED_APPROXIMATION
    # λ = 0.01 next to λ_min(H_r) = l2 = 0.01: the damped step may be off the Newton step (≈ the
    # retrained optimum here) by λ/λ_min(H_r + λI) = 1/2 of it, and it is.
    assert numbers["damping_bias_estimate"][client] == pytest.approx(0.5, rel=1e-3)
    assert 0.3 * before < distance(free.state, retrained) <= numbers["damping_bias_estimate"][client] * before


def test_client_hessian_steps_and_both_combinations_match_explicit_solves(federation):
    batch = resolve_request("sample", {"clients": [2, 7], "fraction": 0.2, "seed": 0}, federation.clients)
    theta = flat(federation.state)
    retained, forget = federation.retained_clients(batch), federation.forget_by_client(batch)
    n_retained = sum(len(c) for c in retained)
    damping = 0.1
    gradients = {c: len(forget[c]) * grad([forget[c]], theta) for c in forget}
    steps = {c: torch.linalg.solve(hessian([retained[c]], theta) + damping * torch.eye(DIM), g / n_retained)
             for c, g in gradients.items()}
    alphas = {c: float(g.norm()) / sum(float(h.norm()) for h in gradients.values()) for c, g in gradients.items()}

    exact = {"hessian": "client", "damping": damping, "beta": None, "cg_iterations": DIM}
    summed = get_method("hf-kcu", weights="sum", **exact).unlearn(federation, batch)
    causal = get_method("hf-kcu", weights="causal", **exact).unlearn(federation, batch)
    torch.testing.assert_close(flat(summed.state) - theta, steps[2] + steps[7])
    torch.testing.assert_close(flat(causal.state) - theta, alphas[2] * steps[2] + alphas[7] * steps[7])
    assert causal.certificate_inputs["causal_weights"] == pytest.approx(alphas)
    assert summed.certificate_inputs["curvature_samples"] == {c: len(retained[c]) for c in (2, 7)}


def test_a_removed_client_uses_its_own_data_for_curvature(federation):
    outcome = get_method("hf-kcu").unlearn(federation, resolve_request("client", 4, federation.clients))
    assert outcome.certificate_inputs["curvature_samples"] == {4: len(federation.clients[4])}
    assert outcome.notes["target_clients"] == [4]


def test_adaptive_scale_caps_the_step_at_beta_times_the_model_norm(federation):
    batch = forget_share(federation, 0.05, spread=False)
    beta = 1e-3
    capped = get_method("hf-kcu", beta=beta).unlearn(federation, batch)
    free = get_method("hf-kcu", beta=None).unlearn(federation, batch)
    (client,) = batch.affected_clients
    assert capped.certificate_inputs["scale"][client] < 1 and free.certificate_inputs["scale"][client] == 1
    assert capped.certificate_inputs["step_norm"] == pytest.approx(beta * float(flat(federation.state).norm()))
    assert free.certificate_inputs["step_norm"] > capped.certificate_inputs["step_norm"]


def mlp_federation(sgd_steps: int) -> tuple[FederatedState, torch.nn.Module]:
    """An MLP (8 hidden units, 682 parameters) after ``sgd_steps`` full-batch steps on 300 digits,
    its samples dealt to 3 clients."""
    data = load_source("digits")
    x = torch.tensor(data.features.reshape(len(data.features), -1)[:300], dtype=torch.float64)
    y, ids = torch.tensor(data.labels[:300]), data.sample_ids[:300]
    torch.manual_seed(0)
    model = MLP((64,), 10, hidden=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    for _ in range(sgd_steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    clients = [Tensors(x[c::3], y[c::3], ids[c::3]) for c in range(3)]
    state = {k: v.detach() for k, v in model.state_dict().items()}
    return FederatedState("hfl", lambda: MLP((64,), 10, hidden=8), state, clients, clients[0], TrainConfig(), SEED,
                          CPU, 10), model


def test_an_indefinite_damped_hessian_is_not_certified():
    """After 300 steps H_r + 0.01 I has negative eigenvalues, but CG's step sizes are all positive
    (its Ritz values too: they have the same signs), which is all the former check looked at. The
    Lanczos run from a random start finds the negative curvature."""
    fed_state, model = mlp_federation(300)
    batch = resolve_request("sample", {"clients": [0], "fraction": 0.1, "seed": 0}, fed_state.clients)
    outcome = get_method("hf-kcu", hessian="federation", beta=None).unlearn(fed_state, batch)

    retained = fed_state.retained_clients(batch)
    x_r, y_r = torch.cat([c.x for c in retained]), torch.cat([c.y for c in retained])
    curvature = torch.func.hessian(flat_objective(model, x_r, y_r))(flatten_parameters(model))
    eigenvalues = torch.linalg.eigvalsh(curvature + 0.01 * torch.eye(len(curvature)))
    assert int((eigenvalues < 0).sum()) >= 5 and float(eigenvalues[0]) < -0.01
    numbers = outcome.certificate_inputs
    assert numbers["ritz_range"][0][0] > 0 and numbers["lanczos_ran"] == {0: True}  # CG alone saw none
    estimate = numbers["lambda_min_estimate"][0]
    assert float(eigenvalues[0]) - 1e-9 <= estimate < 0  # a Rayleigh quotient: never below λ_min
    assert numbers["condition_estimate"][0] is None
    certificate = certificate_for(get_method_class("hf-kcu"), outcome)
    assert certificate.guarantee == NOT_CERTIFIED and not certificate.assumptions["positive_definite_damped_hessian"]


def test_negative_curvature_met_by_cg_itself_needs_no_lanczos_run():
    """Untrained, CG meets the negative curvature (an α_t < 0): that proves it, m products saved."""
    fed_state, _ = mlp_federation(0)
    batch = resolve_request("sample", {"clients": [0], "fraction": 0.1, "seed": 0}, fed_state.clients)
    k, m = 10, 20
    outcome = get_method("hf-kcu", beta=None, cg_iterations=k, lanczos_steps=m).unlearn(fed_state, batch)
    numbers = outcome.certificate_inputs
    assert numbers["lanczos_ran"] == {0: False} and numbers["lambda_min_estimate"][0] == numbers["ritz_range"][0][0] < 0
    assert not certificate_for(get_method_class("hf-kcu"), outcome).assumptions["positive_definite_damped_hessian"]
    per_product = 2 * len(fed_state.retained_clients(batch)[0]) * fed_state.flops_per_sample()
    assert outcome.cost.flops == batch.num_forget * fed_state.flops_per_sample() + (k + 1) * per_product


@pytest.mark.parametrize("hessian", ["client", "federation"])
def test_mini_batch_curvature_and_costs(federation, hessian):
    batch = resolve_request("sample", {"clients": [1, 5], "fraction": 0.2, "seed": 0}, federation.clients)
    k, m, size = 3, 5, 16
    outcome = get_method("hf-kcu", hessian=hessian, hessian_batch=size, cg_iterations=k,
                         lanczos_steps=m).unlearn(federation, batch)
    numbers = outcome.certificate_inputs
    per_product = size if hessian == "client" else size * len(federation.clients)
    assert numbers["curvature_samples"] == {1: per_product, 5: per_product}
    assert numbers["hessian_batch"] == size and len(numbers["cg_residual_norms"][1]) == k + 1

    # Per affected client k CG products and the true residual's; m Lanczos products per operator:
    # each client's own, or the federation's one, every product of which is a round over 10 clients.
    products = 2 * (k + 1 + m) if hessian == "client" else 2 * (k + 1) + m
    flops_per_sample = 3 * 2 * FEATURES * CLASSES  # one linear layer, forward + backward
    assert outcome.cost.flops == flops_per_sample * (batch.num_forget + 2 * products * per_product)
    exchanges = 2 if hessian == "client" else 2 + products * len(federation.clients)
    assert outcome.cost.comm_bytes == 2 * DIM * 4 * exchanges


def test_federated_curvature_is_computed_on_retained_data_only(federation):
    batch = resolve_request("sample", {"clients": [3, 6], "fraction": 0.3, "seed": 0}, federation.clients)
    seen: list[tuple[int, set[str]]] = []

    def map_updates(fn, jobs):
        seen.extend((job["client"], set(job["data"].sample_ids.tolist())) for job in jobs)
        return map_inline(fn, jobs)

    k, m = 2, 4
    spy = dataclasses.replace(federation, map_updates=map_updates)
    get_method("hf-kcu", hessian="federation", cg_iterations=k, lanczos_steps=m).unlearn(spy, batch)
    forget, retained = federation.forget_by_client(batch), federation.retained_clients(batch)
    assert seen[:2] == [(c, set(forget[c].sample_ids.tolist())) for c in (3, 6)]  # g_i at the affected clients
    one_product = [(c, set(r.sample_ids.tolist())) for c, r in enumerate(retained)]  # then every client's H_j p
    assert seen[2:] == one_product * ((k + 1) * 2 + m)  # CG and the residual per affected client, then Lanczos


def test_hyperparameters_are_validated():
    with pytest.raises(ValueError, match="hf-kcu: hessian must be one of client, federation"):
        get_method("hf-kcu", hessian="global")
    with pytest.raises(ValueError, match="hf-kcu: beta must be > 0 or None"):
        get_method("hf-kcu", beta=0.0)
    with pytest.raises(ValueError, match="hf-kcu: lanczos_steps must be an integer >= 1"):
        get_method("hf-kcu", lanczos_steps=0)
    with pytest.raises(ValueError, match="hf-kcu: residual_tolerance must be > 0"):
        get_method("hf-kcu", residual_tolerance=0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_same_step_on_cuda(federation):
    cuda = torch.device("cuda")

    def moved(t: Tensors) -> Tensors:
        return Tensors(t.x.to(cuda), t.y.to(cuda), t.sample_ids)

    on_gpu = dataclasses.replace(federation, state={k: v.to(cuda) for k, v in federation.state.items()},
                                 clients=[moved(c) for c in federation.clients], test=moved(federation.test),
                                 device=cuda)
    batch = forget_share(federation, 0.05, spread=True)
    gpu = get_method("hf-kcu", **NEWTON).unlearn(on_gpu, batch)
    cpu = get_method("hf-kcu", **NEWTON).unlearn(federation, batch)
    assert all(v.is_cuda for v in gpu.state.values())
    assert math.isclose(distance({k: v.cpu() for k, v in gpu.state.items()}, cpu.state), 0, abs_tol=1e-8)
