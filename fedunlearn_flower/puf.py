"""PUF — federated unlearning via negated pseudo-gradients, over Flower.

Paper: "Federated Unlearning via Negated Pseudo-Gradients" (puf-negated-pseudo-gradients.txt;
§IV, Eq. 4–9, Algorithm 1). The in-process method is ``fedunlearn.unlearning.puf``; this is the
same protocol with its rounds as Flower messages, and the same server step (``puf_aggregate``).

The targets — the clients holding forget samples — get a ``train`` message with subset ``forget``
and ``local-epochs`` = E_u: each trains from the global model on its forget samples only and
returns the model, never the samples. The server negates their aggregated update, scaled by η_u
(PUF-Special: w ← w − η_u Δ⁻, Eq. 9; PUF-Regular: a FedAvg round of the other clients at the same
time, w ← w + η_r Δ⁺ − η_u Δ⁻, Eq. 7–8, n counting every participant, Eq. 4), then runs recovery:
FedAvg rounds on the retained data (subset ``retained``) until the test accuracy reaches
``target_test_acc`` or ``max_recovery_rounds`` have run.

The strength is the chosen one, as in the paper: the calibration ladder of the in-process method
(``max_doublings``) is not offered here (``OverFlower.pinned``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.data.store import PARTITIONS_DIR
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.fedavg import ClientUpdate
from fedunlearn.federation.local import State, Tensors, accuracy
from fedunlearn.unlearning.puf import PUFRegular as InProcessPUFRegular
from fedunlearn.unlearning.puf import PUFSpecial as InProcessPUFSpecial
from fedunlearn.unlearning.puf import puf_aggregate
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.partition import CPU
from fedunlearn_flower.wrapping import OverFlower


class _PUF(OverFlower):
    """What both modes share; subclasses say who else trains in the unlearning round. The settings
    are the in-process method's; its calibration ladder (``max_doublings``) is not offered here."""

    pinned = {"max_doublings": 0}

    def step(self, federation: Federation, state: State, forget_set: ForgetSet, training: FedAvg) -> State:
        """The unlearning round alone (Eq. 7–9): the model before recovery."""
        round_idx = training.rounds  # the round after training: fresh shuffling seeds, as in-process
        forget = forget_lists(forget_set)
        targets = federation.train(state, round_idx, sorted(forget), subset="forget", forget_ids=forget,
                                   **training.client_hyperparameters(self.method.unlearn_epochs))
        remaining = self._remaining(federation, state, forget_set, training, round_idx)
        return puf_aggregate(state, remaining, targets, eta_u=self.method.eta_u, eta_r=self._eta_r())

    def run(self, federation: Federation, state: State, forget_set: ForgetSet,
            training: FedAvg) -> tuple[State, dict]:
        """The unlearning round, then recovery; the unlearned model and what was run."""
        state = self.step(federation, state, forget_set, training)
        forget = forget_lists(forget_set)
        retained = {c: n - len(forget.get(c, [])) for c, n in federation.sizes.items()}
        rounds, test = 0, None
        if self.method.target_test_acc is not None:
            test = held_out(federation)
        while not self._reached(federation, state, test) and rounds < self.method.max_recovery_rounds:
            state = training.run(federation, state, first_round=training.rounds + 1 + rounds, rounds=1,
                                 sizes=retained, forget_ids=forget)
            rounds += 1
        return state, {"target_clients": sorted(forget), "recovery_rounds": rounds, "eta_u": self.method.eta_u,
                       "unlearn_epochs": self.method.unlearn_epochs}

    def _remaining(self, federation: Federation, state: State, forget_set: ForgetSet, training: FedAvg,
                   round_idx: int) -> list[ClientUpdate]:
        return []

    def _eta_r(self) -> float:
        return 1.0  # no other client trains in PUF-Special's unlearning round

    def _reached(self, federation: Federation, state: State, test: Tensors | None) -> bool:
        if test is None:
            return False
        return accuracy(federation.scenario.model_from(state), test) >= self.method.target_test_acc


class PUFSpecial(_PUF):
    """PUF-Special: a dedicated round in which only the target clients train (Eq. 9). Settings:
    ``fedunlearn.unlearning.puf.PUFSpecial``'s (η_u, E_u, the recovery's budget and target)."""

    in_process = InProcessPUFSpecial


class PUFRegular(_PUF):
    """PUF-Regular: a normal FedAvg round with the targets' aggregated update negated (Eq. 7–8).
    Settings: ``fedunlearn.unlearning.puf.PUFRegular``'s (η_u, η_r, E_u, the recovery's budget and target)."""

    in_process = InProcessPUFRegular

    def _eta_r(self) -> float:
        return self.method.eta_r

    def _remaining(self, federation: Federation, state: State, forget_set: ForgetSet, training: FedAvg,
                   round_idx: int) -> list[ClientUpdate]:
        """A FedAvg sample (``client_fraction``) of the clients without forget data, on all their data."""
        sizes = {c: 0 if c in forget_set.forget_ids else n for c, n in federation.sizes.items()}
        updates: list[ClientUpdate] = []
        training.run(federation, state, first_round=round_idx, rounds=1, sizes=sizes,
                     on_round=lambda result: updates.extend(result.updates))
        return updates


def forget_lists(forget_set: ForgetSet) -> dict[int, list[str]]:
    """The batch's forget IDs per client, as a message's configuration carries them."""
    return {int(c): [str(i) for i in ids.tolist()] for c, ids in forget_set.forget_ids.items()}


def held_out(federation: Federation) -> Tensors:
    """The held-out split the server evaluates on (the in-process methods' ``test``)."""
    directory = Path(federation.root) / PARTITIONS_DIR / federation.scenario.name / "test"
    arrays = [np.load(directory / f"{name}.npy", allow_pickle=False) for name in ("features", "labels", "sample_ids")]
    return Tensors.from_arrays(*arrays, CPU)
