"""A federation in shards: exact forgetting at a fraction of a retrain.

SISA ("Machine Unlearning", Bourtoule et al., IEEE S&P 2021) for federated learning, as FedShard
(2025) and isolated sharding (IJCAI 2024) do it: the clients are split into K shards, each shard
trains its own FedAvg model on its own clients only, and the served model aggregates the shard
models (``models.ensemble.ShardEnsemble``: the log of their mean softmax, each shard weighted by the
training samples it holds). A deleted sample was
seen by one shard's model alone, so forgetting it exactly means retraining that shard from scratch
— about 1/K of a full retrain — while every other shard model is, bit for bit, what training from
scratch on its unchanged data gives.

Hyperparameters (a scenario's params.yaml):

* ``shards`` (K, default 1): the number of shards. 1 is the unsharded federation, unchanged (the
  scenario loads as a plain ``FederatedState``; nothing here runs).
* The assignment is fixed, not tuned: client c goes to shard ``position of c in a permutation
  seeded by (seed, K)`` mod K — stable across deletions (it depends on no data), balanced in
  clients (shard sizes differ by at most one client).
* Each shard trains with the scenario's ``TrainConfig`` (rounds, local epochs, lr, ...) and its
  own seed drawn from (seed, K, shard), so shard models start from different weights.

Unlearning methods run on the touched shard models only (``unlearn_by_shard``): a method sees a
plain federation of the shard's clients, with the batch's samples of that shard; the others keep
their weights. A shard weighs what it holds after the batch (``sizes``); one whose every sample is
deleted drops out of the aggregate (its ``live`` entry and weight are 0). Each shard's ``digest`` names everything its from-scratch training depends on (its data,
configuration, seed, architecture): an exact retrain reuses a shard model trained from scratch on
the same digest, since retraining it would give the same weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
from torch import nn

from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.cost import Cost
from fedunlearn.federation.local import State
from fedunlearn.federation.stacked_fedavg import StackedFedAvg
from fedunlearn.unlearning.base import FederatedState, Outcome
from models.ensemble import ShardEnsemble, join_states, split_state

if TYPE_CHECKING:
    from fedunlearn.unlearning.base import UnlearningMethod


def assign_shards(num_clients: int, shards: int, seed: int) -> tuple[int, ...]:
    """Client index → shard: a permutation seeded by (seed, K), dealt round-robin into K shards."""
    if not 1 <= shards <= num_clients:
        raise ValueError(f"shards must be between 1 and the number of clients ({num_clients}), got {shards}")
    order = np.random.default_rng([seed, shards]).permutation(num_clients)
    shard_of = np.empty(num_clients, dtype=int)
    shard_of[order] = np.arange(num_clients) % shards
    return tuple(int(s) for s in shard_of)


def shard_seed(seed: int, shards: int, shard: int) -> int:
    """Shard ``shard``'s training seed (initial weights, shuffling, client sampling)."""
    return int(np.random.SeedSequence([seed, shards, shard]).generate_state(1)[0] % (2**31 - 1))


@dataclass
class ShardedFederation(FederatedState):
    """A ``FederatedState`` whose model is a ``ShardEnsemble`` of K shard models (module docstring).
    ``shard_of[c]``: client c's shard; ``base_model_fn``: one shard's (untrained) model."""

    shard_of: tuple[int, ...] = ()
    base_model_fn: Callable[[], nn.Module] | None = None
    vectorised: bool | None = None  # shards trained as one vmapped batch; None: where CUDA is present

    @classmethod
    def of(cls, federation: FederatedState, shards: int, vectorised: bool | None = None) -> "ShardedFederation":
        """``federation`` split into ``shards`` shards; its model becomes the shards' ensemble."""
        base = federation.model_fn
        return cls(**{f.name: getattr(federation, f.name) for f in dataclasses.fields(FederatedState)}
                   | {"model_fn": lambda: ShardEnsemble([base() for _ in range(shards)]),
                      "shard_of": assign_shards(len(federation.clients), shards, federation.seed),
                      "base_model_fn": base, "vectorised": vectorised})

    @property
    def stacks(self) -> bool:
        """Whether training stacks the shards (``federation.stacked_fedavg``)."""
        wanted = self.device.type == "cuda" if self.vectorised is None else self.vectorised
        return wanted and StackedFedAvg.supports(self.base_model_fn())

    @property
    def count(self) -> int:
        return max(self.shard_of) + 1

    def members(self, shard: int) -> list[int]:
        """The (global) client indices of ``shard``, in order."""
        return [c for c, s in enumerate(self.shard_of) if s == shard]

    def shard_states(self, state: State | None = None) -> list[State]:
        """The shard models' state dicts within ``state`` (default: the federation's)."""
        return split_state(self.state if state is None else state, self.count)

    def shard(self, index: int, state: State | None = None) -> FederatedState:
        """Shard ``index`` as a plain federation of its own clients (local indices 0..), holding
        its model from ``state`` (default: the federation's; empty: untrained)."""
        source = self.state if state is None else state
        return FederatedState(self.setting, self.base_model_fn, split_state(source, self.count)[index] if source
                              else {}, [self.clients[c] for c in self.members(index)], self.test, self.train_config,
                              shard_seed(self.seed, self.count, index), self.device, self.num_classes,
                              self.map_updates, self.calibration)

    def sizes(self, forget_set: ForgetSet | None = None) -> list[int]:
        """The training samples each shard holds (less ``forget_set``'s): its weight in the ensemble."""
        held = [sum(len(self.clients[c]) for c in self.members(k)) for k in range(self.count)]
        for client, ids in (forget_set.forget_ids if forget_set is not None else {}).items():
            held[self.shard_of[client]] -= len(ids)
        return held

    def touched(self, forget_set: ForgetSet) -> list[int]:
        """The shards holding a sample ``forget_set`` deletes."""
        return sorted({self.shard_of[c] for c in forget_set.forget_ids})

    def shard_batch(self, forget_set: ForgetSet, index: int) -> ForgetSet:
        """``forget_set``'s samples held in shard ``index``, keyed by the shard's local client index."""
        local = {c: i for i, c in enumerate(self.members(index))}
        clients = [local[c] for c in forget_set.clients or [] if c in local] or None
        return ForgetSet(forget_set.kind, {local[c]: ids for c, ids in forget_set.forget_ids.items() if c in local},
                             clients if forget_set.kind != "class" else forget_set.clients, forget_set.labels, forget_set.batch_id,
                             forget_set.remembered)

    def digest(self, index: int) -> str:
        """What shard ``index``'s from-scratch training depends on, as a digest: its clients' data
        (sample IDs, labels, features), the training configuration, its seed and architecture."""
        sub = self.shard(index, {})
        hasher = hashlib.sha256(json.dumps([self.count, index, sub.seed, self.train_config.model_dump_json(),
                                            [(k, list(v.shape)) for k, v in sub.model_fn().state_dict().items()],
                                            self.members(index)]).encode())
        for data in sub.clients:
            hasher.update(",".join(map(str, data.sample_ids.tolist())).encode())
            hasher.update(data.y.cpu().numpy().tobytes())
            hasher.update(data.x.cpu().numpy().tobytes())
        return hasher.hexdigest()[:16]

    def unlearn_by_shard(self, method: "UnlearningMethod", forget_set: ForgetSet) -> Outcome:
        """``method`` on each shard ``forget_set`` touches, as a federation of that shard alone; every
        other shard model is kept as it is. The outcome's state is the new ensemble."""
        states, outcomes = self.shard_states(), dict[int, Outcome]()
        # Each shard weighs what it holds after the batch, as an exact retrain would weigh it; a shard
        # whose every sample is deleted (weight 0) has no model left to serve.
        weights = [n if alive else 0 for n, alive in zip(self.sizes(forget_set), self.state["live"].tolist())]
        if not any(weights):
            raise ValueError(f"{forget_set.batch_id} removes all training data; nothing would be retained")
        for index in self.touched(forget_set):
            if weights[index] > 0:
                outcomes[index] = method.unlearn(self.shard(index), self.shard_batch(forget_set, index))
                states[index] = outcomes[index].state
        return merged_outcome(join_states(states, weights), outcomes, self.touched(forget_set))


def merged_outcome(state: State, outcomes: Mapping[int, Outcome], touched: list[int]) -> Outcome:
    """One outcome of the touched shards' outcomes: costs added, histories and notes by shard, each
    assumption held only where it held in every shard, the numbers by shard (flat for one shard)."""
    cost = sum((o.cost for o in outcomes.values()), Cost())
    assumptions: dict[str, bool] = {}
    for outcome in outcomes.values():
        for name, ok in outcome.certificate_inputs.get("assumptions", {}).items():
            assumptions[name] = assumptions.get(name, True) and bool(ok)
    numbers = {k: {n: v for n, v in o.certificate_inputs.items() if n != "assumptions"} for k, o in outcomes.items()}
    inputs: dict[str, Any] = (next(iter(numbers.values())) if len(numbers) == 1 else {"per_shard": numbers})
    inputs = {**inputs, "touched_shards": touched, **({"assumptions": assumptions} if assumptions else {})}
    history = [{"shard": k, **entry} for k, o in outcomes.items() for entry in o.history]
    notes = {"touched_shards": touched, "per_shard": {k: o.notes for k, o in outcomes.items()}}
    return Outcome(state, cost, inputs, history, notes)


__all__ = ["ShardedFederation", "assign_shards", "merged_outcome", "shard_seed"]
