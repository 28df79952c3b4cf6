"""Retrain from scratch by D-PSGD on the retained data — the gold standard of decentralized
unlearning (certified-decentralized-unlearning.txt §VI-A: "RT, which means retraining from
scratch with the retained data or clients by D-PSGD"; "we also set the number of retraining
rounds to be equal to K", the original training's) — and what every DFL method shares:

* ``DecentralizedState``: the ``FederatedState`` of a DFL federation. ``state`` is the reported
  global model, the average of the local models; ``node_states`` the local models themselves
  (None: every node holds ``state``); ``topology`` the graph over the clients; ``statistics``
  the auxiliary statistics certified unlearning stores after training (the paper's T_i(S_i),
  Step 4); ``budget`` the residual budget of earlier certified batches (JSON).
* ``DecentralizedOutcome``: an ``Outcome`` that also carries the local models, the statistics
  and the residual budget to the next batch (``DecentralizedState.advanced``).
* ``dpsgd_rounds``: D-PSGD rounds with the training's engine, recorded and costed.
* ``unlearn_sequence``: several batches one after another (the paper's Figure 1 uses three),
  tracking after each the certificate budget and the drift from a D-PSGD retrain.

``DecentralizedRetrain`` (registered as ``retrain`` for the ``dfl`` setting): D-PSGD with exactly
the original configuration — seed, ``model_fn``, ``TrainConfig``, rounds — on every client's
data minus its forget IDs. A removed client, or one whose data are all deleted, leaves the
graph; the others must stay connected (a clear error otherwise). No hyperparameters. Its
certificate class is ``exact retrain``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedunlearn.certify.certificate import EXACT_RETRAIN
from fedunlearn.config import TrainConfig
from fedunlearn.data.store import HorizontalPartition
from fedunlearn.federation.cost import Cost, training_flops
from fedunlearn.evaluation.metrics import functional_distance
from fedunlearn.federation.dpsgd import DPSGD, DPSGDRound, average_state
from fedunlearn.federation.local import State, Tensors, accuracy
from fedunlearn.federation.topology import Topology
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod)
from fedunlearn.unlearning.registry import register


@dataclass
class DecentralizedState(FederatedState):
    topology: Topology | None = None
    node_states: list[State | None] | None = None
    statistics: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.setting != "dfl":
            raise ValueError(f"a DecentralizedState is for the 'dfl' setting, got {self.setting!r}")
        if self.topology is None or len(self.topology) != len(self.clients):
            raise ValueError(f"a DFL federation needs a topology with one node per client ({len(self.clients)})")
        if self.node_states is not None and len(self.node_states) != len(self.clients):
            raise ValueError(f"{len(self.node_states)} node states for {len(self.clients)} clients")

    @classmethod
    def from_federation(cls, fed_state: FederatedState, topology: Topology,
                        node_states: list[State | None] | None = None) -> "DecentralizedState":
        """A DFL ``FederatedState`` with its graph; with ``node_states`` (``DPSGD.fit``'s result)
        the global model is their average."""
        fields = {f.name: getattr(fed_state, f.name) for f in dataclasses.fields(FederatedState)}
        if node_states is not None:
            fields["state"] = average_state(node_states)
        return cls(**fields, topology=topology, node_states=None if node_states is None else list(node_states))

    @classmethod
    def from_training(cls, partition: HorizontalPartition, *, model_fn: Callable[[], nn.Module],
                      node_states: list[State | None], topology: Topology, train_config: TrainConfig, seed: int,
                      device: torch.device) -> "DecentralizedState":
        """The federation after ``DPSGD.fit`` returned ``node_states``."""
        base = FederatedState.from_partition(partition, model_fn=model_fn, state={}, train_config=train_config,
                                             seed=seed, device=device, setting="dfl")
        return cls.from_federation(base, topology, node_states)

    def dpsgd(self) -> DPSGD:
        """The training's own D-PSGD engine: same model_fn, configuration, topology, seed and device."""
        return DPSGD(self.model_fn, self.train_config, self.topology, self.seed, self.device)

    def nodes(self) -> list[State | None]:
        """The local models; None for a node without data (it has left the graph)."""
        states = self.node_states or [self.state] * len(self.clients)
        return [s if len(c) else None for s, c in zip(states, self.clients)]

    def advanced(self, forget_set: ForgetSet, outcome: Outcome) -> "DecentralizedState":
        """The federation after ``outcome`` unlearned ``forget_set``: the retained data, the new models,
        and what the outcome carries forward (statistics, residual budget) for the next batch."""
        return dataclasses.replace(self, clients=self.retained_clients(forget_set), state=outcome.state,
                                   node_states=getattr(outcome, "node_states", None),
                                   statistics=getattr(outcome, "statistics", None) or {},
                                   budget=getattr(outcome, "budget", None))


@dataclass
class DecentralizedOutcome(Outcome):
    node_states: list[State | None] | None = None
    statistics: dict[str, Any] | None = None
    budget: dict[str, Any] | None = None


def as_decentralized(fed_state: FederatedState) -> DecentralizedState:
    if not isinstance(fed_state, DecentralizedState):
        raise TypeError(f"DFL methods need a DecentralizedState (with a topology), got {type(fed_state).__name__}")
    return fed_state


def dpsgd_rounds(fed_state: DecentralizedState, clients: Sequence[Tensors], *,
                 state: State | Sequence[State | None] | None, rounds: int, first_round: int, phase: str,
                 monitor: Monitor) -> tuple[list[State | None], Cost]:
    """``rounds`` D-PSGD rounds of the training's engine on ``clients``, each recorded by
    ``monitor`` (on the average model) and costed: 2|E|·P·4 bytes and F·B per node per
    iteration. ``state=None`` starts from the seeded initial model; ``first_round`` keeps later
    phases' mini-batch seeds apart from the original training's."""
    bytes_sent: list[int] = []
    samples: list[int] = []

    def after_round(result: DPSGDRound) -> None:
        bytes_sent.append(result.comm_bytes)
        samples.append(result.samples)
        monitor.record(phase, result.round - first_round + 1, result.state, train_loss=result.train_loss)

    nodes = fed_state.dpsgd().fit(clients, state=state, rounds=rounds, first_round=first_round, on_round=after_round,
                                  map_updates=fed_state.map_updates)
    flops = training_flops(fed_state.flops_per_sample(), sum(samples), epochs=1)
    return nodes, Cost(flops=flops, comm_bytes=sum(bytes_sent))


@register
class DecentralizedRetrain(UnlearningMethod):
    name = "retrain"
    settings = frozenset({"dfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = EXACT_RETRAIN

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        fed_state = as_decentralized(fed_state)
        retained = fed_state.retained_clients(forget_set)
        rounds = fed_state.train_config.rounds
        nodes, cost = dpsgd_rounds(fed_state, retained, state=None, rounds=rounds, first_round=0, phase="unlearn",
                                   monitor=monitor)
        active = sum(s is not None for s in nodes)
        return DecentralizedOutcome(average_state(nodes), cost,
                                    certificate_inputs={"rounds": rounds, "nodes": active,
                                                        "retained_samples": sum(len(c) for c in retained),
                                                        "forget_samples": forget_set.num_forget},
                                    notes={"rounds": rounds, "nodes": active}, node_states=nodes)


BatchSource = ForgetSet | Callable[[DecentralizedState], ForgetSet]


def unlearn_sequence(method: UnlearningMethod, fed_state: DecentralizedState, batches: Sequence[BatchSource], *,
                     compare_to_retrain: bool = True) -> tuple[list[dict[str, Any]], DecentralizedState]:
    """Apply ``batches`` one after another (a batch may be a function of the current federation,
    e.g. a fraction of what each client still holds). After each: test accuracy, cost, the
    certificate numbers (budget used and left — a sum since the last retrain — the releases it
    covers and the bound that triggered a retrain), and — with ``compare_to_retrain`` — the drift
    from a D-PSGD retrain on the data retained so far (its test accuracy and the functional
    distance on the test set). Returns the rows and the final federation."""
    rows = []
    for index, source in enumerate(batches, start=1):
        batch = source(fed_state) if callable(source) else source
        outcome = method.unlearn(fed_state, batch)
        fed_state = fed_state.advanced(batch, outcome)
        model = fed_state.model_from(outcome.state)
        row = {"batch": index, "batch_id": batch.batch_id, "kind": batch.kind, "forget_samples": batch.num_forget,
               "retained_samples": sum(len(c) for c in fed_state.clients),
               "test_acc": accuracy(model, fed_state.test), "wall_seconds": outcome.cost.wall_seconds,
               "action": outcome.notes.get("action"),
               **{k: outcome.certificate_inputs.get(k) for k in ("residual_bound", "budget_used", "budget_left",
                                                                 "releases_since_retrain", "triggering_bound")}}
        if compare_to_retrain:
            reference = fed_state.model_from(average_state(fed_state.dpsgd().fit(fed_state.clients)))
            row["retrain_test_acc"] = accuracy(reference, fed_state.test)
            row.update({f"drift_{k}": v for k, v in functional_distance(model, reference, fed_state.test).items()})
        rows.append(row)
    return rows, fed_state
