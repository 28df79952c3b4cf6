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
(``max_doublings``) is not offered here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.data.store import PARTITIONS_DIR
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.fedavg import ClientUpdate
from fedunlearn.federation.local import State, Tensors, accuracy
from fedunlearn.unlearning.puf import puf_aggregate
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.partition import CPU


class _PUF:
    """What both modes share; subclasses say who else trains in the unlearning round."""

    eta_r = 1.0

    def __init__(self, *, eta_u: float, unlearn_epochs: int = 1, max_recovery_rounds: int = 10,
                 target_test_acc: float | None = None):
        self.eta_u = eta_u
        self.unlearn_epochs = unlearn_epochs
        self.max_recovery_rounds = max_recovery_rounds
        self.target_test_acc = target_test_acc

    def step(self, federation: Federation, state: State, forget_set: ForgetSet, training: FedAvg) -> State:
        """The unlearning round alone (Eq. 7–9): the model before recovery."""
        round_idx = training.rounds  # the round after training: fresh shuffling seeds, as in-process
        forget = forget_lists(forget_set)
        targets = federation.train(state, round_idx, sorted(forget), subset="forget", forget_ids=forget,
                                   **training.client_hyperparameters(self.unlearn_epochs))
        remaining = self._remaining(federation, state, forget_set, training, round_idx)
        return puf_aggregate(state, remaining, targets, eta_u=self.eta_u, eta_r=self.eta_r)

    def run(self, federation: Federation, state: State, forget_set: ForgetSet,
            training: FedAvg) -> tuple[State, dict]:
        """The unlearning round, then recovery; the unlearned model and what was run."""
        state = self.step(federation, state, forget_set, training)
        forget = forget_lists(forget_set)
        retained = {c: n - len(forget.get(c, [])) for c, n in federation.sizes.items()}
        rounds, test = 0, None
        if self.target_test_acc is not None:
            test = held_out(federation)
        while not self._reached(federation, state, test) and rounds < self.max_recovery_rounds:
            state = training.run(federation, state, first_round=training.rounds + 1 + rounds, rounds=1,
                                 sizes=retained, forget_ids=forget)
            rounds += 1
        return state, {"target_clients": sorted(forget), "recovery_rounds": rounds, "eta_u": self.eta_u,
                       "unlearn_epochs": self.unlearn_epochs}

    def _remaining(self, federation: Federation, state: State, forget_set: ForgetSet, training: FedAvg,
                   round_idx: int) -> list[ClientUpdate]:
        return []

    def _reached(self, federation: Federation, state: State, test: Tensors | None) -> bool:
        if test is None:
            return False
        return accuracy(federation.scenario.model_from(state), test) >= self.target_test_acc


class PUFSpecial(_PUF):
    """PUF-Special: a dedicated round in which only the target clients train (Eq. 9).

    Parameters
    ----------
    eta_u : float (default: 2.0)
        η_u, scale of the negated target update (the paper's value).
    unlearn_epochs : int (default: 1)
        E_u, local epochs of the target clients in the unlearning round.
    max_recovery_rounds : int (default: 10)
        Round budget of the recovery phase.
    target_test_acc : float | None (default: None)
        Recovery stops once the test accuracy reaches it (None: always ``max_recovery_rounds``).
    """

    def __init__(self, *, eta_u: float = 2.0, unlearn_epochs: int = 1, max_recovery_rounds: int = 10,
                 target_test_acc: float | None = None):
        super().__init__(eta_u=eta_u, unlearn_epochs=unlearn_epochs, max_recovery_rounds=max_recovery_rounds,
                         target_test_acc=target_test_acc)


class PUFRegular(_PUF):
    """PUF-Regular: a normal FedAvg round with the targets' aggregated update negated (Eq. 7–8).

    Parameters
    ----------
    eta_u : float (default: 20.0)
        η_u, scale of the negated target update (the paper's value).
    eta_r : float (default: 1.0)
        η_r, scale of the remaining clients' update.
    unlearn_epochs : int (default: 1)
        E_u, local epochs of the target clients in the unlearning round.
    max_recovery_rounds : int (default: 10)
        Round budget of the recovery phase.
    target_test_acc : float | None (default: None)
        Recovery stops once the test accuracy reaches it (None: always ``max_recovery_rounds``).
    """

    def __init__(self, *, eta_u: float = 20.0, eta_r: float = 1.0, unlearn_epochs: int = 1,
                 max_recovery_rounds: int = 10, target_test_acc: float | None = None):
        super().__init__(eta_u=eta_u, unlearn_epochs=unlearn_epochs, max_recovery_rounds=max_recovery_rounds,
                         target_test_acc=target_test_acc)
        self.eta_r = eta_r

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
