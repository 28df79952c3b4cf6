"""PUF: federated unlearning via negated pseudo-gradients [1]_.

FedAvg read as server SGD on pseudo-gradients [2]_: a client's update w_i − w points down its loss,
so the server negates the target clients' aggregated update, scaled by η_u, to push the global
model away from what their data taught it. In the unlearning round, with S⁺ the remaining
participants and S⁻ the target clients,

    n  = Σ_{i∈S⁺} |D_i| + Σ_{j∈S⁻} |D_j|                       (Eq. 4: all participants)
    Δ⁺ = (1/n) Σ_{i∈S⁺} |D_i| (w_i − w),  Δ⁻ = (1/n) Σ_{j∈S⁻} |D_j| (w_j − w)   (Eq. 5–6)

PUF-Regular (``puf-regular``) is a normal round in which the targets and a FedAvg sample of the
remaining clients train, w ← w + η_r Δ⁺ − η_u Δ⁻ (Eq. 7–8); PUF-Special (``puf-special``) a round in
which only the targets train, w ← w − η_u Δ⁻ (Eq. 9). For sample and class requests a target client
computes its update on its forget subset only and joins recovery with its retained data (§IV).
Recovery is FedAvg on the retained data until the test accuracy reaches ``target_test_acc`` — the
paper stops when the unlearned model first surpasses the retrained model's (§V) — or
``max_recovery_rounds`` have run; the check is part of the protocol, so its time counts.

Why: one negated server step and a few recovery rounds cost far less than retraining; it is the
HFL default. The loss a request needs removed differs per batch, and a sample the model has
memorised has a near-zero gradient, so no fixed step suits every batch: ``max_doublings`` (off by
default; not in the paper) sizes the step per batch against calibration rows — docs/methods.md,
"Strength", says how, and why it is off. Cost formulas: docs/methods.md, "Cost accounting".

References
----------
.. [1] "Federated Unlearning via Negated Pseudo-Gradients" (puf-negated-pseudo-gradients.txt):
   §IV, Eq. 4–9, Algorithm 1; §V-A and Appendix A (hyperparameters); Appendix B (cost).
.. [2] Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar and McMahan (2021), "Adaptive
   Federated Optimization", ICLR: FedAvg as server optimisation on pseudo-gradients.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import numpy as np
import torch

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.federation.cost import Cost, communication_bytes, training_flops
from fedunlearn.federation.fedavg import ClientUpdate, FedAvg
from fedunlearn.federation.local import State, accuracy
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod,
                                        calibrated_forget, calibration_reached, climb_ladder, fedavg_rounds,
                                        num_params)
from fedunlearn.unlearning.registry import register


def pseudo_gradient(global_state: State, updates: list[ClientUpdate], n: int) -> State:
    """Eq. 5–6: (1/n) Σ_i |D_i| (w_i − w) over ``updates``, for the floating-point entries; ``n``
    counts every participant of the round, not only these ``updates``."""
    return {key: sum((u.num_samples / n) * (u.state[key] - w) for u in updates) if updates else torch.zeros_like(w)
            for key, w in global_state.items() if torch.is_floating_point(w)}


def puf_aggregate(global_state: State, remaining: list[ClientUpdate], targets: list[ClientUpdate], *,
                  eta_u: float, eta_r: float = 1.0) -> State:
    """Eq. 7–8: w + η_r Δ⁺ − η_u Δ⁻, n summed over remaining and target participants (Eq. 4).
    With no remaining updates it is Eq. 9, w − η_u Δ⁻. Integer buffers keep the global values."""
    n = sum(u.num_samples for u in remaining) + sum(u.num_samples for u in targets)
    plus = pseudo_gradient(global_state, remaining, n)
    minus = pseudo_gradient(global_state, targets, n)
    return {key: w + eta_r * plus[key] - eta_u * minus[key] if key in plus else w.clone()
            for key, w in global_state.items()}


class _NumberedFrom:
    """``monitor`` numbering rounds on from ``offset``: recovery calls ``fedavg_rounds`` one round
    at a time (to stop at the target accuracy), and each call numbers its rounds from 1."""

    def __init__(self, monitor: Monitor, offset: int):
        self.monitor = monitor
        self.offset = offset

    def record(self, phase: str, round_idx: int, state: State, **metrics: float) -> None:
        self.monitor.record(phase, self.offset + round_idx, state, **metrics)


class _PUF(UnlearningMethod):
    """What both modes share: the targets' round, the server step, recovery, costs. Subclasses
    say who else trains in the unlearning round and how the server combines the updates."""

    settings = frozenset({"hfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = EMPIRICAL_ONLY

    def _check_common(self) -> None:
        self._require(self.eta_u > 0, "eta_u", "> 0")
        self._require(isinstance(self.unlearn_epochs, int) and self.unlearn_epochs >= 1, "unlearn_epochs",
                      "an integer >= 1")
        self._require(isinstance(self.max_recovery_rounds, int) and self.max_recovery_rounds >= 0,
                      "max_recovery_rounds", "an integer >= 0")
        self._require(self.target_test_acc is None or 0 <= self.target_test_acc <= 1, "target_test_acc",
                      "in [0, 1] or None")
        self._require(isinstance(self.max_doublings, int) and self.max_doublings >= 0, "max_doublings",
                      "an integer >= 0")

    def _remaining_updates(self, fed_state: FederatedState, forget_set: ForgetSet, round_idx: int) -> list[ClientUpdate]:
        """S⁺: the remaining clients' updates in the unlearning round (PUF-Special: none)."""
        return []

    def _server_step(self, state: State, remaining: list[ClientUpdate], targets: list[ClientUpdate],
                     eta_u: float) -> State:
        return puf_aggregate(state, remaining, targets, eta_u=eta_u)

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        round_idx = fed_state.train_config.rounds  # the round after training: fresh shuffling seeds
        start, watched = time.perf_counter(), monitor.seconds
        step = self._unlearning_step(fed_state, forget_set, round_idx)
        unlearn_cost = dataclasses.replace(step.cost, wall_seconds=_seconds_since(start, watched, monitor))
        monitor.record("unlearn", 1, step.state)

        start, watched = time.perf_counter(), monitor.seconds
        if step.declined:
            state, recovery_cost, rounds, reached = step.state, Cost(), 0, None
        else:
            state, recovery_cost, rounds, reached = self._recover(fed_state, forget_set, step.state, round_idx + 1, monitor,
                                                                  step.ladder)
        recovery_cost = dataclasses.replace(recovery_cost, wall_seconds=_seconds_since(start, watched, monitor))

        targets, remaining = step.targets, step.remaining
        numbers = {**self.get_params(), "normalising_samples": sum(u.num_samples for u in remaining + targets),
                   "target_samples": sum(u.num_samples for u in targets), "remaining_participants": len(remaining),
                   "recovery_rounds": rounds, "target_reached": reached, "eta_u_used": step.eta_u,
                   "unlearn_epochs_used": step.epochs}
        notes = {"target_clients": [u.client for u in targets], "recovery_rounds": rounds, "strength": step.ladder,
                 "phases": {"unlearn": dataclasses.asdict(unlearn_cost),
                            "recovery": dataclasses.asdict(recovery_cost)}}
        return Outcome(state, unlearn_cost + recovery_cost, certificate_inputs=numbers, notes=notes)

    def _rungs(self, fed_state: FederatedState) -> list[tuple[int, float]]:
        """(E_u, η_u) cheapest first: the chosen pair alone without calibration rows."""
        doublings = self.max_doublings if fed_state.calibration is not None else 0
        return [(self.unlearn_epochs * 2 ** j, self.eta_u * 2 ** i) for j in range(doublings + 1)
                for i in range(doublings + 1)]

    def _unlearning_step(self, fed_state: FederatedState, forget_set: ForgetSet, round_idx: int) -> "_Step":
        """The unlearning round at the first rung that reaches the calibration level (the chosen
        strength without calibration rows); ``declined`` when none does. Its cost is every rung's."""
        climb = climb_ladder(fed_state, calibrated_forget(fed_state, forget_set, self.max_doublings),
                             self._rounds(fed_state, forget_set, round_idx), state_of=lambda step: step.state,
                             describe=lambda step: {"unlearn_epochs": step.epochs, "eta_u": step.eta_u})
        cost = sum((step.cost for step in climb.climbed), Cost())
        return dataclasses.replace(climb.chosen, cost=cost, ladder=climb.ladder, declined=climb.reached is False)

    def _rounds(self, fed_state: FederatedState, forget_set: ForgetSet, round_idx: int) -> Iterator["_Step"]:
        """The unlearning round at each rung, cheapest first, each with what it adds to the cost: the
        targets' updates are recomputed (and paid for) only when E_u changes, the remaining clients'
        computed once; a larger η_u is the server step alone."""
        remaining: list[ClientUpdate] | None = None
        computed_for = None
        for epochs, eta_u in self._rungs(fed_state):
            cost = Cost()
            if epochs != computed_for:
                targets, computed_for = self._target_updates(fed_state, forget_set, round_idx, epochs), epochs
                first = remaining is None
                if first:
                    remaining = self._remaining_updates(fed_state, forget_set, round_idx)
                cost = self._round_cost(fed_state, remaining if first else [], targets, epochs, 0.0)
            unlearned = self._server_step(fed_state.state, remaining, targets, eta_u)
            yield _Step(unlearned, targets, remaining, cost, epochs, eta_u, [], declined=False)

    def _target_updates(self, fed_state: FederatedState, forget_set: ForgetSet, round_idx: int,
                        epochs: int) -> list[ClientUpdate]:
        """S⁻: each target client trains ``epochs`` (E_u) epochs from the global model on its forget data only."""
        config = fed_state.train_config.model_copy(update={"local_epochs": epochs})
        engine = FedAvg(fed_state.model_fn, config, fed_state.seed, fed_state.device)
        jobs = [{"global_state": fed_state.state, "data": data, "client": c, "round_idx": round_idx}
                for c, data in fed_state.forget_by_client(forget_set).items()]
        return fed_state.map_updates(engine.local_update, jobs)

    def _round_cost(self, fed_state: FederatedState, remaining: list[ClientUpdate], targets: list[ClientUpdate],
                    epochs: int, seconds: float) -> Cost:
        per_sample = fed_state.flops_per_sample()
        flops = (training_flops(per_sample, sum(u.num_samples for u in remaining), fed_state.train_config.local_epochs)
                 + training_flops(per_sample, sum(u.num_samples for u in targets), epochs))
        comm = communication_bytes(num_params(fed_state.state), len(remaining) + len(targets))
        return Cost(seconds, flops, comm)

    def _recover(self, fed_state: FederatedState, forget_set: ForgetSet, state: State, first_round: int,
                 monitor: Monitor, ladder: list[dict] | None = None) -> tuple[State, Cost, int, bool | None]:
        """FedAvg on the retained data, one round at a time, until the target accuracy or the budget.
        With a calibration ``ladder``, recovery also stops once the forget set's loss falls back
        below the calibration rows' (what the step removed is coming back: a memorised sample the
        negated update did not reach), and the ladder records it (``fell_back``).
        Returns the state, the cost, the rounds run and whether the target was reached (None: no target)."""
        retained = fed_state.retained_clients(forget_set)
        forget = fed_state.forget_data(forget_set) if ladder else None
        cost, rounds = Cost(), 0
        reached = self._reached(fed_state, state)
        while not reached and rounds < self.max_recovery_rounds:
            state, round_cost = fedavg_rounds(fed_state, retained, state=state, rounds=1,
                                              first_round=first_round + rounds, phase="recovery",
                                              monitor=_NumberedFrom(monitor, rounds))
            cost, rounds = cost + round_cost, rounds + 1
            reached = self._reached(fed_state, state)
            if forget is not None and not calibration_reached(fed_state, state, forget).reached:
                ladder.append({"fell_back": True, "recovery_round": rounds})
                break
        return state, cost, rounds, reached if self.target_test_acc is not None else None

    def _reached(self, fed_state: FederatedState, state: State) -> bool:
        return self.target_test_acc is not None and \
            accuracy(fed_state.model_from(state), fed_state.test) >= self.target_test_acc


@dataclasses.dataclass
class _Step:
    """The unlearning round at one strength: its state, updates, cost (as a rung, what it added;
    as the round run, every rung computed), the strength used and the ladder climbed (empty without
    calibration rows)."""

    state: State
    targets: list[ClientUpdate]
    remaining: list[ClientUpdate]
    cost: Cost
    epochs: int
    eta_u: float
    ladder: list[dict]
    declined: bool


def _seconds_since(start: float, watched: float, monitor: Monitor) -> float:
    """Wall time since ``start`` without the monitor's own time (watching is not the method's cost)."""
    return time.perf_counter() - start - (monitor.seconds - watched)


@register
class PUFSpecial(_PUF):
    """PUF-Special: a dedicated round in which only the target clients train (Eq. 9).

    The paper's value follows each default (§V-A, Appendix A).

    Parameters
    ----------
    eta_u : float, default=2.0
        η_u, the scale of the negated target update (paper: 2.0).
    unlearn_epochs : int, default=1
        E_u, local epochs of the target clients in the unlearning round (the paper's default, Fig. 5:
        a larger E_u forgets more but needs more recovery). The remaining clients train with the
        training's own ``local_epochs``.
    max_recovery_rounds : int, default=10
        round budget of the recovery phase (the paper runs until the target accuracy is reached, with
        no stated budget).
    target_test_acc : float or None, default=None
        recovery stops once the global model's test accuracy is at least this (None: always run
        ``max_recovery_rounds``; the paper: the retrained model's).
    max_doublings : int, default=0
        with calibration rows (``FederatedState.calibration``), how many times E_u and, within each
        E_u, η_u may double (0: the chosen strength, as in the paper). Not in the paper.
    """

    name = "puf-special"
    roles = {"hfl": "default"}
    stronger_scales = ("eta_u", "unlearn_epochs")

    def __init__(self, *, eta_u: float = 2.0, unlearn_epochs: int = 1, max_recovery_rounds: int = 10,
                 target_test_acc: float | None = None, max_doublings: int = 0):
        self.eta_u = eta_u
        self.unlearn_epochs = unlearn_epochs
        self.max_recovery_rounds = max_recovery_rounds
        self.target_test_acc = target_test_acc
        self.max_doublings = max_doublings
        self._check_common()


@register
class PUFRegular(_PUF):
    """PUF-Regular: a normal FedAvg round with the targets' aggregated update negated (Eq. 7–8).

    The paper's value follows each default (§V-A, Appendix A).

    Parameters
    ----------
    eta_u : float, default=20.0
        η_u, the scale of the negated target update (paper: 20.0).
    eta_r : float, default=1.0
        η_r, the scale of the remaining clients' update (paper: 1.0).
    unlearn_epochs : int, default=1
        E_u, local epochs of the target clients in the unlearning round (the paper's default, Fig. 5:
        a larger E_u forgets more but needs more recovery). The remaining clients train with the
        training's own ``local_epochs``.
    max_recovery_rounds : int, default=10
        round budget of the recovery phase (the paper runs until the target accuracy is reached, with
        no stated budget).
    target_test_acc : float or None, default=None
        recovery stops once the global model's test accuracy is at least this (None: always run
        ``max_recovery_rounds``; the paper: the retrained model's).
    max_doublings : int, default=0
        with calibration rows (``FederatedState.calibration``), how many times E_u and, within each
        E_u, η_u may double (0: the chosen strength, as in the paper). Not in the paper.
    """

    name = "puf-regular"
    roles = {"hfl": "fallback"}
    stronger_scales = ("eta_u", "unlearn_epochs")

    def __init__(self, *, eta_u: float = 20.0, eta_r: float = 1.0, unlearn_epochs: int = 1,
                 max_recovery_rounds: int = 10, target_test_acc: float | None = None, max_doublings: int = 0):
        self.eta_u = eta_u
        self.eta_r = eta_r
        self.unlearn_epochs = unlearn_epochs
        self.max_recovery_rounds = max_recovery_rounds
        self.target_test_acc = target_test_acc
        self.max_doublings = max_doublings
        self._check_common()
        self._require(eta_r > 0, "eta_r", "> 0")

    def _remaining_updates(self, fed_state: FederatedState, forget_set: ForgetSet, round_idx: int) -> list[ClientUpdate]:
        """A FedAvg sample (``client_fraction``) of the clients without forget data, on all their data."""
        engine = fed_state.engine()
        others = [c.select(np.zeros(len(c), dtype=bool)) if i in forget_set.forget_ids else c
                  for i, c in enumerate(fed_state.clients)]
        jobs = [{"global_state": fed_state.state, "data": others[c], "client": c, "round_idx": round_idx}
                for c in engine.select_clients(round_idx, others)]
        return fed_state.map_updates(engine.local_update, jobs)

    def _server_step(self, state: State, remaining: list[ClientUpdate], targets: list[ClientUpdate],
                     eta_u: float) -> State:
        return puf_aggregate(state, remaining, targets, eta_u=eta_u, eta_r=self.eta_r)
