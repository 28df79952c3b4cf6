"""Fine-tuning on the retained data only — the "Natural" baseline of PUF (§V: "fine tuning the
global model without the participation of the unlearning client, no explicit unlearning is
performed") and the fine-tuning baseline FedORA's related work cites as [jiang2024towards].

FedAvg continues from the trained model for ``rounds`` more rounds with the original
``TrainConfig``; the clients train on their data minus the forget IDs, so what was learned from
the forget data fades only as far as further training overwrites it.

Hyperparameters:
    rounds: FedAvg rounds on the retained data (default 5; PUF lets "Natural" run for as many
        recovery rounds as the other methods get).
"""

from __future__ import annotations

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod,
                                        fedavg_rounds)
from fedunlearn.unlearning.registry import register


@register
class FineTune(UnlearningMethod):
    name = "finetune"
    roles = {"hfl": "fallback"}
    rank = 2
    settings = frozenset({"hfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = EMPIRICAL_ONLY

    def __init__(self, *, rounds: int = 5):
        self.rounds = rounds
        self._require(isinstance(rounds, int) and rounds >= 1, "rounds", "an integer >= 1")

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        state, cost = fedavg_rounds(fed_state, fed_state.retained_clients(forget_set), state=fed_state.state,
                                    rounds=self.rounds, first_round=fed_state.train_config.rounds,
                                    phase="unlearn", monitor=monitor)
        return Outcome(state, cost, certificate_inputs={"rounds": self.rounds}, notes={"rounds": self.rounds})
