"""FedORA (Federated Optimization for data Removal via primal-dual Algorithm): Jiang, Tong, Liu,
Zhang, Lam and Tan, "Certifying the Right to be Forgotten: Primal-Dual Optimization for Sample and
Label Unlearning in Vertical Federated Learning" (fedora-vfl-primal-dual-unlearning.txt).

Problem (Eq. 8): min_Θ L_r(Θ) + (ρ/2)‖Θ − Θ_init‖²  subject to  L_u(Θ) ≥ γ, where Θ is every
party's bottom model and the active party's top model, Θ_init the trained model, L_r the mean
cross-entropy on retained data, and the uncertainty loss (Eq. 24, 28)

    L_u = Σ_{j∈D_u} ω·(H(P_j) − KL(P_j‖U)) = Σ_{j∈D_u} ω·(2H(P_j) − log C)

is MAXIMISED (ω·log C per sample) by uniform predictions: the constraint asks for uncertainty on
the forget set, not for misclassification.

One iteration k (Algorithms 1–2); every number lives at the party that owns it:
1. Unlearning phase: one full batch over D_u gives L_u at the active party and, through the
   embedding gradients it sends back, ∂L_u/∂θ_i at every party i.
2. Dual update. ``dual="elementwise"`` (Algorithm 1 line 26 / Eq. 21, the default): every party
   keeps one Ω per parameter entry, Ω_i ← max(0, Ω_i + σ(γ − ∂L_u/∂θ_i)), locally.
   ``dual="scalar"`` (Eq. 20): the active party keeps one Ω ← max(0, Ω + σ(γ − L_u)) and sends
   it to the others (one scalar each). The certificate records which form ran.
3. Remaining phase (Algorithm 2, asymmetric batches): R = ⌈δ|D_r|/B⌉ mini-batch steps on retained
   data, each θ ← θ − τ(∂L_r/∂θ − ∂L_u/∂θ ∘ Ω + ρ(θ − θ_init)), with ∂L_u/∂θ and Ω fixed from
   steps 1–2 (Eq. 34).
4. Adaptive steps (Eq. 29–33): ΔΘ^{k+1} = ‖Θ^{k+1} − Θ^k‖, x = ΔΘ^{k+1}/ΔΘ^k; τ and σ are
   multiplied by κ_i if x < β and by κ_d if x > α, then capped at τ_max and σ_max. The parties
   send their shares of ‖ΔΘ‖² to the active party, which sends (τ, σ) back (scalars).

Our reading of the signs. The Lagrangian (Eq. 9) is L_r + (ρ/2)‖Θ − Θ_init‖² + Ω(γ − L_u); its
gradient in Θ is ∇L_r − Ω∇L_u + ρ(Θ − Θ_init), so the primal step DESCENDS L_r and ASCENDS L_u
weighted by Ω ≥ 0 (Eq. 22, 27, 34 as printed), and the dual step ascends the Lagrangian in Ω:
the scalar Ω grows while the constraint is violated (γ > L_u) and shrinks to 0 once it holds.
Since Ω ≥ 0, the push ∂L_u/∂θ ∘ Ω has a non-negative inner product with ∇L_u in both forms: it
never lowers the uncertainty to first order.

Units of γ. Eq. 20 compares γ with L_u, a sum over the forget set; Eq. 21 compares it with
gradient entries. We run the iteration on the per-sample mean L_u/|D_u| and give ``gamma`` in
units of the maximum: the constraint is L_u ≥ γ_abs = gamma·ω·log C·|D_u| (mean 2H(P) − log C ≥
gamma·log C, i.e. mean entropy ≥ (1 + gamma)/2 · log C), and both dual forms use the per-sample
threshold gamma·ω·log C. This is exactly the paper's iteration on the summed L_u, with γ_abs in
Eq. 20 and in Eq. 21 and the dual step σ/|D_u|², so σ need not be retuned for every forget-set
size. The per-entry uncertainty gradient rarely reaches that threshold, so the element-wise Ω
grows on every entry by about σ·γ per iteration and does not relax once the constraint holds
(the scalar Ω does): Algorithm 1 then acts as a penalty whose weight keeps growing, which is why
the run stops soon after the constraint holds (below).

Stopping. The paper iterates "until convergence criteria ... are met". Here: at most
``iterations``; once the constraint first holds, ``patience`` more iterations let the remaining
phase repair utility, then the run stops. The certificate (class ``constraint satisfied``)
checks the FINAL L_u against γ_abs; if it falls short, the certificate says ``not certified``.

Measured behaviour to expect: the forget set's predictions end near uniform, so their argmax —
the forget accuracy — sits near chance (1/C) and moves from one iteration to the next, because
a near-uniform argmax flips with small shared shifts of the logits.

Hyperparameters (default; the paper's value where it gives one):
    iterations: K, the most outer iterations (60; not given).
    omega: ω, the forgetting weight (2.0; the paper's best trade-off, Fig. 8a).
    gamma: γ per forget sample, as a share of the maximum ω·log C (0.9, i.e. mean forget-set
        entropy ≥ 95% of log C: "maximum uncertainty" up to a margin the iteration can reach;
        not given).
    dual: "elementwise" (Algorithm 1, default) or "scalar" (Eq. 20).
    delta: δ, the share of the retained data visited per iteration (0.05; the paper finds 5–25%
        sufficient, Fig. 8b, and reports its speed-up at 5%).
    batch_size: B of the remaining phase (None: the training's ``TrainConfig.batch_size``).
    rho: ρ, the proximal weight (0.01; not given: on mnist5k-vfl class removal, ρ ≥ 0.3 pulled
        the forgotten classes' weights back towards Θ_init, which remembers them, and made the
        runs oscillate).
    tau: τ⁰, the initial primal step (None: the training's ``TrainConfig.lr``, the step the
        retained loss was minimised with; not given).
    sigma: σ⁰, the initial dual step, per-sample units (0.02; not given: on mnist5k-vfl class
        removal 0.01–0.02 reached the constraint in 10–25 iterations with the retained accuracy
        recovering within 15 more; 0.05 and above overshot into misclassification first).
    tau_max, sigma_max: the caps τ_max, σ_max (None: 4·τ⁰ and 4·σ⁰; not given).
    alpha, beta: thresholds on x = ΔΘ^{k+1}/ΔΘ^k, β < α (2.0 and 0.5; not given: with R of a
        few mini-batches, x varies by up to about 2× from batch noise alone, so only a step
        that more than doubles signals instability).
    kappa_i, kappa_d: increase and decay factors, κ_i > 1 > κ_d (1.25 and 0.5; not given: a fast
        decay damps the growing element-wise penalty as soon as it destabilises the iterates).
    patience: iterations after the constraint first holds (15; not given: the retained accuracy
        recovered within about 15 iterations on mnist5k-vfl).

Cost: the bytes that crossed the channel (embeddings, embedding gradients, scalars) and F per
sample back-propagated (|D_u| + R·B per iteration) plus F/3 per forward-only sample (the final
L_u); see ``VerticalState.cost_since``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedunlearn.certify.certificate import CONSTRAINT_SATISFIED
from fedunlearn.federation.vertical import Party, VerticalState, shuffled
from fedunlearn.unlearning.base import DeletionBatch, Monitor, Outcome, UnlearningMethod
from fedunlearn.unlearning.registry import register

DUAL_FORMS = ("elementwise", "scalar")


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(P) per sample, P = softmax(logits), in nats."""
    log_p = F.log_softmax(logits, dim=1)
    return -(log_p.exp() * log_p).sum(1)


def kl_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """KL(P‖U) per sample, U uniform over the C classes: Σ_c P_c log(P_c / (1/C))."""
    log_p = F.log_softmax(logits, dim=1)
    return (log_p.exp() * (log_p + math.log(logits.shape[1]))).sum(1)


def uncertainty_loss(logits: torch.Tensor, omega: float) -> torch.Tensor:
    """L_u = Σ_j ω·(H(P_j) − KL(P_j‖U)) over the rows (Eq. 24, 28); equals Σ_j ω·(2H(P_j) − log C)."""
    return omega * (entropy(logits) - kl_to_uniform(logits)).sum()


def dual_update(omega: torch.Tensor, sigma: float, gamma: float, value: torch.Tensor) -> torch.Tensor:
    """Π_{Ω≥0}(Ω + σ(γ − value)): Algorithm 1 line 26 with value = ∂L_u/∂θ_i (element-wise),
    Eq. 20 with value = L_u (scalar)."""
    return (omega + sigma * (gamma - value)).clamp(min=0)


def adjustment(ratio: float, alpha: float, beta: float, kappa_i: float, kappa_d: float) -> float:
    """ξ(x) of Eq. 32: κ_i if x < β, κ_d if x > α, else 1."""
    if ratio < beta:
        return kappa_i
    if ratio > alpha:
        return kappa_d
    return 1.0


class _PartyDual:
    """FedORA's state at one party, all of it local: its parameters, θ_init, the last
    ∂L_u/∂θ_i, Θ^k (for ‖ΔΘ‖) and, in the element-wise form, its dual variables Ω_i."""

    def __init__(self, party: Party, elementwise: bool):
        self.party = party
        self.params = list(party.model.parameters())
        self.init = [p.detach().clone() for p in self.params]
        self.omega = [torch.zeros_like(p) for p in self.params] if elementwise else []
        self.grad_u: list[torch.Tensor] = []
        self.previous: list[torch.Tensor] = []

    def start_iteration(self) -> None:
        """Keep ∂L_u/∂θ_i (just back-propagated) and Θ^k."""
        self.grad_u = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.params]
        self.previous = [p.detach().clone() for p in self.params]

    def dual_step(self, sigma: float, gamma: float) -> None:
        self.omega = [dual_update(o, sigma, gamma, g) for o, g in zip(self.omega, self.grad_u)]

    @torch.no_grad()
    def primal_step(self, tau: float, rho: float, scalar_omega: torch.Tensor | None) -> None:
        """θ ← θ − τ(∂L_r/∂θ − ∂L_u/∂θ ∘ Ω + ρ(θ − θ_init)) (Eq. 34); ∂L_r/∂θ is in ``.grad``."""
        grads_r = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        push = torch._foreach_mul(self.grad_u, self.omega if scalar_omega is None else scalar_omega)
        step = torch._foreach_sub(grads_r, push)
        torch._foreach_add_(step, torch._foreach_sub(self.params, self.init), alpha=rho)
        torch._foreach_add_(self.params, step, alpha=-tau)

    @torch.no_grad()
    def squared_change(self) -> torch.Tensor:
        """This party's share of ‖Θ^{k+1} − Θ^k‖²."""
        return sum(((p - q) ** 2).sum() for p, q in zip(self.params, self.previous))

    def omega_statistics(self) -> dict[str, float]:
        flat = torch.cat([o.flatten() for o in self.omega])
        return {"min": float(flat.min()), "mean": float(flat.mean()), "max": float(flat.max()),
                "norm": float(flat.norm()), "nonzero_fraction": float((flat > 0).float().mean()),
                "entries": int(flat.numel())}


class _RetainedBatches:
    """Mini-batches B_r^s ⊂ D_r for the remaining phase: a walk through seeded shuffles of D_r,
    continued across iterations so that consecutive iterations see different samples. Pass p
    shuffles with (seed, first_pass + p), after the original training's epochs."""

    def __init__(self, retained: torch.Tensor, batch_size: int, seed: int, first_pass: int):
        self.retained, self.batch_size, self.seed = retained, batch_size, seed
        self.next_pass, self.order, self.cursor = first_pass, retained[:0], 0

    def next(self) -> torch.Tensor:
        if self.cursor >= len(self.order):
            self.order = self.retained[shuffled(len(self.retained), self.seed, self.next_pass)
                                       .to(self.retained.device)]
            self.next_pass, self.cursor = self.next_pass + 1, 0
        batch = self.order[self.cursor:self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return batch


@register
class FedORA(UnlearningMethod):
    name = "fedora"
    settings = frozenset({"vfl"})
    request_kinds = frozenset({"sample", "class"})
    guarantee = CONSTRAINT_SATISFIED

    def __init__(self, *, iterations: int = 60, omega: float = 2.0, gamma: float = 0.9, dual: str = "elementwise",
                 delta: float = 0.05, batch_size: int | None = None, rho: float = 0.01, tau: float | None = None,
                 sigma: float = 0.02, tau_max: float | None = None, sigma_max: float | None = None,
                 alpha: float = 2.0, beta: float = 0.5, kappa_i: float = 1.25, kappa_d: float = 0.5,
                 patience: int = 15):
        self.iterations = iterations
        self.omega = omega
        self.gamma = gamma
        self.dual = dual
        self.delta = delta
        self.batch_size = batch_size
        self.rho = rho
        self.tau = tau
        self.sigma = sigma
        self.tau_max = tau_max
        self.sigma_max = sigma_max
        self.alpha = alpha
        self.beta = beta
        self.kappa_i = kappa_i
        self.kappa_d = kappa_d
        self.patience = patience
        self._require(isinstance(iterations, int) and iterations >= 1, "iterations", "an integer >= 1")
        self._require(omega > 0, "omega", "> 0")
        self._require(-1 < gamma <= 1, "gamma", "in (-1, 1] (a share of the maximum uncertainty ω·log C)")
        self._require(dual in DUAL_FORMS, "dual", f"one of {', '.join(DUAL_FORMS)}")
        self._require(0 <= delta <= 1, "delta", "in [0, 1]")
        self._require(batch_size is None or (isinstance(batch_size, int) and batch_size >= 1), "batch_size",
                      "an integer >= 1 or None")
        self._require(rho >= 0, "rho", ">= 0")
        self._require(tau is None or tau > 0, "tau", "> 0 or None")
        self._require(sigma > 0, "sigma", "> 0")
        self._require(tau_max is None or tau_max >= (tau or 0), "tau_max", ">= tau, or None")
        self._require(sigma_max is None or sigma_max >= sigma, "sigma_max", ">= sigma, or None")
        self._require(0 < beta < alpha, "beta", f"in (0, alpha={alpha})")
        self._require(kappa_i > 1, "kappa_i", "> 1")
        self._require(0 < kappa_d < 1, "kappa_d", "in (0, 1)")
        self._require(isinstance(patience, int) and patience >= 0, "patience", "an integer >= 0")

    def _unlearn(self, fed_state: VerticalState, batch: DeletionBatch, monitor: Monitor) -> Outcome:
        federation = fed_state.federation
        federation.load_state(fed_state.state)
        before = federation.meter()
        forget, retained = fed_state.positions(batch)
        config = fed_state.train_config
        batch_size = self.batch_size or config.batch_size
        substeps = math.ceil(self.delta * len(retained) / batch_size)  # R = ⌈δ|D_r|/B⌉
        # Per forget sample (see "Units of γ"): the paper's iteration on L_u with σ/|D_u|².
        gamma = self.gamma * self.omega * math.log(fed_state.num_classes)
        tau = self.tau if self.tau is not None else config.lr
        sigma = self.sigma
        tau_max = self.tau_max if self.tau_max is not None else 4 * tau
        sigma_max = self.sigma_max if self.sigma_max is not None else 4 * sigma
        elementwise = self.dual == "elementwise"
        parties = [_PartyDual(p, elementwise) for p in federation.parties]
        scalar_omega = torch.zeros((), device=federation.device)
        draws = _RetainedBatches(retained, batch_size, federation.seed, first_pass=config.rounds)

        def mean_uncertainty(logits: torch.Tensor, _labels: torch.Tensor) -> torch.Tensor:
            return uncertainty_loss(logits, self.omega) / len(forget)

        trajectory, change, satisfied_at, k = [], 0.0, None, 0
        for k in range(1, self.iterations + 1):
            # Unlearning phase: full batch on D_u; every party keeps ∂L_u/∂θ_i; dual update.
            federation.zero_grad()
            l_u = federation.backprop(forget, mean_uncertainty)
            for party in parties:
                party.start_iteration()
            if elementwise:
                for party in parties:
                    party.dual_step(sigma, gamma)
                received = [None] * len(parties)
            else:  # the active party holds L_u, so it updates Ω and sends it to every party
                scalar_omega = dual_update(scalar_omega, sigma, gamma, torch.tensor(l_u, device=federation.device))
                received = [o.reshape(()) for o in federation.broadcast_scalars(scalar_omega.reshape(1))]
            if satisfied_at is None and l_u >= gamma:
                satisfied_at = k
            # Remaining phase: R mini-batch primal steps on retained data (Algorithm 2).
            for _ in range(substeps):
                federation.zero_grad()
                federation.backprop(draws.next())
                for party, omega in zip(parties, received):
                    party.primal_step(tau, self.rho, omega)
            tau, sigma, change = self._adapt(federation, parties, change, (tau, sigma), (tau_max, sigma_max))
            trajectory.append({"iteration": k, "L_u": l_u * len(forget), "delta_theta": change, "tau": tau,
                               "sigma": sigma})
            monitor.record("unlearn", k, federation.state, L_u=l_u * len(forget), tau=tau, sigma=sigma)
            if satisfied_at is not None and k >= satisfied_at + self.patience:
                break
        final = float(uncertainty_loss(federation.logits(forget), self.omega))
        cost = fed_state.cost_since(before)
        numbers = self._numbers(final, gamma, len(forget), fed_state.num_classes, (k, satisfied_at, substeps),
                                _dual_statistics(parties, scalar_omega, elementwise), trajectory)
        return Outcome(federation.state, cost, certificate_inputs=numbers,
                       notes={"dual_form": self.dual, "iterations": k, "remaining_steps_per_iteration": substeps,
                              "forget_samples": len(forget), "retained_samples": len(retained)})


    def _adapt(self, federation, parties: list[_PartyDual], change: float, steps: tuple[float, float],
               caps: tuple[float, float]) -> tuple[float, float, float]:
        """Adaptive step sizes: the active party gathers the parties' ‖ΔΘ‖² shares and sends back (τ, σ),
        scaled by κ_i or κ_d as the change ratio leaves [β, α], capped at (τ_max, σ_max)."""
        (tau, sigma), (tau_max, sigma_max) = steps, caps
        shares = federation.gather_scalars([party.squared_change() for party in parties])
        new_change = math.sqrt(float(sum(shares)))
        if change > 0:
            factor = adjustment(new_change / change, self.alpha, self.beta, self.kappa_i, self.kappa_d)
            tau, sigma = min(tau * factor, tau_max), min(sigma * factor, sigma_max)
        federation.broadcast_scalars(torch.tensor([tau, sigma], device=federation.device))
        return tau, sigma, new_change

    def _numbers(self, final: float, gamma: float, forget: int, num_classes: int, progress: tuple,
                 duals: dict, trajectory: list[dict]) -> dict:
        """The certificate's inputs: final L_u against γ (totals and per sample), the iterations, the
        dual variables and the step sizes along the way."""
        k, satisfied_at, substeps = progress
        threshold = gamma * forget
        return {"dual_form": self.dual, "L_u": final, "gamma": threshold, "satisfied": final >= threshold,
                "L_u_per_sample": final / forget, "gamma_per_sample": gamma,
                "L_u_max": self.omega * math.log(num_classes) * forget,
                "iterations": k, "first_satisfied_iteration": satisfied_at, "remaining_steps_per_iteration": substeps,
                "dual_variables": duals, "step_sizes": trajectory,
                "assumptions": {"final L_u >= gamma": final >= threshold}}


def _dual_statistics(parties: list[_PartyDual], scalar_omega: torch.Tensor, elementwise: bool) -> dict:
    """Per party (element-wise Ω_i) or the one scalar Ω."""
    if not elementwise:
        return {"omega": float(scalar_omega)}
    return {f"party_{p.party.index:03d}": p.omega_statistics() for p in parties}
