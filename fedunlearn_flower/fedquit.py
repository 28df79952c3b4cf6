"""FedQUIT — federated unlearning by distillation from a quasi-competent virtual teacher, over Flower.

Paper: Mora, Valerio, Bellavista and Passarella (2024), "FedQUIT: On-Device Federated Unlearning via
a Quasi-Competent Virtual Teacher", arXiv:2408.07587. The in-process method is
``fedunlearn.unlearning.fedquit`` (its docstring and docs/methods.md, "fedquit", give the departures
from the paper: the squared logit distance, clipping, recovery rounds); this is the same protocol
with its rounds as Flower messages, and the same client code (``FedQUIT.local_update``).

Each of the ``rounds`` unlearning rounds is a ``train.fedquit`` message to the clients FedAvg samples
on the retained data, plus every client holding a quitting target: each trains from the global
model on its retained data and, on its quitting targets, towards the virtual teacher — the model
at the request with each target's labelled logit lowered, computed by the client from the
``teacher`` model the message carries (the targets' logits never leave it). The server averages the
updates by sample count (FedAvg), then runs ``recovery_rounds`` FedAvg rounds on the retained data.

The quitting targets are the forget samples the batch's ``remembered`` names (all of them where
nothing was measured): ``quitting_targets``' rule, applied by the server to the IDs, as it holds no
sample. A forget sample outside them is left out of the client's training altogether, as a retrain
leaves it.
"""

from __future__ import annotations

import json

from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.fedavg import aggregate
from fedunlearn.federation.local import State
from fedunlearn.unlearning.fedquit import EDIT_SETTINGS
from fedunlearn.unlearning.fedquit import FedQUIT as InProcessFedQUIT
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.puf import forget_lists
from fedunlearn_flower.records import TEACHER
from fedunlearn_flower.wrapping import OverFlower


class FedQUIT(OverFlower):
    """FedQUIT strategy on a ``Federation``: sample and client requests. Its settings are
    ``fedunlearn.unlearning.fedquit.FedQUIT``'s, with the paper's FedAvg rounds (``solver="steps"``)
    pinned: the closed-form edit and its own settings (``EDIT_SETTINGS``) run in-process only.
    Refused here too: ``recovery_tolerance``, and ``local_steps`` with recovery rounds (recovery is
    the training's unchecked FedAvg rounds: the server holds no test rows)."""

    in_process = InProcessFedQUIT
    pinned = {"solver": "steps", **{name: InProcessFedQUIT.defaults()[name] for name in EDIT_SETTINGS}}

    def __init__(self, **params):
        super().__init__(**params)
        if self.method.recovery_tolerance is not None or (self.method.local_steps is not None
                                                          and self.method.recovery_for("steps") > 0):
            raise ValueError("fedquit over Flower: recovery_tolerance, and local_steps with recovery rounds, run "
                             "in-process only (use the in-process runtime, or recovery_rounds=0)")

    def run(self, federation: Federation, state: State, forget_set: ForgetSet,
            training: FedAvg) -> tuple[State, dict]:
        """The unlearning rounds, then recovery; the unlearned model and what was run."""
        source, forget, quitting = state, forget_lists(forget_set), quitting_lists(forget_set)
        retained = {c: n - len(forget.get(c, [])) for c, n in federation.sizes.items()}
        first = training.rounds  # the rounds after training: fresh shuffling seeds, as in-process
        config = {**_message_config(training), "method-params": json.dumps(self.method.get_params())}
        participants: list[int] = []
        for r in range(self.method.rounds):
            clients = self.participants(federation, training, retained, quitting, first + r)
            jobs = {c: {**config, "round": first + r, "forget-ids": forget.get(c, []), "quit-ids": quitting.get(c, [])}
                    for c in clients}
            replies = federation.updates("train.fedquit", state, jobs, f"fedquit-{r + 1}",
                                         states={c: {TEACHER: source} for c in clients if c in quitting})
            state = aggregate(state, [update for update, _ in replies.values()])
            participants.append(len(replies))
        state = training.run(federation, state, first_round=first + self.method.rounds,
                             rounds=self.method.recovery_for("steps"), sizes=retained, forget_ids=forget)
        return state, {"target_clients": sorted(quitting), "participants_per_round": participants,
                       "quitting_samples": sum(len(ids) for ids in quitting.values()),
                       "recovery_rounds": self.method.recovery_for("steps"),
                       "distance": "squared logits" if self.method.temperature is None else "T²·KL"}

    @staticmethod
    def _participants(federation: Federation, training: FedAvg, retained: dict[int, int],
                      quitting: dict[int, list[str]], round_idx: int) -> list[int]:
        """FedAvg's sample on the retained data, and every client holding a quitting target (its
        distillation cannot be skipped); a client with nothing left to step through sits out."""
        sampled = training.select(federation, round_idx, retained)
        return [c for c in sorted(set(sampled) | set(quitting)) if retained.get(c, 0) or c in quitting]

    def participants(self, federation: Federation, training: FedAvg, retained: dict[int, int],
                     quitting: dict[int, list[str]], round_idx: int) -> list[int]:
        """``_participants``, or with ``participants="holders"`` the clients holding a quitting target alone."""
        if self.method.participants == "holders" and quitting:
            return sorted(quitting)
        return self._participants(federation, training, retained, quitting, round_idx)


def quitting_lists(forget_set: ForgetSet) -> dict[int, list[str]]:
    """Per client, the forget IDs the quitting term applies to: ``quitting_targets``' rule
    (``ForgetSet.is_remembered``) on the IDs; clients left none are left out."""
    chosen = {c: ids[forget_set.is_remembered(ids)] for c, ids in forget_set.forget_ids.items()}
    return {c: [str(i) for i in ids.tolist()] for c, ids in chosen.items() if len(ids)}


def _message_config(training: FedAvg) -> dict:
    """The training's local hyperparameters as a message's configuration (``FedQUIT.lr`` overrides ``lr``)."""
    hyper = training.client_hyperparameters()
    return {"local-epochs": hyper["local_epochs"], "lr": hyper["lr"], "batch-size": hyper["batch_size"],
            "momentum": hyper["momentum"]}
