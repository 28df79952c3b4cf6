"""HF-KCU — Hessian-free Krylov causal unlearning, over Flower.

Paper: "Causal Unlearning in Collaborative Optimization: Exact and Approximate Influence Reversal
under Adversarial Contributions" (hf-kcu-krylov-causal-unlearning.txt; §3, Algorithm 1). The
in-process method is ``fedunlearn.unlearning.hf_kcu``; both of its Hessians run here, every
Hessian-vector product computed where the data is. With the client's own curvature (the paper's
line 5, the default) each affected client runs the whole step in one ``query.krylov`` message.
With the federation's retained Hessian the server runs CG:

    g_i   = Σ_{u∈U_i} ∇f_u(θ)                    a ``query.gradient`` message to each affected client
    H_r v = Σ_j (n_j^r/n_r) H_j v                a ``query.hvp`` message to every client with retained data
    v_i  ≈ (H_r + λI)⁻¹ g_i / n_r                k CG steps on the server, one exchange per product
    θ    ← θ + Σ_i w_i · min(1, β‖θ‖/‖v_i‖) v_i

The clients see the current model and a direction, and return a vector of the model's size: no
sample leaves them. The step is the in-process method's; the certificate's extra products (the
true residual, the Lanczos definiteness check) are not run here, so a model unlearned through
Flower carries the step, not the ``bounded approximation`` checks.
"""

from __future__ import annotations

import torch

from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.local import State
from fedunlearn.unlearning.hf_kcu import HFKCU as InProcessHFKCU
from fedunlearn.unlearning.krylov import add_to_parameters, conjugate_gradient, flatten_parameters
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.puf import forget_lists
from fedunlearn_flower.wrapping import OverFlower


class HFKCU(OverFlower):
    """HF-KCU strategy on a ``Federation``; the Hessian is the federation's retained Hessian H_r.
    Its settings are ``fedunlearn.unlearning.hf_kcu.HFKCU``'s (k, λ, β, where the curvature is
    computed and on how many rows, the clients' weights, the fine-tuning rounds); the step's
    calibration ladder and its Lanczos bound (``max_doublings``, ``lanczos_steps``,
    ``residual_tolerance``) are the in-process method's only."""

    in_process = InProcessHFKCU
    pinned = {name: InProcessHFKCU.defaults()[name] for name in ("max_doublings", "lanczos_steps",
                                                                 "residual_tolerance")}

    def run(self, federation: Federation, state: State, forget_set: ForgetSet,
            training: FedAvg) -> tuple[State, dict]:
        forget = forget_lists(forget_set)
        retained = {c: n - len(forget.get(c, [])) for c, n in federation.sizes.items()}
        model = federation.scenario.model_from(state)
        if self.method.hessian == "client":
            steps, norms, exchanges = self._client_steps(federation, state, forget, retained, training.rounds)
        else:
            steps, norms, exchanges = self._federation_steps(federation, state, forget, retained, training.rounds,
                                                             flatten_parameters(model))
        norms_t = torch.stack(norms)
        causal = norms_t / norms_t.sum().clamp_min(torch.finfo(norms_t.dtype).tiny)  # Eq. 7
        weights = causal if self.method.weights == "causal" else torch.ones_like(causal)
        unlearned = add_to_parameters(state, model, sum(w * s for w, s in zip(weights, steps)))
        unlearned = training.run(federation, unlearned, first_round=training.rounds, rounds=self.method.finetune_rounds,
                                 sizes=retained, forget_ids=forget)
        return unlearned, {"target_clients": sorted(forget), "hessian": self.method.hessian, "hvp_exchanges": exchanges,
                           "causal_weights": dict(zip(sorted(forget), causal.tolist()))}

    def _client_steps(self, federation: Federation, state: State, forget: dict[int, list[str]],
                      retained: dict[int, int], round_idx: int) -> tuple[list, list, int]:
        """One ``query.krylov`` message per affected client: it runs the whole step on its own data."""
        config = {"subset": "forget", "round": round_idx, "n-retained": sum(retained.values()),
                  "cg-iterations": self.method.cg_iterations, "damping": self.method.damping, "beta": self.method.beta or 0.0,
                  "hessian-batch": self.method.hessian_batch or 0}
        replies = federation.vectors("query.krylov", state, {c: {**config, "forget-ids": ids}
                                                             for c, ids in forget.items()}, "hf-kcu-krylov")
        norms = [torch.tensor(metrics["gradient-norm"], dtype=step.dtype) for step, metrics in replies.values()]
        return [step for step, _ in replies.values()], norms, 0

    def _federation_steps(self, federation: Federation, state: State, forget: dict[int, list[str]],
                          retained: dict[int, int], round_idx: int, theta: torch.Tensor) -> tuple[list, list, int]:
        """g_i from the affected clients, then k CG steps on the server, each product one exchange."""
        n_retained = sum(retained.values())
        gradients = federation.vectors("query.gradient", state, {c: {"subset": "forget", "forget-ids": ids}
                                                                 for c, ids in forget.items()}, "hf-kcu-gradients")
        operator, products = self._operator(federation, state, forget, retained, round_idx)
        steps, norms = [], []
        for g, _ in gradients.values():
            v = conjugate_gradient(operator, g / n_retained, self.method.cg_iterations).solution
            scale = torch.ones_like(theta[0])
            if self.method.beta is not None:
                v_norm = v.norm()
                scale = torch.where(v_norm > 0, torch.clamp(self.method.beta * theta.norm() / v_norm, max=1.0), scale)
            steps.append(scale * v)
            norms.append(g.norm())
        return steps, norms, products[0]

    def _operator(self, federation: Federation, state: State, forget: dict[int, list[str]],
                  retained: dict[int, int], round_idx: int):
        """v ↦ Σ_j (n_j^r/n_r) H_j v + λv, one ``query.hvp`` exchange per call; and a counter of them."""
        n_retained = sum(retained.values())
        holders = [c for c in sorted(retained) if retained[c] > 0]
        jobs = {c: {"subset": "retained", "forget-ids": forget.get(c, []), "round": round_idx,
                    "hessian-batch": self.method.hessian_batch or 0} for c in holders}
        count = [0]

        def apply(direction: torch.Tensor) -> torch.Tensor:
            count[0] += 1
            products = federation.vectors("query.hvp", state, jobs, f"hf-kcu-hvp-{count[0]}", vector=direction)
            return sum((retained[c] / n_retained) * products[c][0] for c in holders) + self.method.damping * direction

        return apply, count
