"""HF-KCU — Hessian-free Krylov causal unlearning: an influence-function removal (one Newton step
on the retained objective) computed without forming the Hessian [1] (§3, Algorithm 1,
Appendix A.2).

Each client holding forget data solves a damped Hessian system by k conjugate-gradient steps
whose Hessian-vector products come from double backprop [3, 4] (``krylov.py``). Per affected
client i, with U_i its forget samples and n_r the retained samples of the whole federation:

    g_i  = Σ_{u∈U_i} ∇f_u(θ)        f_u = CE_u + (l2/2)‖θ‖²: the SUM of per-sample objective terms,
                                    regulariser included (federation.local.objective, per sample)
    v_i ≈ (H + λI)⁻¹ g_i / n_r      k CG steps; H the Hessian of a MEAN objective (see ``hessian``)
    Δθ_i = scale_i · v_i,  scale_i = min(1, β‖θ‖/‖v_i‖)        (Algorithm 1 line 17, Eq. 21)
    server: θ ← θ + Σ_i w_i Δθ_i                                  (line 24–25; see ``weights``)

Sign. The step is +v, the removal direction: from the trained optimum, θ + H_r⁻¹ g/n_r is one
Newton step on the mean retained objective, the influence of up-weighting the forget samples by
−1/n [2]. The paper writes Δθ = −H⁻¹∇ℓ(D_u) (Eq. 3, 8) and Δθ_raw = −v_k (line 15); read
literally, that step descends the forget loss, i.e. learns the forget data further (docs/DESIGN.md
§3). The derivation, and the convex oracle test that checks the sign against the exactly
retrained optimum (tests/test_hf_kcu.py): docs/methods.md, "hf-kcu".

Which Hessian (``hessian``). ``"client"`` (the paper, Algorithm 1 line 5; default): client i's own
curvature over its retained samples (over its whole data D_i, as line 5 writes, when a
client-level request leaves it none). Local: one download and one upload per affected client, but
a few dozen samples give a Hessian far from the federation's. ``"federation"``: H_r itself,
Σ_j (n_j^r/n_r) H_j over every client's retained samples. Each CG iteration is one federated round:
the server broadcasts the direction, every client with retained data returns its Hessian-vector
product. Its step is the Newton step above, exactly. On a neural network neither is the retrained
model: the curvature can be indefinite at the trained point, which the certificate reports
(below). What each choice did on the oracle and on digits-hfl: docs/methods.md; its cost against
retraining: docs/BENCHMARKS.md.

Combining clients (``weights``). The removal step of a union of deletions is the SUM of the
per-client steps (H⁻¹ is linear in g), so ``"sum"`` (w_i = 1; default) is the Newton step on the
global retained objective when the clients share H (``hessian="federation"``). The paper's
causal weights α_i = ‖g_i‖/Σ_affected‖g_j‖ (Eq. 7; ``"causal"``) sum to 1 and shrink the step by
up to the number of affected clients; both coincide for one affected client, the case the paper
evaluates. Either way a client without forget data contributes nothing (g_i = 0: the paper's
causal isolation), and α_i is recorded.

Strength per batch (``max_doublings``; not in the paper; docs/DESIGN.md §3, "Calibration
rows"). With calibration rows (``FederatedState.calibration``: held-out samples the audit never
uses as non-members) the removal climbs a ladder cheapest first — rung r takes 2^r·k CG steps at
damping λ/2^r, closer to the undamped Newton step at twice the products — and keeps the first
rung whose forget samples' mean loss at their labels reaches the calibration rows' under the same
model: PUF's rule (``base.climb_ladder``, ``base.calibration_reached``). Every rung is computed
afresh from the trained state and counted in the cost. A ladder that never reaches the level
keeps its last rung, skips fine-tuning (training on the retained data brings the forget loss
back down) and says so in ``notes["strength"]``; the certificate inputs are the kept rung's. Off
by default, for PUF's reason: the mean loss does not predict the per-example audit
(docs/methods.md, "Strength").

Hyperparameters (default; the paper's value):
    cg_iterations: k, CG steps per affected client (10; 10).
    damping: λ in H + λI (0.01; 0.01). 0 is allowed when the objective is strongly convex.
    beta: β of the adaptive scale min(1, β‖θ‖/‖v‖) (0.01; 0.01); None switches it off.
    hessian: "client" or "federation", see above ("client"; the paper's line 5).
    hessian_batch: curvature on a seeded random mini-batch of this many samples per client, as
        Hessian-free optimisation estimates curvature [4] (None: all the client's samples; the
        paper does not say). Recorded with the sample counts in the certificate inputs.
    weights: "sum" or "causal", see above ("sum"; the paper's α_i is "causal").
    finetune_rounds: FedAvg rounds on the retained data after the step (0; the paper: none).
    lanczos_steps: m, Lanczos steps of the definiteness check below (20; the paper runs none).
    residual_tolerance: τ, the largest relative Newton residual certified (1e-3; the paper marks
        CG "converged" at 1e-4 in its Figure 1 and takes k = 10 for an error of 0.01 at κ ~ 100).
    max_doublings: with calibration rows, how many times k may double and λ halve, see "Strength
        per batch" (0: the chosen k and λ, unjudged, as in the paper).

Cost. FLOPs: one training pass (F per sample, federation/cost.py) over the forget samples for
g_i, and per Hessian-vector product 2·F per curvature sample — double backprop costs about two
gradient evaluations [3] (what a product costs against training epochs: docs/DESIGN.md §4,
docs/BENCHMARKS.md). Products: k (CG) + 1 (the true residual) per affected client, and m
(Lanczos) per operator — each affected client's own with ``client``, the federation's one with
``federation`` — unless CG met negative curvature on it (below). Bytes (2·P·B per transfer pair,
[5] Appendix B): ``client``: θ down and Δθ_i up per affected client; ``federation``: θ down and
g_i up per affected client, then per product the direction down and the product up per client
with retained data. Plus the fine-tuning rounds, if any, and with a ladder every rung climbed.

Certificate (``bounded approximation``): the step v_i approximates the damped Newton step
v_i* = (H + λI)⁻¹ g_i/n_r (the Hessian named in ``approximates``) — not the retrained model: the
Hessian choice above decides how close that is. It is issued only if three checks hold, each an
assumption of ``certify.certificate_for`` that downgrades it to ``not certified`` by name:

* ``positive_definite_damped_hessian``: CG's error bound (Eq. 6) needs H + λI positive definite.
  CG's step sizes α_t ≥ 0 do not show it, and neither do the Ritz values from CG's coefficients
  (``krylov.ritz_values``; they have the signs of the α_t, see ``krylov``). So m Lanczos steps
  from a seeded random start vector (``krylov.lanczos``; power iteration is dominated: its iterates
  lie in the same Krylov space) estimate λ_min as the smallest Ritz value of both runs. That is a
  Rayleigh quotient, ≥ λ_min: a negative estimate proves H + λI indefinite, a positive one is
  evidence, not proof. Where CG itself meets negative curvature (an α_t < 0 proves it:
  p_tᵀ(H + λI)p_t < 0) the Lanczos run is skipped and the cost stays k + 1 products. Why m = 20:
  docs/methods.md.
* ``untruncated_newton_step``: scale_i = 1. The β cap is a trust region with no error bound.
* ``newton_residual_within_tolerance``: ρ_i = ‖(H + λI)v_i − b_i‖/‖b_i‖ ≤ τ, b_i = g_i/n_r,
  computed with one more product (CG's recursive residual drifts from the true one in finite
  precision). The relative error of the step is at most κ·ρ (docs/methods.md).

Numbers, per affected client: the CG residual norms, the scale applied (``scale``), the true
relative residual (``newton_relative_residual``), whether Lanczos ran (``lanczos_ran``),
``lambda_min_estimate`` and ``lambda_max_estimate`` of H + λI (the extreme Ritz values of both
runs), ``condition_estimate`` = their ratio (a lower bound on κ), ``ritz_range`` of CG's own
Ritz values, and ``damping_bias_estimate`` = λ/λ_min(H + λI): for H positive definite, the
fraction of the undamped Newton step by which the damped step may differ from it (docs/methods.md),
estimated from below as λ_min is from above. It is reported, not checked. Also k, λ, β, m, τ, the
Hessian and its sample counts, and what the step approximates (``approximates``).

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
from fedunlearn.federation.cost import CostRecord, communication_bytes, training_flops
from fedunlearn.federation.local import State, Tensors
from fedunlearn.unlearning.base import (DeletionBatch, FederatedState, Monitor, Outcome, UnlearningMethod,
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
    cost: CostRecord
    numbers: dict
    clients: list[int]
    cg_iterations: int
    damping: float


@register
class HFKCU(UnlearningMethod):
    """The Newton-step removal of the module docstring, whose "Hyperparameters" lists every option
    with its default. ``max_doublings`` (default 0: off, the chosen k and λ as in the paper): with
    calibration rows, how many times k may double and λ halve, cheapest first, until the forget
    set's loss reaches the calibration rows' ("Strength per batch")."""

    name = "hf-kcu"
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

    def _unlearn(self, fed_state: FederatedState, batch: DeletionBatch, monitor: Monitor) -> Outcome:
        forget = calibrated_forget(fed_state, batch, self.max_doublings)
        climb = climb_ladder(fed_state, forget, self._rungs(fed_state, batch, forget is not None),
                             state_of=lambda removal: removal.state,
                             describe=lambda removal: {"cg_iterations": removal.cg_iterations,
                                                       "damping": removal.damping})
        removal = climb.chosen
        monitor.record("unlearn", 1, removal.state)
        # Training on the retained data brings the forget loss back down: a ladder that never reached
        # the level stops here, as PUF stops before recovery, and costs its rungs only.
        rounds = 0 if climb.reached is False else self.finetune_rounds
        state, finetune_cost = fedavg_rounds(fed_state, fed_state.retained_clients(batch), state=removal.state,
                                             rounds=rounds, first_round=fed_state.train_config.rounds,
                                             phase="finetune", monitor=monitor)
        cost = sum((r.cost for r in climb.climbed), CostRecord()) + finetune_cost
        return Outcome(state, cost, certificate_inputs=removal.numbers,
                       notes={"target_clients": removal.clients, "hessian": self.hessian, "finetune_rounds": rounds,
                              "strength": climb.ladder})

    def _rungs(self, fed_state: FederatedState, batch: DeletionBatch, climbing: bool) -> Iterator["Removal"]:
        """The removal at each rung, cheapest first: rung r takes 2^r·k CG steps at damping λ/2^r,
        each rung nearer the undamped Newton step for twice the products. Each is computed afresh
        from the trained state (λ changes the operator: nothing carries over); without
        ``climbing``, the chosen (k, λ) alone."""
        for r in range(self.max_doublings + 1 if climbing else 1):
            method = self if r == 0 else type(self)(**{**self.get_params(), "max_doublings": 0,
                                                        "cg_iterations": self.cg_iterations * 2 ** r,
                                                        "damping": self.damping / 2 ** r})
            yield method._removal(fed_state, batch)

    def _removal(self, fed_state: FederatedState, batch: DeletionBatch) -> "Removal":
        """Algorithm 1 at this method's (k, λ): every affected client's step, combined and applied."""
        retained = fed_state.retained_clients(batch)
        forget = fed_state.forget_by_client(batch)
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
        return Removal(unlearned, self._cost(fed_state, batch, steps, hessian_clients),
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

    def _cost(self, fed_state: FederatedState, batch: DeletionBatch, steps: list[KrylovStep],
              hessian_clients: int) -> CostRecord:
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
        flops = training_flops(per_sample, batch.num_forget, epochs=1) + \
            HVP_OVER_TRAINING_STEP * training_flops(per_sample, products, epochs=1)
        return CostRecord(flops=flops, comm_bytes=communication_bytes(dim, exchanges))

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
