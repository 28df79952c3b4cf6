"""Retrain from scratch on the retained data: the gold standard every other method is judged
against (DESIGN.md §3, "Baselines"; PUF §V "Retrain").

FedAvg with exactly the original configuration — the same seed (hence the same initial weights,
client shuffling and client sampling), ``model_fn``, ``TrainConfig`` and number of rounds — on
every client's data minus its forget IDs; a fully removed client simply has no data. No
hyperparameters: anything that differed from the original training would make it a different
reference. Its certificate class is ``exact retrain``.
"""

from __future__ import annotations

from fedunlearn.certify.certificate import EXACT_RETRAIN
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod,
                                        fedavg_rounds)
from fedunlearn.unlearning.registry import register


@register
class Retrain(UnlearningMethod):
    name = "retrain"
    settings = frozenset({"hfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = EXACT_RETRAIN

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        retained = fed_state.retained_clients(forget_set)
        rounds = fed_state.train_config.rounds
        state, cost = fedavg_rounds(fed_state, retained, state=None, rounds=rounds, first_round=0,
                                    phase="unlearn", monitor=monitor)
        retained_samples = sum(len(c) for c in retained)
        return Outcome(state, cost,
                       certificate_inputs={"rounds": rounds, "retained_samples": retained_samples,
                                           "forget_samples": forget_set.num_forget},
                       notes={"rounds": rounds})
