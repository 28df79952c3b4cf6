"""Certified decentralized unlearning: a Newton removal step on the retained objective, Gaussian
noise, and the update flooded through the graph [1]_.

After a deletion batch every node holds the consensus model and takes the same Newton steps on the
retained objective L_r, with the retained nodes' gradients and curvatures flooded to all; every node
then adopts the result plus N(0, σ²I) noise, drawn as shares that sum over the nodes. Class removal
is every client removing its samples of the class. Why: for a λ-strongly convex model
(L2-regularised logistic regression) the distance to the exact retrain's optimum is bounded by
‖∇L_r‖/λ, so it is measured rather than assumed, and noise calibrated to it makes the release
(ε, δ)-indistinguishable from that optimum released with the same noise [2]_, [3]_.
``calibration="residual"`` (default) charges each measured bound to a budget fixed in advance and
retrains when it would be exceeded (``certify.budget``); ``"paper"`` uses the a-priori bound ΔF of
[1]_, Lemma 3 — rigorous, and vacuous in practice. A model that is not strongly convex gets the step
and the noise, and is ``not certified``. The step and why it departs from Algorithm 1 (full retained
gradient, every node's curvature), what the guarantee covers and the protocol's cost:
docs/methods.md, "Certified decentralized unlearning".

References
----------
.. [1] Wu, Tao, Zhou, Chen, Dressler and Yu, "Certified Unlearning in Decentralized Federated
   Learning" (certified-decentralized-unlearning.txt): Algorithm 1; Eq. 2–3 (samples), Eq. 5–6
   (clients), Eq. 7 (Fisher approximation); Lemma 3; Theorem 1.
.. [2] Guo, Goldstein, Hannun and van der Maaten (2020), "Certified Data Removal from Machine
   Learning Models", ICML: the retrained optimum plus noise as the reference; a residual budget.
.. [3] Dwork and Roth (2014), "The Algorithmic Foundations of Differential Privacy", Theorem A.1:
   σ = (Δ/ε)·√(2 ln(1.25/δ)).
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedunlearn.certify.budget import BudgetAction, ResidualBudget, classical_delta, composition, gaussian_delta, gaussian_sigma
from fedunlearn.certify.certificate import FORMAL
from fedunlearn.federation.cost import BYTES_PER_FLOAT32, Cost, training_flops
from fedunlearn.federation.dpsgd import average_state
from fedunlearn.federation.local import State, Tensors
from fedunlearn.federation.topology import Topology
from fedunlearn.unlearning.base import ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod
from fedunlearn.unlearning.dfl_retrain import (DecentralizedOutcome, DecentralizedState, as_decentralized,
                                               dpsgd_rounds)
from fedunlearn.unlearning.registry import register
from models.logreg import LogisticRegression

CALIBRATIONS = ("residual", "paper")
HESSIANS = ("exact", "fisher-diag")


def logreg_constants(lam: float, radius: float) -> dict[str, float]:
    """Lipschitz constants of F = CE + (λ/2)‖θ‖² for multinomial logistic regression with
    features ‖x‖ ≤ R, the bias folded in as x̃ = (x, 1), ‖x̃‖² ≤ R² + 1.

    L (gradient norm): ∇_θ CE = (p − e_y) x̃ᵀ and ‖p − e_y‖² = (1 − p_y)² + Σ_{k≠y} p_k²
    ≤ 2(1 − p_y)² ≤ 2, so ‖∇CE‖ ≤ L₀ = √2·√(R²+1). Every minimiser of a regularised objective
    has ‖θ*‖ ≤ L₀/λ (paper Lemma 4); on that ball ‖∇F‖ ≤ L₀ + λ‖θ‖ ≤ 2L₀ = L.

    M (Hessian Lipschitz): ∇²F = A(z) ⊗ x̃x̃ᵀ + λI, A = diag(p) − ppᵀ, z = θx̃. The derivative of
    A along h is diag(q) − qpᵀ − pqᵀ with q = p ∘ (h − ⟨p, h⟩), ‖q‖ ≤ √Var_p(h) ≤ ‖h‖, so its
    norm is ≤ 3‖h‖; with ‖z₁ − z₂‖ ≤ ‖θ₁ − θ₂‖‖x̃‖ and ‖x̃x̃ᵀ‖ = ‖x̃‖², M = 3(R²+1)^{3/2}.
    Unit-norm features (R = 1): L = 4, M = 6√2."""
    base = math.sqrt(2.0) * math.sqrt(radius ** 2 + 1.0)
    return {"lambda": lam, "R": radius, "L0": base, "weight_bound": base / lam if lam > 0 else math.inf,
            "L": 2.0 * base, "M": 3.0 * (radius ** 2 + 1.0) ** 1.5}


def paper_sensitivity(lipschitz: float, hessian_lipschitz: float, lam: float, forget: int, local: int) -> float:
    """ΔF = 2ML²m²/(λ³n²), Algorithm 1's a-priori bound on the unlearned model's distance to the
    retrained optimum (Lemma 3)."""
    return 2.0 * hessian_lipschitz * lipschitz ** 2 * forget ** 2 / (lam ** 3 * local ** 2)


def gaussian_noise(num_params: int, sigma: float, shares: int, entropy: Sequence[int]) -> torch.Tensor:
    """ν = Σ_{k<shares} ν_k, ν_k ~ N(0, σ²/shares · I) drawn by share k from (*entropy, k): N(0, σ²I)
    in float64 on the CPU."""
    total = torch.zeros(num_params, dtype=torch.float64)
    for k in range(shares):
        seed = int(np.random.SeedSequence([*entropy, k]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
        generator = torch.Generator().manual_seed(seed)
        total += torch.randn(num_params, generator=generator, dtype=torch.float64) * (sigma / math.sqrt(shares))
    return total


class _WeightedObjective(nn.Module):
    """Σ_s w_s F_s = Σ_s w_s CE_s + (Σ_s w_s)·regulariser, as a forward pass so that
    ``functional_call`` swaps the parameters for the regulariser too."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, regularize: bool) -> torch.Tensor:
        loss = (w * F.cross_entropy(self.model(x), y, reduction="none")).sum()
        regularizer = getattr(self.model, "regularizer", None)
        return loss + w.sum() * regularizer() if regularize and regularizer is not None else loss


class FlatObjective:
    """The training objective as a function of one float64 parameter vector (``named_parameters``
    order): gradients of weighted sums of per-sample terms, and per-sample curvature sums."""

    def __init__(self, model_fn: Callable[[], nn.Module], device: torch.device):
        # float64 throughout (the residual certificate is a computed number); MPS has no float64.
        self.device = torch.device("cpu") if device.type == "mps" else device
        with torch.random.fork_rng(devices=[]):  # building a model must not move the global RNG
            self.model = model_fn().to(self.device).eval()
        self.is_logreg = isinstance(self.model, LogisticRegression)
        self.lam = self.model.l2 if self.is_logreg else 0.0
        self._wrapper = _WeightedObjective(self.model)
        self._names = [name for name, _ in self.model.named_parameters()]
        self._shapes = [p.shape for p in self.model.parameters()]
        self._sizes = [p.numel() for p in self.model.parameters()]

    @property
    def num_params(self) -> int:
        return sum(self._sizes)

    def flatten(self, state: State) -> torch.Tensor:
        return torch.cat([state[name].reshape(-1).to(self.device, torch.float64) for name in self._names])

    def grouped(self, parts: list[Tensors]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The parts concatenated (features in float64) with each sample's part index."""
        x = torch.cat([part.x for part in parts]).to(self.device, torch.float64)
        y = torch.cat([part.y for part in parts]).to(self.device)
        group = torch.cat([torch.full((len(part),), g, dtype=torch.long) for g, part in enumerate(parts)])
        return x, y, group.to(self.device)

    def unflatten(self, theta: torch.Tensor, like: State) -> State:
        """``like`` with its parameters replaced by θ (dtype and device of ``like``)."""
        out = dict(like)
        for name, chunk, shape in zip(self._names, torch.split(theta, self._sizes), self._shapes):
            out[name] = chunk.view(shape).to(like[name].dtype).to(like[name].device)
        return out

    def loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
             regularize: bool = True) -> torch.Tensor:
        params = {f"model.{n}": t.view(s) for n, t, s in zip(self._names, torch.split(theta, self._sizes),
                                                              self._shapes)}
        return functional_call(self._wrapper, params, (x, y, w, regularize))

    def gradient(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """∇ Σ_s w_s F_s; for logistic regression in closed form, Σ_s w_s (p_s − e_{y_s}) ⊗ x̃_s + (Σ w) λθ
        (one product instead of autograd's bookkeeping, which dominates at this size)."""
        if self.is_logreg:
            classes, features = self.model.linear.weight.shape
            flat = x.flatten(1)
            residual = torch.softmax(flat @ theta[:classes * features].view(classes, features).T
                                     + theta[classes * features:], dim=1)
            residual[torch.arange(len(y), device=y.device), y] -= 1
            residual *= w[:, None]
            return torch.cat([(residual.T @ flat).reshape(-1), residual.sum(0)]) + w.sum() * self.lam * theta
        theta = theta.detach().requires_grad_(True)
        (gradient,) = torch.autograd.grad(self.loss(theta, x, y, w), theta)
        return gradient

    def curvature_sums(self, kind: str, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                       group: torch.Tensor, groups: int) -> torch.Tensor:
        """Per group (samples sorted by ``group``), the sum of the per-sample likelihood
        curvature at θ: ∇²CE_s (groups × d × d) or (∇CE_s)² (groups × d), in float32 — it only
        preconditions the steps, whose gradients and residual are float64. One batched call for
        all nodes, as D-PSGD's gradients are: the nodes compute in parallel."""
        if kind == "exact" and self.is_logreg:
            return self._logreg_hessian_sums(theta, x, y, group, groups)
        if kind == "exact":
            ones = torch.ones(len(y), dtype=theta.dtype, device=theta.device)
            return torch.stack([torch.func.hessian(self.loss)(theta, x[group == g], y[group == g], ones[group == g],
                                                              False) for g in range(groups)]).float()

        def one(t: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
            return self.loss(t, xs[None], ys[None], torch.ones(1, dtype=t.dtype, device=t.device), False)

        per_sample = vmap(grad(one), in_dims=(None, 0, 0))
        sums = torch.zeros(groups, self.num_params, dtype=theta.dtype, device=theta.device)
        for i in range(0, len(y), 256):  # chunks bound the per-sample gradients' memory
            sums.index_add_(0, group[i:i + 256], per_sample(theta, x[i:i + 256], y[i:i + 256]) ** 2)
        return sums.float()

    def _logreg_hessian_sums(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, group: torch.Tensor,
                             groups: int) -> torch.Tensor:
        """Σ_s (diag(p_s) − p_s p_sᵀ) ⊗ x̃_s x̃_sᵀ in closed form, 2·n·d² FLOPs instead of d backward
        passes. ∂z/∂θ-weighted rows z_s = (p_s ⊗ x_s, p_s) are already in parameter order (weight
        row-major, then bias); the groups are padded to a common length for batched products."""
        classes, features = self.model.linear.weight.shape
        weight, bias = theta[:classes * features].view(classes, features), theta[classes * features:]
        p = torch.softmax(x.flatten(1) @ weight.T + bias, dim=1).float()
        flat = x.flatten(1).float()
        xt = torch.cat([flat, torch.ones(len(flat), 1, dtype=flat.dtype, device=flat.device)], dim=1)
        z = torch.cat([(p[:, :, None] * flat[:, None, :]).reshape(len(flat), -1), p], dim=1)
        counts = torch.bincount(group, minlength=groups)
        position = torch.arange(len(group), device=group.device) - (torch.cumsum(counts, 0) - counts)[group]
        length = int(counts.max()) if len(group) else 0

        def padded(rows: torch.Tensor) -> torch.Tensor:
            out = rows.new_zeros(groups, length, rows.shape[1])
            out[group, position] = rows
            return out

        zp, pp, xp = padded(z), padded(p), padded(xt)
        h = -(zp.transpose(1, 2) @ zp)
        # diag(p) ⊗ x̃x̃ᵀ: class c's (features + 1)² block at the weight row c and bias c.
        index = torch.cat([torch.arange(classes * features, device=theta.device).view(classes, features),
                           classes * features + torch.arange(classes, device=theta.device)[:, None]], dim=1)
        flat_index = (index[:, :, None] * h.shape[-1] + index[:, None, :]).reshape(-1)
        blocks = torch.einsum("gnc,gni,gnj->gcij", pp, xp, xp).reshape(groups, -1)
        h.view(groups, -1).index_add_(1, flat_index, blocks)
        return h


@dataclass(frozen=True)
class CurvatureStatistics:
    """The stored auxiliary statistic (the paper's T_i, Step 4): per client the curvature SUM over
    its samples at ``point``, stacked (clients × d × d, or clients × d for the Fisher), and its
    sample count (0: the client has left). After a batch the forget samples' share (``removed``:
    the clients and their forget sums) is taken out when ``sums`` is first read — by the next
    batch — as every node would update its own statistic after the release, not before it."""

    kind: str
    point: torch.Tensor
    stored_sums: torch.Tensor
    counts: tuple[int, ...]
    removed: tuple[tuple[int, ...], torch.Tensor] | None = None

    @cached_property
    def sums(self) -> torch.Tensor:
        if self.removed is None:
            return self.stored_sums
        partial, forget_sums = self.removed
        sums = self.stored_sums.clone()  # in place on a copy: index_add's out-of-place form is several times slower
        sums.index_add_(0, torch.as_tensor(partial, dtype=torch.long, device=sums.device), forget_sums, alpha=-1)
        return sums

    def without(self, forget_counts: dict[int, int], partial: list[int],
                forget_sums: torch.Tensor | None) -> "CurvatureStatistics":
        """The statistic of the retained data: every affected client's count reduced, the forget
        samples' sums taken out of the clients that keep data (``partial``, in the order of
        ``forget_sums``); a client left with no samples has count 0 and no weight."""
        counts = tuple(n - forget_counts.get(i, 0) for i, n in enumerate(self.counts))
        return replace(self, stored_sums=self.sums, counts=counts,
                       removed=(tuple(partial), forget_sums) if partial else None)

    def mean_curvature(self) -> torch.Tensor:
        """(1/|K|) Σ_{i∈K} sums_i / n_i over the clients K with samples."""
        return torch.tensordot(self._weights(), self.sums, dims=1).double()

    def mean_curvature_without(self, forget_counts: dict[int, int], partial: list[int],
                               forget_sums: torch.Tensor | None) -> torch.Tensor:
        """``without(...).mean_curvature()`` from the stored sums and the forget samples' share
        directly: the first Newton step waits for this one matrix, not for the whole statistic."""
        weights = self.without(forget_counts, [], None)._weights()
        mean = torch.tensordot(weights, self.sums, dims=1)
        if partial:
            mean -= torch.tensordot(weights[torch.as_tensor(partial, dtype=torch.long, device=weights.device)],
                                    forget_sums, dims=1)
        return mean.double()

    def _weights(self) -> torch.Tensor:
        """1/(|K| n_i) for the clients K with samples, 0 for those without."""
        counts = torch.as_tensor(self.counts, dtype=self.sums.dtype, device=self.sums.device)
        weights = torch.where(counts > 0, 1.0 / counts.clamp(min=1), torch.zeros_like(counts))
        return weights / int((counts > 0).sum())


def compute_statistics(problem: FlatObjective, kind: str, point: torch.Tensor,
                       clients: list[Tensors]) -> CurvatureStatistics:
    x, y, group = problem.grouped(clients)
    return CurvatureStatistics(kind, point, problem.curvature_sums(kind, point, x, y, group, len(clients)),
                               tuple(len(c) for c in clients))


def precompute_statistics(fed_state: DecentralizedState, hessian: str = "exact") -> float:
    """Step 4 of the paper, after training: every node computes its curvature statistic at the
    global model and keeps it for later requests. Stored in ``fed_state.statistics``; returns the
    seconds it took (a one-off cost, reported next to the requests' own)."""
    start = time.perf_counter()
    problem = FlatObjective(fed_state.model_fn, fed_state.device)
    point = problem.flatten(average_state(fed_state.nodes()))
    fed_state.statistics[hessian] = compute_statistics(problem, hessian, point, fed_state.clients)
    return time.perf_counter() - start


# A Newton step that shrinks the gradient less than 10-fold says the curvature is off: refresh it.
_CONTRACTION = 0.1


@dataclass
class _Step:
    theta: torch.Tensor
    residual_bound: float
    statistics: CurvatureStatistics
    flops: float
    steps: int
    refreshes: int
    bounds: list[float]
    curvature_floods: int  # curvature messages this step sent: forget shares + refreshes

@register
class CertifiedDFU(UnlearningMethod):
    """Certified decentralized unlearning (module docstring): DFL sample, class and client requests.

    The paper's value follows each default where the paper states one.

    Parameters
    ----------
    epsilon : float, default=1.0
        ε of the (ε, δ) guarantee (not stated in the paper).
    delta : float, default=1e-5
        δ of the guarantee (not stated). (ε, δ) must be a pair where the classical Gaussian
        calibration is valid (``certify.budget.classical_delta``); others are refused.
    calibration : {"residual", "paper"}, default="residual"
        "residual": σ is calibrated to ``residual_budget`` and each batch's measured bound is charged
        to it; "paper": the a-priori ΔF of Algorithm 1 (the paper's).
    residual_budget : float, default=1e-3
        B, the sum of the distance bounds to the retrained optimum allowed between retrains
        ("residual" only; σ = 4.8e-3 at ε = 1, δ = 1e-5; not in the paper).
    hessian : {"exact", "fisher-diag"}, default="exact"
        the curvature: the exact Hessian (closed form for ``LogisticRegression``, ``torch.func``
        otherwise; small models only), or the diagonal of the empirical Fisher (Eq. 7). The paper:
        exact for the convex model, Fisher for networks.
    newton_steps : int, default=8
        at most this many Newton steps; at least one is always taken (paper: 1). With "paper" the
        a-priori ΔF is met after the first.
    damping : float, default=0.0
        added to the curvature's diagonal (paper: none); > 0 for a model whose curvature is singular
        (a network with the exact Hessian, or a Fisher with zero entries).
    finetune_rounds : int, default=0
        D-PSGD rounds on the retained data after the release, post-processing (paper: 1, optional).
    noise : bool, default=True
        add the calibrated noise (paper: True). False is for oracle tests: not certified.
    noise_seed : int or None, default=None
        None draws fresh OS entropy. A seed makes the noise reproducible — and removable by whoever
        knows it, so the certificate says not certified.
    """

    name = "certified-dfu"
    roles = {"dfl": "default"}
    stronger_scales = ("newton_steps",)
    settings = frozenset({"dfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = FORMAL

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, calibration: str = "residual",
                 residual_budget: float = 1e-3, hessian: str = "exact", newton_steps: int = 8, damping: float = 0.0,
                 finetune_rounds: int = 0, noise: bool = True, noise_seed: int | None = None):
        self.epsilon = epsilon
        self.delta = delta
        self.calibration = calibration
        self.residual_budget = residual_budget
        self.hessian = hessian
        self.newton_steps = newton_steps
        self.damping = damping
        self.finetune_rounds = finetune_rounds
        self.noise = noise
        self.noise_seed = noise_seed
        self._require(0 < epsilon < math.inf, "epsilon", "finite and > 0")
        self._require(0 < delta < 1, "delta", "in (0, 1)")
        self._require(calibration in CALIBRATIONS, "calibration", f"one of {', '.join(CALIBRATIONS)}")
        self._require(0 < residual_budget < math.inf, "residual_budget", "finite and > 0")
        self._require(hessian in HESSIANS, "hessian", f"one of {', '.join(HESSIANS)}")
        self._require(isinstance(newton_steps, int) and newton_steps >= 1, "newton_steps", "an integer >= 1")
        self._require(damping >= 0, "damping", ">= 0")
        self._require(isinstance(finetune_rounds, int) and finetune_rounds >= 0, "finetune_rounds",
                      "an integer >= 0")
        self._require(noise_seed is None or isinstance(noise_seed, int), "noise_seed", "None or an integer")
        self._require(classical_delta(epsilon, delta) <= delta, "epsilon",
                      f"a value where σ = (Δ/ε)·√(2 ln(1.25/δ)) is (ε, δ)-private at δ = {delta} (exact δ "
                      f"{classical_delta(epsilon, delta):.2e}; lower ε)")

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        fed_state = as_decentralized(fed_state)
        problem = FlatObjective(fed_state.model_fn, fed_state.device)
        convex = problem.is_logreg and problem.lam > 0
        if self.calibration == "paper" and not convex:
            raise ValueError(f"{self.name}: calibration 'paper' needs a λ-strongly convex model "
                             f"(LogisticRegression with l2 > 0), got {type(problem.model).__name__}")
        retained = fed_state.retained_clients(forget_set)
        engine = fed_state.dpsgd()  # its graph of the nodes holding data, checked connected: floods reach all
        before, after = engine.active_topology(fed_state.clients), engine.active_topology(retained)
        per_sample = fed_state.flops_per_sample()
        numbers = self._calibration_numbers(problem, fed_state, forget_set)
        statistics, precomputed, statistics_seconds = self._statistics(fed_state, problem)
        budgeted = convex and self.calibration == "residual"
        residual = self._residual(fed_state)
        start = problem.flatten(average_state(fed_state.nodes()))
        # With the budget the steps aim at what is left of it: the bound is charged on top of the sum.
        step = self._newton(problem, start, statistics, fed_state.forget_by_client(forget_set), retained, per_sample,
                            residual.left if budgeted else numbers["sensitivity"])
        cost = self._step_cost(step, before, after, problem.num_params)
        if not precomputed:  # Step 4 happens now: every node computes its statistic and floods it
            cost += self._statistics_cost(before, sum(len(c) for c in fed_state.clients), problem.num_params,
                                          per_sample)
        action, triggering_bound = BudgetAction.newton, None
        if budgeted and not residual.admits(step.residual_bound):
            # The bound does not fit in what is left: retrain (a new sum), then the same steps from there.
            action, triggering_bound = BudgetAction.retrain, step.residual_bound
            nodes, retrain_cost = dpsgd_rounds(fed_state, retained, state=None, rounds=fed_state.train_config.rounds,
                                               first_round=0, phase="retrain", monitor=monitor)
            point = problem.flatten(average_state(nodes))
            step = self._newton(problem, point, compute_statistics(problem, self.hessian, point, retained), {},
                                retained, per_sample, numbers["sensitivity"])
            cost += retrain_cost + self._step_cost(step, after, after, problem.num_params) \
                + self._statistics_cost(after, sum(len(c) for c in retained), problem.num_params, per_sample)
        if budgeted:
            residual = residual.charge(forget_set.batch_id, step.residual_bound, action, triggering_bound)
        sigma = numbers["sigma"] if self.noise else 0.0
        noise = self._noise(problem.num_params, sigma, len(after), forget_set.batch_id)
        released = problem.unflatten(step.theta + noise.to(step.theta.device), fed_state.state)
        monitor.record("unlearn", 1, released, residual_bound=step.residual_bound)
        nodes = [released if len(c) else None for c in retained]
        if self.finetune_rounds:
            nodes, finetune_cost = dpsgd_rounds(fed_state, retained, state=nodes, rounds=self.finetune_rounds,
                                                first_round=fed_state.train_config.rounds, phase="finetune",
                                                monitor=monitor)
            cost += finetune_cost
        notes = {"action": action, "calibration": self.calibration, "sigma": sigma,
                 "residual_bound": step.residual_bound, "triggering_bound": triggering_bound,
                 "residual_bounds": step.bounds, "newton_steps": step.steps,
                 "curvature_refreshes": step.refreshes, "hessian": self.hessian, "nodes": len(after),
                 "topology": after.kind, "statistics_precomputed": precomputed,
                 "statistics_seconds": statistics_seconds, "finetune_rounds": self.finetune_rounds}
        return DecentralizedOutcome(average_state(nodes), cost,
                                    certificate_inputs=self._certificate_inputs(numbers, step, residual, action,
                                                                                triggering_bound, convex, sigma, after),
                                    notes=notes, node_states=nodes, statistics={self.hessian: step.statistics},
                                    budget=residual.to_dict() if budgeted else None)

    def _step_cost(self, step: _Step, before: Topology, after: Topology, num_params: int) -> Cost:
        """Floods (messages counted by simulating them): every node's model on the graph before the
        request (consensus); on the graph after it, the curvature shares the step sent (the forget
        samples' share of each partially affected node, every node's at a refresh), every
        retained node's gradient (at the start and after each step) and noise share."""
        floats = num_params * len(before) * _flood_messages(before) + _flood_messages(after) * (
            self._curvature_floats(num_params) * step.curvature_floods + num_params * len(after) * (step.steps + 2))
        return Cost(flops=step.flops, comm_bytes=floats * BYTES_PER_FLOAT32)

    def _statistics_cost(self, graph: Topology, samples: int, num_params: int, per_sample: int) -> Cost:
        """Step 4: every node computes its curvature statistic and floods it to the others."""
        floats = self._curvature_floats(num_params) * len(graph) * _flood_messages(graph)
        return Cost(flops=_curvature_flops(self.hessian, samples, num_params, per_sample),
                          comm_bytes=floats * BYTES_PER_FLOAT32)

    def _curvature_floats(self, num_params: int) -> int:
        return num_params ** 2 if self.hessian == "exact" else num_params

    def _statistics(self, fed_state: DecentralizedState,
                    problem: FlatObjective) -> tuple[CurvatureStatistics, bool, float]:
        """The stored statistic, or computed now (and paid for by this call)."""
        stored = fed_state.statistics.get(self.hessian)
        if stored is not None:
            return stored, True, 0.0
        start = time.perf_counter()
        point = problem.flatten(average_state(fed_state.nodes()))
        return compute_statistics(problem, self.hessian, point, fed_state.clients), False, time.perf_counter() - start

    def _noise(self, num_params: int, sigma: float, shares: int, batch_id: str) -> torch.Tensor:
        """ν for this batch, from fresh OS entropy — or from (noise_seed, batch) when seeded."""
        if sigma == 0:
            return torch.zeros(num_params, dtype=torch.float64)
        entropy = secrets.randbits(128) if self.noise_seed is None else self.noise_seed
        batch_key = int(hashlib.sha256(batch_id.encode()).hexdigest(), 16)
        return gaussian_noise(num_params, sigma, shares, [entropy, batch_key])

    def _newton(self, problem: FlatObjective, theta: torch.Tensor, statistics: CurvatureStatistics,
                forget: dict[int, Tensors], retained: list[Tensors], per_sample: int, target: float) -> _Step:
        """Newton steps on L_r from θ — at least one, the removal step — until the distance bound
        ‖∇L_r‖/λ is within ``target`` (what is left of the residual budget, or the paper's
        calibrated sensitivity), at most ``newton_steps``. They
        use the stored curvature with the forget samples' share removed until a step shrinks the
        gradient less than ``_CONTRACTION``-fold (a large move, e.g. a class removal); then the
        curvature is recomputed at the current iterate. Returns the iterate with the smallest bound."""
        partial = [c for c, d in forget.items() if len(d) < statistics.counts[c]]  # a removed client needs no sums
        forget_sums = None
        if partial:
            x, y, group = problem.grouped([forget[c] for c in partial])
            forget_sums = problem.curvature_sums(self.hessian, statistics.point, x, y, group, len(partial))
        forget_counts = {c: len(d) for c, d in forget.items()}
        solve = _solver(statistics.mean_curvature_without(forget_counts, partial, forget_sums), problem.lam + self.damping)
        active = [i for i, c in enumerate(retained) if len(c)]
        x, y, _ = problem.grouped([retained[i] for i in active])
        w = torch.cat([torch.full((len(retained[i]),), 1.0 / (len(active) * len(retained[i])), dtype=torch.float64,
                                  device=x.device) for i in active])
        gradient = problem.gradient(theta, x, y, w)
        norms = [float(gradient.norm())]
        best = (norms[0], theta)
        refreshes = 0

        def more() -> bool:
            return len(norms) == 1 or (len(norms) <= self.newton_steps and norms[-1] > problem.lam * target)

        while more():
            theta = theta - solve(gradient)
            gradient = problem.gradient(theta, x, y, w)
            norms.append(float(gradient.norm()))
            best = min(best, (norms[-1], theta), key=lambda pair: pair[0])
            if norms[-1] > _CONTRACTION * norms[-2] and more():
                kept = compute_statistics(problem, self.hessian, theta, retained)
                solve = _solver(kept.mean_curvature(), problem.lam + self.damping)
                refreshes += 1
        if not refreshes:  # the statistic carried to the next batch: the stored one less this batch's samples
            kept = statistics.without(forget_counts, partial, forget_sums)
        d = problem.num_params
        steps = len(norms) - 1
        solves = (d ** 3 / 3) * (1 + refreshes) + 2 * d ** 2 * steps if self.hessian == "exact" else d * steps
        flops = training_flops(per_sample, len(y), epochs=len(norms)) + solves \
            + _curvature_flops(self.hessian, sum(len(forget[c]) for c in partial) + refreshes * len(y), d, per_sample)
        bounds = [n / problem.lam if problem.lam > 0 else math.inf for n in norms]
        return _Step(best[1], min(bounds), kept, flops, steps, refreshes, bounds, len(partial) + refreshes * len(active))

    def _residual(self, fed_state: DecentralizedState) -> ResidualBudget:
        """The federation's residual budget if it was kept with this budget, else a new one."""
        if fed_state.budget is not None and float(fed_state.budget["budget"]) == self.residual_budget:
            return ResidualBudget.from_dict(fed_state.budget)
        return ResidualBudget(self.residual_budget)

    def _calibration_numbers(self, problem: FlatObjective, fed_state: DecentralizedState,
                             forget_set: ForgetSet) -> dict[str, Any]:
        """σ and what it rests on: the sensitivity Δ (B, or the paper's ΔF) and the constants."""
        radius = max(float(c.x.flatten(1).norm(dim=1).max()) for c in fed_state.clients if len(c))
        constants = logreg_constants(problem.lam, radius) if problem.lam > 0 else {"lambda": 0.0, "R": radius}
        if self.calibration == "residual":
            sensitivity = self.residual_budget
        else:
            ratios = {c: len(ids) / len(fed_state.clients[c]) for c, ids in forget_set.forget_ids.items()}
            worst = max(ratios, key=ratios.get)
            m, n = len(forget_set.forget_ids[worst]), len(fed_state.clients[worst])
            sensitivity = paper_sensitivity(constants["L"], constants["M"], problem.lam, m, n)
            constants = {**constants, "delta_F": sensitivity, "m": m, "n": n}
        sigma = gaussian_sigma(sensitivity, self.epsilon, self.delta)
        return {"sensitivity": sensitivity, "sigma": sigma, "constants": constants,
                "delta_exact": gaussian_delta(sensitivity, sigma, self.epsilon)}

    def _certificate_inputs(self, numbers: dict[str, Any], step: _Step, residual: ResidualBudget, action: str,
                            triggering_bound: float | None, convex: bool, sigma: float,
                            after: Topology) -> dict[str, Any]:
        budgeted = convex and self.calibration == "residual"
        # The residual calibration certifies the sum since the last retrain; the paper's, each release.
        within = residual.used <= residual.budget if budgeted else step.residual_bound <= numbers["sensitivity"]
        assumptions = {"strongly_convex": convex,
                       "bounded_features": math.isfinite(numbers["constants"]["R"]),
                       # The residual calibration measures the distance, so the curvature's accuracy
                       # cannot break it; the paper's a-priori bound rests on the exact Newton step.
                       "exact_or_bounded_hessian": self.calibration == "residual" or self.hessian == "exact",
                       "noise_added": self.noise and sigma > 0,
                       "secret_noise": self.noise_seed is None,
                       ("residual_within_budget" if self.calibration == "residual" else "apriori_bound_verified"):
                           convex and within}
        inputs = {"calibration": self.calibration, "epsilon": self.epsilon, "delta": self.delta,
                  "sigma": numbers["sigma"], "sensitivity": numbers["sensitivity"],
                  "delta_exact": numbers["delta_exact"], "residual_bound": step.residual_bound,
                  "constants": numbers["constants"], "hessian": self.hessian, "newton_steps": step.steps,
                  "damping": self.damping, "action": action, "noise_shares": len(after),
                  "released": "every node's model, identical: the global model", "assumptions": assumptions}
        if budgeted:
            inputs.update(residual_budget=residual.budget, budget_used=residual.used, budget_left=residual.left,
                          triggering_bound=triggering_bound, ledger=residual.to_dict(),
                          **composition([e.residual_bound for e in residual.since_retrain], sigma, self.epsilon,
                                        self.delta, residual.budget))
        return inputs


def _solver(curvature: torch.Tensor, diagonal: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """g ↦ (curvature + diagonal·I)⁻¹ g: Cholesky for a matrix, elementwise for a diagonal."""
    if curvature.dim() == 1:
        entries = curvature + diagonal
        if not bool((entries > 0).all()):
            raise ValueError("the diagonal Fisher has zero entries; set damping > 0")
        return lambda g: g / entries
    matrix = curvature.clone()
    matrix.diagonal().add_(diagonal)
    factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        raise ValueError("the curvature is not positive definite (a non-convex model?); set damping > 0 "
                         "or use hessian='fisher-diag'")
    return lambda g: torch.cholesky_solve(g[:, None], factor)[:, 0]


def _flood_messages(graph: Topology) -> int:
    """Messages one flood sends on a connected graph (the same from every source: 2|E| − (N − 1))."""
    return graph.flood(graph.nodes[0]).messages


def _curvature_flops(kind: str, samples: int, num_params: int, per_sample: int) -> float:
    """Curvature sums over ``samples``: 2·d² per sample in closed form, F per sample for the Fisher."""
    return 2.0 * samples * num_params ** 2 if kind == "exact" else float(per_sample * samples)


@register
class CertifiedDFUPaperCalibration(CertifiedDFU):
    """``certified-dfu`` with the paper's a-priori calibration ΔF = 2ML²m²/(λ³n²) as default, so a
    benchmark over ``all`` methods reports both calibrations side by side. Every hyperparameter
    is ``CertifiedDFU``'s; only ``calibration`` defaults to ``"paper"``."""

    name = "certified-dfu-paper"
    stronger_scales = ()  # as before: no stronger attempt of its own

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, calibration: str = "paper",
                 residual_budget: float = 1e-3, hessian: str = "exact", newton_steps: int = 8, damping: float = 0.0,
                 finetune_rounds: int = 0, noise: bool = True, noise_seed: int | None = None):
        super().__init__(epsilon=epsilon, delta=delta, calibration=calibration, residual_budget=residual_budget,
                         hessian=hessian, newton_steps=newton_steps, damping=damping,
                         finetune_rounds=finetune_rounds, noise=noise, noise_seed=noise_seed)
