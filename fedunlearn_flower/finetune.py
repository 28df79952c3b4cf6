"""Fine-tuning on the retained data only, over Flower.

Paper: the "Natural" baseline of "Federated Unlearning via Negated Pseudo-Gradients"
(puf-negated-pseudo-gradients.txt, §V: "fine tuning the global model without the participation of
the unlearning client, no explicit unlearning is performed"). The in-process method is
``fedunlearn.unlearning.finetune``; here its rounds are the training's FedAvg rounds through Flower
(``train`` messages, subset ``retained``), numbered after the training's, so every client shuffles
and the server samples as the in-process engine does.
"""

from __future__ import annotations

from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.local import State
from fedunlearn.unlearning.finetune import FineTune as InProcessFineTune
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.puf import forget_lists
from fedunlearn_flower.wrapping import OverFlower


class FineTune(OverFlower):
    """Fine-tuning strategy on a ``Federation``: sample, class and client requests. Its settings
    are ``fedunlearn.unlearning.finetune.FineTune``'s (``rounds``)."""

    in_process = InProcessFineTune

    def run(self, federation: Federation, state: State, forget_set: ForgetSet,
            training: FedAvg) -> tuple[State, dict]:
        """``rounds`` FedAvg rounds on the retained data; the model and what was run."""
        forget = forget_lists(forget_set)
        retained = {c: n - len(forget.get(c, [])) for c, n in federation.sizes.items()}
        state = training.run(federation, state, first_round=training.rounds, rounds=self.method.rounds, sizes=retained,
                             forget_ids=forget)
        return state, {"target_clients": sorted(forget), "rounds": self.method.rounds}
