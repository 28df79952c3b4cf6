"""Certified decentralized unlearning: the noise calibration and its empirical scale, the convex
oracle (noise off: the step lands ≥ 10× closer to the EXACT retrained optimum, computed here
independently by float64 Newton with autograd Hessians), honest certificates (formal only when
every assumption holds; a CNN is not certified), the residual budget as a sum since the last
retrain (never overdrawn: a bound that does not fit triggers a reported retrain, which resets
it), how the releases compose, and sequential batches with the budget and the drift from
retraining tracked."""

import dataclasses
import hashlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedunlearn.certify.budget import ResidualBudget, classical_delta, composition, gaussian_delta, gaussian_sigma
from fedunlearn.certify.certificate import FORMAL, NOT_CERTIFIED, certificate_for
from fedunlearn.config import TrainConfig
from fedunlearn.data.datasets import load_source
from fedunlearn.data.partition import assign_iid, holdout_mask
from fedunlearn.federation.dpsgd import DPSGD, average_state
from fedunlearn.federation.local import State, Tensors, accuracy
from fedunlearn.federation.topology import ring
from fedunlearn.unlearning import ForgetSet, FederatedState, available_methods, get_method, resolve_request
from fedunlearn.unlearning.certified_dfu import (CertifiedDFU, FlatObjective, gaussian_noise, logreg_constants,
                                                 paper_sensitivity, precompute_statistics)
from fedunlearn.unlearning.dfl_retrain import DecentralizedState, unlearn_sequence
from models import build_model

CPU = torch.device("cpu")
L2 = 0.01


def tabular(name: str, num_clients: int) -> tuple[list[Tensors], Tensors, int]:
    """Standardised, unit-norm features split IID over ``num_clients`` (as the DFL scenarios)."""
    data = load_source(name)
    is_test = holdout_mask(data.sample_ids, 0, 0.2)
    x = (data.features - data.features[~is_test].mean(0)) / data.features[~is_test].std(0)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    owner = assign_iid(data.sample_ids[~is_test], num_clients, 0)
    clients = [Tensors.from_arrays(x[~is_test][owner == c], data.labels[~is_test][owner == c],
                                   data.sample_ids[~is_test][owner == c], CPU) for c in range(num_clients)]
    return clients, Tensors.from_arrays(x[is_test], data.labels[is_test], data.sample_ids[is_test], CPU), \
        data.num_classes


def exact_optimum(model_fn, clients: list[Tensors]) -> torch.Tensor:
    """argmin (1/|K|) Σ_{i∈K} [mean CE_i + (λ/2)‖θ‖²] over the clients with data: float64 Newton
    with ``torch.func.hessian`` (independent of the method's closed-form curvature), to ‖∇‖ < 1e-10."""
    model = model_fn()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    active = [c for c in clients if len(c)]

    def loss(theta: torch.Tensor) -> torch.Tensor:
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(theta, sizes), shapes)}
        total = sum(F.cross_entropy(functional_call(model, params, (c.x.double(),)), c.y) for c in active)
        return total / len(active) + 0.5 * model.l2 * (theta ** 2).sum()

    theta = torch.zeros(sum(sizes), dtype=torch.float64)
    for _ in range(50):
        gradient = torch.func.grad(loss)(theta)
        if gradient.norm() < 1e-10:
            return theta
        theta = theta - torch.linalg.solve(torch.func.hessian(loss)(theta), gradient)
    raise AssertionError("Newton did not converge")


def oracle_state(name: str, num_clients: int) -> tuple[DecentralizedState, FlatObjective]:
    """Every node holds the exact optimum of the training objective (the state D-PSGD approximates)."""
    clients, test, classes = tabular(name, num_clients)
    features = clients[0].x.shape[1]
    model_fn = lambda: build_model("logreg", (features,), classes, l2=L2)  # noqa: E731
    problem = FlatObjective(model_fn, CPU)
    start = model_fn().state_dict()
    state = problem.unflatten(exact_optimum(model_fn, clients), start)
    fed_state = DecentralizedState("dfl", model_fn, state, clients, test, TrainConfig(rounds=30, lr=0.5, batch_size=16),
                                   0, CPU, classes, topology=ring(num_clients))
    return fed_state, problem


@pytest.fixture(scope="module")
def breast_cancer_oracle():
    return oracle_state("breast_cancer", 4)


@pytest.fixture(scope="module")
def breast_cancer_trained() -> DecentralizedState:
    """breast_cancer-dfl-ring as params.yaml has it: D-PSGD, 4 nodes on a ring, 30 rounds."""
    clients, test, classes = tabular("breast_cancer", 4)
    model_fn = lambda: build_model("logreg", (30,), classes, l2=L2)  # noqa: E731
    config = TrainConfig(rounds=30, lr=0.5, batch_size=16)
    nodes = DPSGD(model_fn, config, ring(4), 0, CPU).fit(clients)
    return DecentralizedState("dfl", model_fn, average_state(nodes), clients, test, config, 0, CPU, classes,
                              topology=ring(4), node_states=nodes)


def distance(problem: FlatObjective, state: State, theta: torch.Tensor) -> float:
    return float((problem.flatten(state) - theta).norm())


# --- calibration -------------------------------------------------------------------------------------

def test_sigma_is_the_classical_gaussian_calibration_and_valid_at_epsilon_one():
    assert gaussian_sigma(2e-3, 1.0, 1e-5) == pytest.approx(2e-3 * math.sqrt(2 * math.log(1.25e5)))
    assert gaussian_sigma(1.0, 0.5, 1e-3) == pytest.approx(2 * math.sqrt(2 * math.log(1250)))
    # The exact privacy profile (Balle & Wang) at that σ: well below δ at ε = 1, above it at ε = 10.
    assert classical_delta(1.0, 1e-5) < 1e-7 and classical_delta(10.0, 1e-5) > 1e-5
    assert gaussian_delta(0.0, 1.0, 1.0) == 0.0
    with pytest.raises(ValueError, match=r"certified-dfu: epsilon must be a value where .*exact δ 2.27e-05"):
        CertifiedDFU(epsilon=10.0)


def test_noise_has_the_calibrated_scale_whatever_the_number_of_shares():
    for shares in (1, 4):
        noise = gaussian_noise(40_000, 0.25, shares, [3, 4])
        assert float(noise.std()) == pytest.approx(0.25, rel=0.02) and abs(float(noise.mean())) < 0.01
    assert torch.equal(gaussian_noise(10, 1.0, 3, [5]), gaussian_noise(10, 1.0, 3, [5]))
    assert not torch.equal(gaussian_noise(10, 1.0, 3, [5]), gaussian_noise(10, 1.0, 3, [6]))


def test_every_node_holds_the_optimum_plus_exactly_the_calibrated_noise(breast_cancer_oracle):
    fed_state, problem = breast_cancer_oracle
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.03, fed_state.clients, seed=1)
    quiet = get_method("certified-dfu", setting="dfl", noise=False).unlearn(fed_state, batch)
    noisy = get_method("certified-dfu", setting="dfl", noise_seed=7).unlearn(fed_state, batch)
    sigma = noisy.certificate_inputs["sigma"]
    assert sigma == pytest.approx(gaussian_sigma(1e-3, 1.0, 1e-5))
    batch_key = int(hashlib.sha256(batch.batch_id.encode()).hexdigest(), 16)
    expected = gaussian_noise(problem.num_params, sigma, 4, [7, batch_key])
    assert torch.allclose(problem.flatten(noisy.state) - problem.flatten(quiet.state), expected, atol=1e-6)
    assert all(torch.equal(node["linear.weight"], noisy.state["linear.weight"]) for node in noisy.node_states)


def test_logistic_regression_gradient_and_curvature_in_closed_form_match_autograd():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(9, 4)))
    y = torch.as_tensor(rng.integers(0, 3, 9))
    problem = FlatObjective(lambda: build_model("logreg", (4,), 3, l2=0.1), CPU)
    theta = torch.as_tensor(rng.normal(size=problem.num_params))
    group = torch.as_tensor([0] * 4 + [1] * 5)
    sums = problem.curvature_sums("exact", theta, x, y, group, 2)
    ones = torch.ones(9, dtype=torch.float64)
    for g, rows in ((0, slice(0, 4)), (1, slice(4, 9))):
        expected = torch.func.hessian(problem.loss)(theta, x[rows], y[rows], ones[rows], False)
        assert torch.allclose(sums[g].double(), expected, atol=1e-5)
    weights = torch.as_tensor(rng.random(9))
    assert torch.allclose(problem.gradient(theta, x, y, weights), torch.func.grad(problem.loss)(theta, x, y, weights))
    fisher = problem.curvature_sums("fisher-diag", theta, x, y, group, 2)
    per_sample = torch.stack([problem.gradient(theta, x[i:i + 1], y[i:i + 1], ones[:1]) - 0.1 * theta
                              for i in range(9)])
    assert torch.allclose(fisher[1].double(), (per_sample[4:] ** 2).sum(0), atol=1e-5)


def test_lipschitz_constants_bound_what_the_loss_does():
    rng = np.random.default_rng(1)
    lam, classes, features = 0.05, 3, 4
    constants = logreg_constants(lam, 1.0)
    assert constants["L"] == pytest.approx(4.0) and constants["M"] == pytest.approx(6 * math.sqrt(2))
    problem = FlatObjective(lambda: build_model("logreg", (features,), classes, l2=lam), CPU)
    x = rng.normal(size=(50, features))
    x = torch.as_tensor(x / np.linalg.norm(x, axis=1, keepdims=True))
    y = torch.as_tensor(rng.integers(0, classes, 50))
    one = torch.ones(1, dtype=torch.float64)
    for _ in range(20):
        theta_a, theta_b = (torch.as_tensor(rng.normal(size=problem.num_params)) for _ in range(2))
        theta_a = theta_a / theta_a.norm() * constants["weight_bound"] * rng.random()
        i = int(rng.integers(50))
        assert float(problem.gradient(theta_a, x[i:i + 1], y[i:i + 1], one).norm()) <= constants["L"]
        group = torch.zeros(1, dtype=torch.long)
        gap = problem.curvature_sums("exact", theta_a, x[i:i + 1], y[i:i + 1], group, 1) \
            - problem.curvature_sums("exact", theta_b, x[i:i + 1], y[i:i + 1], group, 1)
        lipschitz = float(torch.linalg.matrix_norm(gap[0].double(), ord=2)) / float((theta_a - theta_b).norm())
        assert lipschitz <= constants["M"]
    assert paper_sensitivity(4.0, 2.0, 0.1, 5, 100) == pytest.approx(2 * 2.0 * 16 * 25 / (1e-3 * 1e4))


# --- convex oracle -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fraction", [0.01, 0.03, 0.05])
def test_removal_step_lands_ten_times_closer_to_the_exact_retrained_optimum(breast_cancer_oracle, fraction):
    fed_state, problem = breast_cancer_oracle
    for clients in ([0, 1, 2, 3], [2]):
        batch = ForgetSet.for_fraction(clients, fraction, fed_state.clients, seed=3)
        target = exact_optimum(fed_state.model_fn, fed_state.retained_clients(batch))
        before = distance(problem, fed_state.state, target)
        one_step = get_method("certified-dfu", setting="dfl", noise=False, newton_steps=1).unlearn(fed_state, batch)
        default = get_method("certified-dfu", setting="dfl", noise=False).unlearn(fed_state, batch)
        assert distance(problem, one_step.state, target) <= before / 10
        assert distance(problem, default.state, target) <= distance(problem, one_step.state, target) + 1e-6
        # The measured bound is a bound: ‖ŵ − w*_r‖ ≤ ‖∇L_r(ŵ)‖/λ.
        assert distance(problem, one_step.state, target) <= one_step.certificate_inputs["residual_bound"] * (1 + 1e-4)


@pytest.mark.parametrize("kind, subject", [("class", 1), ("client", 2)])
def test_class_and_client_removal_land_ten_times_closer(kind, subject):
    fed_state, problem = oracle_state("wine", 4)
    batch = resolve_request(kind, subject, fed_state.clients, num_classes=fed_state.num_classes)
    target = exact_optimum(fed_state.model_fn, fed_state.retained_clients(batch))
    before = distance(problem, fed_state.state, target)
    outcome = get_method("certified-dfu", setting="dfl", noise=False).unlearn(fed_state, batch)
    assert distance(problem, outcome.state, target) <= before / 10
    assert outcome.notes["action"] == "newton"
    if kind == "client":
        assert outcome.node_states[subject] is None and outcome.notes["nodes"] == 3


# --- certificates ------------------------------------------------------------------------------------

def test_certificate_is_formal_only_when_every_assumption_holds(breast_cancer_oracle):
    fed_state, _ = breast_cancer_oracle
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.05, fed_state.clients, seed=4)
    method = get_method("certified-dfu", setting="dfl")
    outcome = method.unlearn(fed_state, batch)
    certificate = certificate_for(method, outcome)
    numbers = certificate.numbers
    assert certificate.guarantee == FORMAL and all(certificate.assumptions.values())
    assert numbers["calibration"] == "residual" and (numbers["epsilon"], numbers["delta"]) == (1.0, 1e-5)
    assert numbers["residual_bound"] <= numbers["residual_budget"] == 1e-3
    assert numbers["budget_left"] == pytest.approx(1e-3 - numbers["residual_bound"])
    # One release since the (virtual) retrain: composed = per-release, basic composition agrees.
    assert numbers["releases_since_retrain"] == 1 and numbers["triggering_bound"] is None
    assert (numbers["composed_epsilon"], numbers["composed_delta"]) == (1.0, numbers["delta_exact"])
    assert numbers["composed_basic"] == {"epsilon": 1.0, "delta": 1e-5}
    assert numbers["delta_exact"] <= 1e-5 and numbers["constants"]["R"] == pytest.approx(1.0, abs=1e-5)
    for hyperparameters, failing in (({"noise": False}, "noise_added"), ({"noise_seed": 1}, "secret_noise"),
                                     ({"calibration": "paper", "hessian": "fisher-diag"}, "exact_or_bounded_hessian")):
        other = get_method("certified-dfu", setting="dfl", **hyperparameters)
        downgraded = certificate_for(other, other.unlearn(fed_state, batch))
        assert downgraded.guarantee == NOT_CERTIFIED and failing in downgraded.notes[0]


def test_paper_calibration_uses_the_a_priori_bound(breast_cancer_oracle):
    fed_state, _ = breast_cancer_oracle
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.1, fed_state.clients, seed=5)
    method = get_method("certified-dfu", setting="dfl", calibration="paper")
    outcome = method.unlearn(fed_state, batch)
    numbers = outcome.certificate_inputs
    constants = numbers["constants"]
    assert numbers["sensitivity"] == pytest.approx(paper_sensitivity(constants["L"], constants["M"], L2,
                                                                    constants["m"], constants["n"]))
    assert numbers["sigma"] == pytest.approx(gaussian_sigma(numbers["sensitivity"], 1.0, 1e-5))
    assert numbers["sigma"] > 1e4
    assert numbers["residual_bound"] <= numbers["sensitivity"] and outcome.notes["newton_steps"] == 1
    assert certificate_for(method, outcome).guarantee == FORMAL
    assert accuracy(fed_state.model_from(outcome.state), fed_state.test) < 0.9  # the a-priori noise wrecks it


def test_a_network_is_unlearned_but_not_certified():
    data = load_source("digits")
    clients = [Tensors.from_arrays(data.features[i::5][:60], data.labels[i::5][:60], data.sample_ids[i::5][:60], CPU)
               for i in range(2)]
    model_fn = lambda: build_model("cnn", (1, 8, 8), 10)  # noqa: E731
    torch.manual_seed(0)
    fed_state = DecentralizedState("dfl", model_fn, model_fn().state_dict(), clients, clients[0], TrainConfig(),
                                   0, CPU, 10, topology=ring(2))
    batch = ForgetSet.for_fraction([0], 0.1, clients, seed=0)
    method = get_method("certified-dfu", setting="dfl", hessian="fisher-diag", damping=0.1, newton_steps=1)
    outcome = method.unlearn(fed_state, batch)
    certificate = certificate_for(method, outcome)
    assert certificate.guarantee == NOT_CERTIFIED and "strongly_convex" in certificate.notes[0]
    assert not torch.equal(outcome.state["classifier.2.weight"], fed_state.state["classifier.2.weight"])
    assert outcome.certificate_inputs["residual_bound"] == math.inf and outcome.budget is None
    with pytest.raises(ValueError, match="calibration 'paper' needs a λ-strongly convex model"):
        get_method("certified-dfu", setting="dfl", calibration="paper", hessian="fisher-diag").unlearn(fed_state, batch)


def test_registered_for_dfl_only_and_needs_a_topology(breast_cancer_oracle):
    assert {"certified-dfu", "retrain"} <= set(available_methods("dfl", "client"))
    assert "certified-dfu" not in available_methods("hfl")
    with pytest.raises(ValueError, match="calibration must be one of residual, paper"):
        get_method("certified-dfu", calibration="tight")
    fed_state, _ = breast_cancer_oracle
    plain = FederatedState("dfl", fed_state.model_fn, fed_state.state, fed_state.clients, fed_state.test,
                           fed_state.train_config, 0, CPU, 2)
    with pytest.raises(TypeError, match="need a DecentralizedState"):
        get_method("certified-dfu", setting="dfl").unlearn(plain, ForgetSet.for_clients([0], plain.clients))


# --- budget and sequences ----------------------------------------------------------------------------

def test_the_budget_sums_the_bounds_since_the_last_retrain_and_is_never_overdrawn():
    ledger = ResidualBudget(1e-3).charge("b1", 2e-4, "newton").charge("b2", 5e-4, "newton")
    assert (ledger.used, ledger.left, ledger.retrains) == (pytest.approx(7e-4), pytest.approx(3e-4), 0)
    assert [e.budget_used for e in ledger.entries] == [2e-4, pytest.approx(7e-4)]
    assert ledger.admits(3e-4 * (1 - 1e-9)) and not ledger.admits(4e-4)
    with pytest.raises(ValueError, match="does not fit in the 0.0003 left of the residual budget: retrain"):
        ledger.charge("b3", 4e-4, "newton")
    # The retrain starts a new sum with the bound after it, and records the bound that triggered it.
    later = ledger.charge("b3", 1e-4, "retrain", triggering_bound=4e-4)
    assert len(ledger.entries) == 2 and later.retrains == 1 and later.used == 1e-4
    assert later.entries[-1].triggering_bound == 4e-4 and len(later.since_retrain) == 1
    assert later.charge("b4", 6e-4, "newton").used == pytest.approx(7e-4)
    assert ResidualBudget.from_json(later.to_json()) == later and later.to_dict()["releases_since_retrain"] == 1
    # Even a retrained model's bound may exceed B: that release is not certified, and nothing is left.
    over = later.charge("b4", 3e-3, "retrain", triggering_bound=2e-3)
    assert over.used == 3e-3 and over.left == 0 and over.entries[-1].budget_left == 0
    with pytest.raises(ValueError, match="residual budget must be finite and > 0"):
        ResidualBudget(0.0)


def test_a_budget_written_by_the_per_batch_rule_reads_back_summed():
    """The earlier serialised form: ``used`` the last bound, entries without the new fields."""
    old = {"budget": 1e-3, "used": 4e-4, "left": 6e-4, "retrains": 0,
           "entries": [{"batch_id": "b1", "action": "newton", "residual_bound": 3e-4, "budget_left": 7e-4},
                       {"batch_id": "b2", "action": "newton", "residual_bound": 4e-4, "budget_left": 6e-4}]}
    ledger = ResidualBudget.from_dict(old)
    assert ledger.used == pytest.approx(7e-4) and ledger.left == pytest.approx(3e-4)
    assert ledger.entries[0].budget_used is None and ledger.entries[0].triggering_bound is None


def test_releases_since_the_retrain_compose_within_the_per_release_guarantee():
    sigma = gaussian_sigma(1e-3, 1.0, 1e-5)
    numbers = composition([4e-4, 3e-4, 2e-4], sigma, 1.0, 1e-5, 1e-3)
    assert numbers["releases_since_retrain"] == 3 and numbers["joint_residual_bound"] == pytest.approx(math.sqrt(29e-8))
    # μ = √Σμ_t² ≤ B/σ: together the three are as private as one release at the full budget.
    assert numbers["composed_epsilon"] == 1.0 and numbers["composed_delta"] == gaussian_delta(1e-3, sigma, 1.0) < 1e-5
    assert numbers["composed_basic"] == {"epsilon": 3.0, "delta": pytest.approx(3e-5)}


def test_exceeding_the_budget_retrains_and_says_so(breast_cancer_trained):
    fed_state = breast_cancer_trained
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.05, fed_state.clients, seed=6)
    method = get_method("certified-dfu", setting="dfl", residual_budget=1e-9, newton_steps=1)
    outcome = method.unlearn(fed_state, batch)
    assert outcome.notes["action"] == "retrain" and outcome.budget["retrains"] == 1
    entry = outcome.budget["entries"][0]
    assert entry["action"] == "retrain" and entry["triggering_bound"] > 1e-9 and outcome.budget["left"] == 0
    assert outcome.certificate_inputs["triggering_bound"] == entry["triggering_bound"]
    assert {"retrain", "unlearn"} <= {h["phase"] for h in outcome.history}
    certificate = certificate_for(method, outcome)
    bound = outcome.certificate_inputs["residual_bound"]
    assert (certificate.guarantee == FORMAL) == (bound <= 1e-9)
    if bound > 1e-9:
        assert "residual_within_budget" in certificate.notes[0]


def test_sequential_batches_track_the_budget_and_the_drift_from_retraining(breast_cancer_trained):
    fed_state = breast_cancer_trained
    seconds = precompute_statistics(fed_state)
    assert seconds > 0 and "exact" in fed_state.statistics
    batches = [lambda s, k=k: ForgetSet.for_fraction([0, 1, 2, 3], 0.07, s.clients, seed=10 + k) for k in range(3)]
    method = get_method("certified-dfu", setting="dfl", residual_budget=2e-3)
    rows, final = unlearn_sequence(method, fed_state, batches)
    assert [r["batch"] for r in rows] == [1, 2, 3] and [r["action"] for r in rows] == ["newton"] * 3
    # The budget used is the running sum of the bounds (0.50, 0.94, 1.11 of 2 × 10⁻³ measured).
    assert [r["budget_used"] for r in rows] == pytest.approx(np.cumsum([r["residual_bound"] for r in rows]).tolist())
    assert [r["releases_since_retrain"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert 0 < row["budget_left"] == pytest.approx(2e-3 - row["budget_used"])
        assert abs(row["test_acc"] - row["retrain_test_acc"]) <= 0.03 and row["drift_prediction_agreement"] >= 0.95
    assert [e["batch_id"] for e in final.budget["entries"]] == [r["batch_id"] for r in rows]
    assert rows[0]["retained_samples"] > rows[1]["retained_samples"] > rows[2]["retained_samples"]
    remaining = set(np.concatenate([c.sample_ids for c in final.clients]).tolist())
    first = batches[0](fed_state)
    assert not remaining & set(np.concatenate(list(first.forget_ids.values())).tolist())
    assert final.statistics["exact"].counts == tuple(len(c) for c in final.clients)


def test_a_bound_that_does_not_fit_retrains_and_starts_a_new_sum(breast_cancer_oracle):
    """The federation carries a residual budget (in the earlier serialised form) with nothing left: however
    small the step's bound, it does not fit, so the batch retrains — and the retrained release,
    with the budget to itself again, is certified."""
    fed_state, _ = breast_cancer_oracle
    spent = {"budget": 1e-3, "entries": [{"batch_id": "b0", "action": "newton", "residual_bound": 1e-3,
                                          "budget_left": 0.0}]}
    fed_state = dataclasses.replace(fed_state, budget=spent, train_config=TrainConfig(rounds=10, lr=0.5, batch_size=16))
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.03, fed_state.clients, seed=9)
    method = get_method("certified-dfu", setting="dfl")
    outcome = method.unlearn(fed_state, batch)
    numbers = outcome.certificate_inputs
    entry = outcome.budget["entries"][-1]
    assert outcome.notes["action"] == "retrain" and [e["action"] for e in outcome.budget["entries"]] == ["newton",
                                                                                                      "retrain"]
    assert 0 < entry["triggering_bound"] == numbers["triggering_bound"] == outcome.notes["triggering_bound"]
    assert numbers["budget_used"] == entry["budget_used"] == numbers["residual_bound"] <= 1e-3
    assert numbers["budget_left"] == pytest.approx(1e-3 - numbers["residual_bound"]) and numbers["budget_left"] >= 0
    assert numbers["releases_since_retrain"] == 1 and certificate_for(method, outcome).guarantee == FORMAL


@pytest.fixture
def float64_default():
    """Models, data and the FLOP probe (federation/cost.py follows the model dtype) in float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def test_a_float64_model_retrains_in_float64(float64_default):
    """The retrain fallback runs D-PSGD in the model's own dtype, its mixing matrix included."""
    clients, test, classes = tabular("breast_cancer", 4)
    clients, test = ([Tensors(c.x.double(), c.y, c.sample_ids) for c in clients],
                     Tensors(test.x.double(), test.y, test.sample_ids))
    model_fn = lambda: build_model("logreg", (30,), classes, l2=L2)  # noqa: E731
    config = TrainConfig(rounds=3, lr=0.5, batch_size=16)
    fed_state = DecentralizedState("dfl", model_fn, model_fn().state_dict(), clients, test, config, 0, CPU, classes,
                                   topology=ring(4))
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.05, clients, seed=6)
    outcome = get_method("certified-dfu", setting="dfl", residual_budget=1e-9, newton_steps=1).unlearn(fed_state, batch)
    assert outcome.notes["action"] == "retrain"
    assert all(v.dtype == torch.float64 for node in outcome.node_states for v in node.values())


def test_protocol_cost_counts_the_floods(breast_cancer_oracle):
    fed_state, problem = breast_cancer_oracle
    fed_state = dataclasses.replace(fed_state, statistics={})
    batch = ForgetSet.for_fraction([0, 1, 2, 3], 0.05, fed_state.clients, seed=8)
    d, flood = problem.num_params, 2 * 4 - 3  # one flood on a ring of 4 sends 2|E| − (N − 1) messages
    first = get_method("certified-dfu", setting="dfl").unlearn(fed_state, batch)  # computes Step 4 itself
    precompute_statistics(fed_state)
    later = get_method("certified-dfu", setting="dfl").unlearn(fed_state, batch)
    steps = later.notes["newton_steps"]
    assert later.notes["statistics_precomputed"] and later.notes["curvature_refreshes"] == 0
    # consensus (4 models) + the forget curvature of the 4 affected nodes + gradients + noise shares
    assert later.cost.comm_bytes == 4 * flood * (4 * d + 4 * d * d + 4 * d * (steps + 2))
    assert first.cost.comm_bytes == later.cost.comm_bytes + 4 * flood * 4 * d * d
