"""Projected gradient ascent (PGA) — the target clients ascend the loss on their forget data, over Flower.

Paper: Halimi, Kadhe, Rawat and Baracaldo (2022), "Federated Unlearning: How to Efficiently Erase a
Client in FL?", arXiv:2207.05521 (hyperparameters as reported in "Federated Unlearning via Negated
Pseudo-Gradients", Appendix A). The in-process method is ``fedunlearn.unlearning.gradient_ascent``
(its docstring and docs/methods.md, "ga", give the extension to several targets and to sample and
class requests); this is the same protocol as Flower messages, with the same client code
(``GradientAscent.ascend``) and the same server arithmetic (``reference_model``, ``projection_radius``).

1. The reference w_ref, the model without the targets' contribution: each target replays its last
   update on its forget data (a ``train`` message, subset ``forget``, the training's local epochs),
   and the server removes those updates from the trained model, w_ref = (n·w − Σ n_u·w_u)/(n − Σ n_u).
2. Each target gets a ``train.ascent`` message — the trained model, w_ref, the radius δ — and ascends
   its forget loss, every iterate projected onto the ball of radius δ around w_ref, stopping early
   once a mini-batch loss exceeds τ; it returns the model, never a sample.
3. The server averages the ascended models by forget size, then runs ``recovery_rounds`` FedAvg
   rounds on the retained data.
"""

from __future__ import annotations

import json

from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.fedavg import aggregate
from fedunlearn.federation.local import State
from fedunlearn.unlearning.gradient_ascent import GradientAscent as InProcessGradientAscent
from fedunlearn.unlearning.gradient_ascent import reference_model
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.puf import forget_lists
from fedunlearn_flower.records import REFERENCE
from fedunlearn_flower.wrapping import OverFlower


class GradientAscent(OverFlower):
    """Projected gradient ascent strategy on a ``Federation``: sample, class and client requests.
    Its settings are ``fedunlearn.unlearning.gradient_ascent.GradientAscent``'s (the step size, epochs,
    batch size, clipping, τ, the radius δ or its fraction, the recovery rounds)."""

    in_process = InProcessGradientAscent

    def run(self, federation: Federation, state: State, forget_set: ForgetSet,
            training: FedAvg) -> tuple[State, dict]:
        """The reference, the targets' ascent, then recovery; the unlearned model and what was run."""
        forget = forget_lists(forget_set)
        retained = {c: n - len(forget.get(c, [])) for c, n in federation.sizes.items()}
        round_idx = training.rounds  # the round after training: fresh shuffling seeds, as in-process
        replayed = federation.train(state, round_idx, sorted(forget), subset="forget", forget_ids=forget,
                                    **training.client_hyperparameters())
        reference = reference_model(state, replayed, sum(federation.sizes.values()))
        radius = self.method.projection_radius(training.initial_state(federation), reference)
        config = {"round": round_idx, "lr": self.method.lr or training.config.lr, "radius": radius,
                  "method-params": json.dumps(self.method.get_params()), "subset": "forget"}
        replies = federation.updates("train.ascent", state, {c: {**config, "forget-ids": ids}
                                                             for c, ids in sorted(forget.items())},
                                     "ga-ascent", states={c: {REFERENCE: reference} for c in forget})
        unlearned = aggregate(state, [update for update, _ in replies.values()])  # server_lr 1: the ascended models
        unlearned = training.run(federation, unlearned, first_round=round_idx, rounds=self.method.recovery_rounds,
                                 sizes=retained, forget_ids=forget)
        return unlearned, {"target_clients": sorted(forget), "reference": "replayed forget-data update",
                           "radius": radius, "ascent_steps": sum(int(m["steps"]) for _, m in replies.values()),
                           "early_stopped_clients": sum(int(m["early-stopped"]) for _, m in replies.values()),
                           "recovery_rounds": self.method.recovery_rounds}
