"""The one trainer: a scenario's federation loaded from a data version and trained from scratch,
for every setting, by the same code the benchmark, ``train-federated`` and ``retrain-reference``
call — so a figure in docs/BENCHMARKS.md describes what the pipeline runs.

    load_federation ─▶ train ─▶ TrainedModel (state, node states, cost)

* HFL: FedAvg (``federation.fedavg``); each round's client updates go through the federation's
  ``map_updates`` hook — inline here, one Prefect task run per client update in the flows.
* VFL: split-NN (``federation.vertical``); an epoch of every party's mini-batch steps is one unit
  of work through the same hook (a split-NN step needs every party's embedding, so the parties'
  updates within an epoch are sequential by construction).
* DFL: D-PSGD (``federation.dpsgd``); one round of every node's local steps and mixing is one
  unit (the nodes exchange models after every step).

The cost is PUF Appendix B's (FLOPs and bytes) and the wall time of training alone: the time a
caller spends in ``on_round`` (evaluating, logging) is left out — watching is not training.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from fedunlearn.config import Params
from fedunlearn.data.store import load_horizontal
from fedunlearn.federation.cost import Cost, communication_bytes, training_flops
from fedunlearn.federation.dpsgd import average_state
from fedunlearn.federation.local import State
from fedunlearn.federation.stacked_fedavg import StackedFedAvg, StackedRound
from fedunlearn.federation.protocol import Federation
from fedunlearn.federation.topology import build_topology
from fedunlearn.federation.vertical import VerticalState, load_vertical
from fedunlearn.sharded_federation import ShardedFederation
from fedunlearn.unlearning.base import FederatedState, fedavg_rounds, num_params
from fedunlearn.unlearning.certified_dfu import precompute_statistics
from fedunlearn.unlearning.dfl_retrain import DecentralizedState, dpsgd_rounds
from models import build_model
from models.ensemble import join_states


@dataclass
class TrainingRound:
    """What ``on_round`` sees after each round (HFL, DFL) or epoch (VFL), numbered from 1:
    the model (per-party states for VFL, the nodes' average for DFL) and its training loss."""

    round: int
    state: State
    train_loss: float
    shard: int | None = None  # a federation in shards trains them in turn: the shard whose model ``state`` is


@dataclass
class TrainedModel:
    """``state`` is what a federation's ``state`` holds: the global model (HFL), one state per party
    (VFL) or the nodes' average (DFL, whose local models are ``node_states``)."""

    state: State
    cost: Cost
    history: list[dict[str, Any]] = field(default_factory=list)
    node_states: list[State | None] | None = None
    shard_origins: dict[int, str] | None = None  # a federation in shards: "trained" or "reused", by shard


def load_federation(scenario: str, params: Params, root: Path, device: torch.device) -> Federation:
    """The scenario's federation on the data version in ``root``, with untrained (initial) weights."""
    cfg = params.scenario(scenario)
    if cfg.setting == "vfl":
        federation = load_vertical(scenario, root, device, config=cfg.train, seed=params.seed)
        return VerticalState.from_federation(federation, federation.initial_state())
    partition = load_horizontal(scenario, root)
    fed_state = FederatedState.from_partition(
        partition, model_fn=lambda: build_model(cfg.model, partition.input_shape, partition.num_classes, l2=cfg.l2),
        state={}, train_config=cfg.train, seed=params.seed, device=device, setting=cfg.setting)
    if cfg.setting == "dfl":
        return DecentralizedState.from_federation(fed_state, build_topology(cfg.topology, len(fed_state.clients),
                                                                              params.seed))
    return ShardedFederation.of(fed_state, cfg.shards, cfg.shards_vectorised) if cfg.shards > 1 else fed_state


class _Watcher:
    """Forwards each round to ``on_round`` and keeps the seconds it took, to leave out of the cost."""

    def __init__(self, on_round: Callable[[TrainingRound], None] | None):
        self.on_round, self.seconds = on_round, 0.0

    def __call__(self, number: int, state: State, loss: float, shard: int | None = None) -> None:
        if self.on_round is not None:
            start = time.perf_counter()
            self.on_round(TrainingRound(number, state, loss, shard))
            self.seconds += time.perf_counter() - start

    def record(self, phase: str, round_idx: int, state: State, train_loss: float = float("nan")) -> None:
        """The ``Monitor`` interface the setting's round loops call."""
        self(round_idx, state, train_loss)


def train(federation: Federation, *, on_round: Callable[[TrainingRound], None] | None = None,
          reuse: Mapping[int, State] | None = None, on_shard: Callable[[int, State], None] | None = None
          ) -> TrainedModel:
    """Train ``federation``'s model from the seeded initial weights on all its clients' data for the
    configured rounds. A federation in shards trains them in turn, except the shards in ``reuse``
    (models trained from scratch on the same shard digest, kept as they are); ``on_shard`` sees
    each shard model once trained."""
    watcher = _Watcher(on_round)
    start = time.perf_counter()
    node_states = origins = None
    if isinstance(federation, ShardedFederation):
        state, cost, origins = train_shards(federation, watcher, reuse or {}, on_shard)
    elif isinstance(federation, VerticalState):
        engine = federation.engine()
        before = engine.meter()
        result = engine.fit(on_epoch=watcher, map_updates=federation.map_updates)
        state, cost = result.state, federation.cost_since(before)
    elif isinstance(federation, DecentralizedState):
        node_states, cost = dpsgd_rounds(federation, federation.clients, state=None,
                                         rounds=federation.train_config.rounds, first_round=0, phase="train",
                                         monitor=watcher)
        state = average_state(node_states)
    else:
        state, cost = fedavg_rounds(federation, federation.clients, state=None, rounds=federation.train_config.rounds,
                                    first_round=0, phase="train", monitor=watcher)
    wall = time.perf_counter() - start - watcher.seconds
    return TrainedModel(state, dataclasses.replace(cost, wall_seconds=wall), node_states=node_states,
                        shard_origins=origins)


class _ShardRounds:
    """The ``Monitor`` of one shard's training: each round shown as that shard's own model. Showing
    the ensemble so far would evaluate up to K models a round, K times over (one shard after another)."""

    def __init__(self, watcher: _Watcher, shard: int):
        self.watcher, self.shard = watcher, shard

    def record(self, phase: str, round_idx: int, state: State, train_loss: float = float("nan")) -> None:
        if self.watcher.on_round is not None:
            self.watcher(round_idx, state, train_loss, self.shard)


def train_shards(federation: ShardedFederation, watcher: _Watcher, reuse: Mapping[int, State],
                 on_shard: Callable[[int, State], None] | None) -> tuple[State, Cost, dict[int, str]]:
    """Each shard not in ``reuse`` trained from scratch by FedAvg on its own clients, in turn; the
    ensemble state (a shard without data left out), the cost and each shard's origin."""
    states: list[State | None] = [reuse.get(k) for k in range(federation.count)]
    origins = {k: "reused" if k in reuse else "trained" for k in range(federation.count)}
    weights = federation.sizes()  # each shard weighs the samples it trained on; none: it drops out
    cost = Cost()
    if federation.stacks:
        for index, (state, spent) in train_stacked(federation, [k for k in range(federation.count) if k not in reuse],
                                                   watcher).items():
            states[index], cost = state, cost + spent
            if on_shard is not None:
                on_shard(index, state)
        return join_states(states, weights), cost, origins
    for index in range(federation.count):
        shard = federation.shard(index, {})
        if index in reuse:
            continue
        states[index], spent = fedavg_rounds(shard, shard.clients, state=None, rounds=shard.train_config.rounds,
                                             first_round=0, phase="train", monitor=_ShardRounds(watcher, index))
        cost += spent
        if on_shard is not None:
            on_shard(index, states[index])
    return join_states(states, weights), cost, origins


def trained(federation: Federation, model: TrainedModel) -> Federation:
    """``federation`` holding ``model`` (and, for DFL, its local models)."""
    if isinstance(federation, DecentralizedState):
        return dataclasses.replace(federation, state=model.state, node_states=model.node_states)
    return dataclasses.replace(federation, state=model.state)


def prepare_unlearning(federation: Federation) -> dict[str, float]:
    """One-off work after training that every later request reuses; returns its seconds by name.
    DFL: each node's curvature statistic at the trained model (Step 4 of the certified
    decentralized unlearning paper), stored in the federation for every method."""
    if not isinstance(federation, DecentralizedState):
        return {}
    return {"curvature_statistics_seconds": precompute_statistics(federation)}


def train_stacked(federation: ShardedFederation, indices: list[int], watcher: _Watcher
                  ) -> dict[int, tuple[State, Cost]]:
    """Shards ``indices`` trained together (``StackedFedAvg``), each costed as ``fedavg_rounds`` costs
    its rounds; ``watcher`` sees each shard's own model after each round, as the loop shows it."""
    if not indices:
        return {}
    shards = [federation.shard(k, {}) for k in indices]

    def show(number: int, result: StackedRound) -> None:
        if watcher.on_round is not None:
            for k, state, loss in zip(indices, result.states, result.train_losses):
                watcher(number, state, float(loss), k)

    history = StackedFedAvg([s.engine() for s in shards]).fit([s.clients for s in shards], on_round=show)
    per_sample = shards[0].flops_per_sample()
    return {k: (history[-1].states[j], Cost(
        flops=training_flops(per_sample, sum(r.samples[j] for r in history), shards[j].train_config.local_epochs),
        comm_bytes=communication_bytes(num_params(history[-1].states[j]), [r.participants[j] for r in history])))
            for j, k in enumerate(indices)}


__all__ = ["TrainedModel", "TrainingRound", "load_federation", "prepare_unlearning",
           "train", "train_shards", "trained"]
