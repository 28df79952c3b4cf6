"""HF-KCU — Hessian-free Krylov causal unlearning: an influence-function removal (one Newton step
on the retained objective) computed without forming the Hessian [1] (§3, Algorithm 1,
Appendix A.2).

Each client holding forget data solves (H + λI) v_i = g_i/n_r by k conjugate-gradient steps on
Hessian-vector products from double backprop [3, 4] (``krylov.py``) — g_i its forget samples'
summed gradient, n_r the federation's retained samples — and the server applies θ + Σ_i w_i Δθ_i.
The sign is the key decision: Δθ_i = +v_i (scaled) is one Newton step on the mean retained
objective, the influence of removing the forget samples [2]; the paper's literal −v descends the
forget loss, i.e. learns the forget data further. The certificate (``bounded approximation``)
says the step approximates the damped Newton step — not the retrained model — and needs H + λI
estimated positive definite, a step the β cap did not truncate and a Newton residual within τ.
The derivation, the convex oracle test of the sign (tests/test_hf_kcu.py), the Hessian and
weighting choices, the checks, recorded numbers, cost and measurements: docs/methods.md, "hf-kcu".

Hyperparameters (default; the paper's value):
    cg_iterations: k, CG steps per affected client (10; 10).
    damping: λ in H + λI (0.01; 0.01). 0 is allowed when the objective is strongly convex.
    beta: β of the adaptive scale min(1, β‖θ‖/‖v‖) (0.01; 0.01); None switches it off.
    hessian: "client" (each affected client's own curvature) or "federation" (the federation's
        retained Hessian, one federated round per CG step) ("client"; the paper's line 5).
    hessian_batch: curvature on a seeded random mini-batch of this many samples per client, as
        Hessian-free optimisation does [4] (None: all the client's samples; the paper does not say).
    weights: "sum" or "causal", how the clients' steps combine ("sum"; the paper's α_i is "causal").
    finetune_rounds: FedAvg rounds on the retained data after the step (0; the paper: none).
    lanczos_steps: m, Lanczos steps of the definiteness check (20; the paper runs none).
    residual_tolerance: τ, the largest relative Newton residual certified (1e-3; the paper marks
        CG "converged" at 1e-4 in its Figure 1 and takes k = 10 for an error of 0.01 at κ ~ 100).
    max_doublings: with calibration rows, how many times k may double and λ halve until the forget
        loss reaches the calibration rows' (0: the chosen k and λ, unjudged, as in the paper;
        docs/methods.md, "Strength").

References
----------
.. [1] A. Mahdavi, A. Zamanifar, A. F. Farhadi and O. Kashefi, "Causal Unlearning in Collaborative
   Optimization: Exact and Approximate Influence Reversal under Adversarial Contributions",
   arXiv:2605.20341, 2026 (hf-kcu-krylov-causal-unlearning.txt).
.. [2] P. W. Koh and P. Liang, "Understanding Black-box Predictions via Influence Functions",
   ICML 2017.
.. [3] B. A. Pearlmutter, "Fast Exact Multiplication by the Hessian", Neural Computation 6(1),
   pp. 147–160, 1994.
.. [4] J. Martens, "Deep Learning via Hessian-free Optimization", ICML 2010.
.. [5] A. Mora, C. Mazzocca, R. Montanari and P. Bellavista, "Federated Unlearning Made Practical:
   Seamless Integration via Negated Pseudo-Gradients" (puf-negated-pseudo-gradients.txt), the
   byte count of its Appendix B.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedunlearn.certify.certificate import BOUNDED_APPROXIMATION
from fedunlearn.federation.cost import Cost, communication_bytes, training_flops
from fedunlearn.federation.local import State, Tensors
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod,
                                        calibrated_forget, climb_ladder, fedavg_rounds, num_params)
from fedunlearn.unlearning.krylov import (CGResult, LanczosResult, Operator, add_to_parameters, conjugate_gradient,
                                          flat_objective, flatten_parameters, gradient, hvp_operator, lanczos,
                                          lanczos_ritz_values, ritz_values)
from fedunlearn.unlearning.registry import register

HESSIANS = ("client", "federation")
WEIGHTS = ("sum", "causal")
# A Hessian-vector product by double backprop ≈ two gradient evaluations (Pearlmutter 1994).
HVP_OVER_TRAINING_STEP = 2


@dataclass
class KrylovStep:
    """One affected client's scaled step Δθ_i = scale_i·v_i and what certifies it (device tensors)."""

    client: int
    step: torch.Tensor
    gradient_norm: torch.Tensor  # ‖g_i‖, for the causal weight α_i
    scale: torch.Tensor
    cg: CGResult
    residual: torch.Tensor  # ‖(H + λI)v_i − b_i‖/‖b_i‖, b_i = g_i/n_r: the true residual, one more product
    curvature_samples: int  # samples behind each Hessian-vector product
    spectrum: LanczosResult | None = None  # of the operator CG solved with; None: CG proved it indefinite


@dataclass
class Removal:
    """The server's step at one strength (k, λ): the unlearned state, what computing it cost, its
    certificate inputs and the affected clients."""

    state: State
    cost: Cost
    numbers: dict
    clients: list[int]
    cg_iterations: int
    damping: float


@register
class HFKCU(UnlearningMethod):
    """The Newton-step removal of the module docstring, whose "Hyperparameters" lists every option
    with its default. ``max_doublings`` (default 0: off, the chosen k and λ as in the paper): with
    calibration rows, how many times k may double and λ halve, cheapest first, until the forget
    set's loss reaches the calibration rows' (docs/methods.md, "Strength")."""

    name = "hf-kcu"
    stronger_scales = ("cg_iterations",)
    stronger_switches = {"hessian": "federation", "beta": None}
    settings = frozenset({"hfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = BOUNDED_APPROXIMATION

    def __init__(self, *, cg_iterations: int = 10, damping: float = 0.01, beta: float | None = 0.01,
                 hessian: str = "client", hessian_batch: int | None = None, weights: str = "sum",
                 finetune_rounds: int = 0, lanczos_steps: int = 20, residual_tolerance: float = 1e-3,
                 max_doublings: int = 0):
        self.cg_iterations = cg_iterations
        self.damping = damping
        self.beta = beta
        self.hessian = hessian
        self.hessian_batch = hessian_batch
        self.weights = weights
        self.finetune_rounds = finetune_rounds
        self.lanczos_steps = lanczos_steps
        self.residual_tolerance = residual_tolerance
        self.max_doublings = max_doublings
        self._require(isinstance(cg_iterations, int) and cg_iterations >= 1, "cg_iterations", "an integer >= 1")
        self._require(isinstance(lanczos_steps, int) and lanczos_steps >= 1, "lanczos_steps", "an integer >= 1")
        self._require(residual_tolerance > 0, "residual_tolerance", "> 0")
        self._require(damping >= 0, "damping", ">= 0")
        self._require(beta is None or beta > 0, "beta", "> 0 or None")
        self._require(hessian in HESSIANS, "hessian", f"one of {', '.join(HESSIANS)}")
        self._require(hessian_batch is None or (isinstance(hessian_batch, int) and hessian_batch >= 1),
                      "hessian_batch", "an integer >= 1 or None")
        self._require(weights in WEIGHTS, "weights", f"one of {', '.join(WEIGHTS)}")
        self._require(isinstance(finetune_rounds, int) and finetune_rounds >= 0, "finetune_rounds",
                      "an integer >= 0")
        self._require(isinstance(max_doublings, int) and max_doublings >= 0, "max_doublings", "an integer >= 0")

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        forget = calibrated_forget(fed_state, forget_set, self.max_doublings)
        climb = climb_ladder(fed_state, forget, self._rungs(fed_state, forget_set, forget is not None),
                             state_of=lambda removal: removal.state,
                             describe=lambda removal: {"cg_iterations": removal.cg_iterations,
                                                       "damping": removal.damping})
        removal = climb.chosen
        monitor.record("unlearn", 1, removal.state)
        # Training on the retained data brings the forget loss back down: a ladder that never reached
        # the level stops here, as PUF stops before recovery, and costs its rungs only.
        rounds = 0 if climb.reached is False else self.finetune_rounds
        state, finetune_cost = fedavg_rounds(fed_state, fed_state.retained_clients(forget_set), state=removal.state,
                                             rounds=rounds, first_round=fed_state.train_config.rounds,
                                             phase="finetune", monitor=monitor)
        cost = sum((r.cost for r in climb.climbed), Cost()) + finetune_cost
        return Outcome(state, cost, certificate_inputs=removal.numbers,
                       notes={"target_clients": removal.clients, "hessian": self.hessian, "finetune_rounds": rounds,
                              "strength": climb.ladder})

    def _rungs(self, fed_state: FederatedState, forget_set: ForgetSet, climbing: bool) -> Iterator["Removal"]:
        """The removal at each rung, cheapest first: rung r takes 2^r·k CG steps at damping λ/2^r,
        each rung nearer the undamped Newton step for twice the products. Each is computed afresh
        from the trained state (λ changes the operator: nothing carries over); without
        ``climbing``, the chosen (k, λ) alone."""
        for r in range(self.max_doublings + 1 if climbing else 1):
            method = self if r == 0 else type(self)(**{**self.get_params(), "max_doublings": 0,
                                                        "cg_iterations": self.cg_iterations * 2 ** r,
                                                        "damping": self.damping / 2 ** r})
            yield method._removal(fed_state, forget_set)

    def _removal(self, fed_state: FederatedState, forget_set: ForgetSet) -> "Removal":
        """Algorithm 1 at this method's (k, λ): every affected client's step, combined and applied."""
        retained = fed_state.retained_clients(forget_set)
        forget = fed_state.forget_by_client(forget_set)
        n_retained = sum(len(c) for c in retained)
        if self.hessian == "client":
            # A client-level request leaves the client no retained samples: its own data D_i then (line 5).
            own = {c: retained[c] if len(retained[c]) else fed_state.clients[c] for c in forget}
            jobs = [{"fed_state": fed_state, "data": data, "client": c, "n_retained": n_retained,
                     "curvature": self._curvature_sample(fed_state, own[c], c)} for c, data in forget.items()]
            steps: list[KrylovStep] = fed_state.map_updates(self._local_step, jobs)
        else:
            steps = self._federated_steps(fed_state, forget, retained, n_retained)

        norms = torch.stack([s.gradient_norm for s in steps])
        causal = norms / norms.sum().clamp_min(torch.finfo(norms.dtype).tiny)  # Eq. 7
        weights = causal if self.weights == "causal" else torch.ones_like(causal)
        delta = sum(w * s.step for w, s in zip(weights, steps))
        model = fed_state.model_from(fed_state.state)
        unlearned = add_to_parameters(fed_state.state, model, delta)
        hessian_clients = sum(1 for c in retained if len(c))
        return Removal(unlearned, self._cost(fed_state, forget_set, steps, hessian_clients),
                       self._numbers(steps, causal, delta), [s.client for s in steps], self.cg_iterations,
                       self.damping)

    def _curvature_sample(self, fed_state: FederatedState, data: Tensors, client: int) -> Tensors:
        """All of ``data``, or a seeded mini-batch of ``hessian_batch`` of it."""
        if self.hessian_batch is None or self.hessian_batch >= len(data):
            return data
        rng = np.random.default_rng([fed_state.seed, fed_state.train_config.rounds, client])
        mask = np.zeros(len(data), dtype=bool)
        mask[rng.choice(len(data), size=self.hessian_batch, replace=False)] = True
        return data.select(mask)

    def _local_step(self, fed_state: FederatedState, data: Tensors, client: int, n_retained: int,
                    curvature: Tensors) -> KrylovStep:
        """Algorithm 1 lines 4–18 at client i (``data``: its forget samples), on its own curvature samples."""
        model = fed_state.model_from(fed_state.state)
        theta = flatten_parameters(model)
        g = self._forget_gradient(fed_state, data, client)
        operator = hvp_operator(flat_objective(model, curvature.x, curvature.y), theta, self.damping)
        step = self._solved(client, g, operator, n_retained, theta, len(curvature))
        return self._with_spectrum([step], operator, fed_state, theta, client)[0]

    def _federated_steps(self, fed_state: FederatedState, forget: dict[int, Tensors], retained: list[Tensors],
                         n_retained: int) -> list[KrylovStep]:
        """The same steps with H = H_r, the federation's retained Hessian: the server runs CG and
        every Hessian-vector product is one round over the clients with retained data."""
        theta = flatten_parameters(fed_state.model_from(fed_state.state))
        gradients = fed_state.map_updates(self._forget_gradient, [{"fed_state": fed_state, "data": data, "client": c}
                                                                  for c, data in forget.items()])
        curvature = {c: self._curvature_sample(fed_state, data, c) for c, data in enumerate(retained) if len(data)}
        shares = [len(retained[c]) / n_retained for c in curvature]  # H_r = Σ_j (n_j^r/n_r) H_j

        def operator(direction: torch.Tensor) -> torch.Tensor:
            jobs = [{"fed_state": fed_state, "data": data, "client": c, "direction": direction}
                    for c, data in curvature.items()]
            products = fed_state.map_updates(self._curvature_product, jobs)
            return sum(share * product for share, product in zip(shares, products)) + self.damping * direction

        samples = sum(len(data) for data in curvature.values())
        steps = [self._solved(c, g, operator, n_retained, theta, samples) for c, g in zip(forget, gradients)]
        # One operator for every affected client: its spectrum is estimated once (the server's key).
        return self._with_spectrum(steps, operator, fed_state, theta, len(fed_state.clients))

    def _with_spectrum(self, steps: list[KrylovStep], operator: Operator, fed_state: FederatedState,
                       theta: torch.Tensor, key: int) -> list[KrylovStep]:
        """The steps, which share ``operator``, with its Lanczos spectrum from a seeded random start
        — unless CG already met negative curvature on it (an α_t < 0: p_tᵀ(H + λI)p_t < 0, a proof of
        indefiniteness), which costs one host read and saves m products (the small CNN)."""
        if any(bool((s.cg.step_sizes < 0).any()) for s in steps):
            return steps
        # Drawn on the CPU from (seed, rounds, key): the same start vector on every device.
        seed = int(np.random.SeedSequence([fed_state.seed, fed_state.train_config.rounds, key]).generate_state(1)[0])
        start = torch.randn(theta.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        spectrum = lanczos(operator, start.to(theta.device, theta.dtype), self.lanczos_steps)
        return [replace(s, spectrum=spectrum) for s in steps]

    # ``client`` in the two jobs below only names the job, as in every client job (FedAvg.local_update).
    @staticmethod
    def _forget_gradient(fed_state: FederatedState, data: Tensors, client: int) -> torch.Tensor:
        """g_i: the gradient of the SUM of per-sample objective terms over client i's forget samples."""
        model = fed_state.model_from(fed_state.state)
        return len(data) * gradient(flat_objective(model, data.x, data.y), flatten_parameters(model))

    @staticmethod
    def _curvature_product(fed_state: FederatedState, data: Tensors, client: int,
                           direction: torch.Tensor) -> torch.Tensor:
        """Client j's H_j·direction, H_j the Hessian of its mean objective over ``data``."""
        model = fed_state.model_from(fed_state.state)
        return hvp_operator(flat_objective(model, data.x, data.y), flatten_parameters(model))(direction)

    def _solved(self, client: int, g: torch.Tensor, operator: Operator, n_retained: int, theta: torch.Tensor,
                curvature_samples: int) -> KrylovStep:
        """k CG steps on (H + λI)v = g/n_r, the true residual of v (one more product), and the
        adaptive scale min(1, β‖θ‖/‖v‖) (Eq. 21), on the device; 1 when β is None or v = 0."""
        b = g / n_retained
        cg = conjugate_gradient(operator, b, self.cg_iterations)
        v = cg.solution
        b_norm = b.norm()
        residual = torch.where(b_norm > 0, (operator(v) - b).norm() / b_norm, torch.zeros_like(b_norm))
        scale = torch.ones_like(theta[0])
        if self.beta is not None:
            v_norm = v.norm()
            scale = torch.where(v_norm > 0, torch.clamp(self.beta * theta.norm() / v_norm, max=1.0), scale)
        return KrylovStep(client, scale * v, g.norm(), scale, cg, residual, curvature_samples)

    def _cost(self, fed_state: FederatedState, forget_set: ForgetSet, steps: list[KrylovStep],
              hessian_clients: int) -> Cost:
        """Per affected client k CG products and one for the true residual; the Lanczos products, if
        it ran, once per operator: each client's own, or the federation's shared one (each of whose
        products is one round)."""
        dim = num_params(fed_state.state)
        checks = min(self.lanczos_steps, dim)
        exchanges = [len(steps)]
        if self.hessian == "client":
            products = sum((self.cg_iterations + 1 + (checks if s.spectrum is not None else 0)) * s.curvature_samples
                           for s in steps)
        else:
            rounds = (self.cg_iterations + 1) * len(steps) + (checks if steps[0].spectrum is not None else 0)
            products = rounds * steps[0].curvature_samples
            exchanges += [hessian_clients] * rounds
        per_sample = fed_state.flops_per_sample()
        flops = training_flops(per_sample, forget_set.num_forget, epochs=1) + \
            HVP_OVER_TRAINING_STEP * training_flops(per_sample, products, epochs=1)
        return Cost(flops=flops, comm_bytes=communication_bytes(dim, exchanges))

    def _numbers(self, steps: list[KrylovStep], causal: torch.Tensor, delta: torch.Tensor) -> dict:
        """Certificate inputs and the three checks behind ``bounded approximation`` (module
        docstring); the device tensors are read back here, once."""
        residuals = {s.client: s.cg.residual_norms.detach().cpu().double().numpy() for s in steps}
        ritz = {s.client: ritz_values(s.cg) for s in steps}
        # Both sets of Ritz values lie inside the spectrum: their union's extremes are the estimates.
        spectrum = {s.client: np.concatenate([ritz[s.client]] + ([] if s.spectrum is None else
                                                                 [lanczos_ritz_values(s.spectrum)])) for s in steps}
        lambda_min = {c: float(r.min()) for c, r in spectrum.items()}
        lambda_max = {c: float(r.max()) for c, r in spectrum.items()}
        newton = {s.client: float(s.residual) for s in steps}
        scale = {s.client: float(s.scale) for s in steps}
        return {
            "cg_iterations": self.cg_iterations, "damping": self.damping, "beta": self.beta,
            "hessian": self.hessian, "hessian_batch": self.hessian_batch, "weights": self.weights,
            "lanczos_steps": self.lanczos_steps, "residual_tolerance": self.residual_tolerance,
            "curvature_samples": {s.client: s.curvature_samples for s in steps},
            "cg_residual_norms": {c: r.tolist() for c, r in residuals.items()},
            "cg_relative_residual": {c: float(r[-1] / r[0]) if r[0] > 0 else 0.0 for c, r in residuals.items()},
            "newton_relative_residual": newton,
            "lanczos_ran": {s.client: s.spectrum is not None for s in steps},
            "ritz_range": {c: [float(r.min()), float(r.max())] if len(r) else None for c, r in ritz.items()},
            "lambda_min_estimate": lambda_min,
            "lambda_max_estimate": lambda_max,
            "condition_estimate": {c: lambda_max[c] / lambda_min[c] if lambda_min[c] > 0 else None
                                   for c in lambda_min},
            "damping_bias_estimate": {c: self.damping / lambda_min[c] if lambda_min[c] > 0 else None
                                      for c in lambda_min},
            "causal_weights": dict(zip([s.client for s in steps], causal.tolist())),
            "scale": scale,
            "step_norm": float(delta.norm()),
            "approximates": f"(H + λI)⁻¹ g_i / n_r, H the {self._approximated_hessian()}, λ = {self.damping}",
            "assumptions": {
                "positive_definite_damped_hessian": all(v > 0 for v in lambda_min.values()),
                "untruncated_newton_step": all(v >= 1.0 for v in scale.values()),
                "newton_residual_within_tolerance": all(v <= self.residual_tolerance for v in newton.values()),
            },
        }

    def _approximated_hessian(self) -> str:
        where = "client's own curvature" if self.hessian == "client" else "federation's retained curvature"
        return where if self.hessian_batch is None else f"{where} on mini-batches of {self.hessian_batch}"
