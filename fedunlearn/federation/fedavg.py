"""FedAvg (McMahan et al., 2017) written as server SGD on pseudo-gradients (Reddi et al., 2021),
the form the PUF paper builds on:

    w ← w + η_s Δ,   Δ = Σ_{i∈S_t} (n_i / n) (w_i − w),   n = Σ_{i∈S_t} n_i

Hyperparameters (``TrainConfig``): ``rounds`` (default 20), ``local_epochs`` (1), ``lr`` (client
SGD step, 0.05), ``batch_size`` (32), ``momentum`` (0), ``client_fraction`` (share of clients per
round, 1.0), ``server_lr`` (η_s, 1.0 = classic FedAvg).

Seeded and deterministic on CPU: the model's initial weights come from the seed, each client's
shuffling from (seed, round, client), client sampling from (seed, round). How a round's client
updates are executed is injected (``map_updates``): inline here, Prefect tasks in the flow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from fedunlearn.federation.local import Engine, MapUpdates, State, Tensors, map_inline, sgd_epochs


@dataclass
class ClientUpdate:
    client: int
    state: State
    num_samples: int
    train_loss: float


@dataclass
class RoundResult:
    round: int
    state: State
    updates: list[ClientUpdate]

    @property
    def train_loss(self) -> float:
        n = sum(u.num_samples for u in self.updates)
        return sum(u.train_loss * u.num_samples for u in self.updates) / max(n, 1)


def clone_state(state: State) -> State:
    return {k: v.detach().clone() for k, v in state.items()}


def aggregate(global_state: State, updates: Sequence[ClientUpdate], server_lr: float = 1.0) -> State:
    """w + η_s Σ_i (n_i/n)(w_i − w); integer buffers are taken from the first update."""
    total = sum(u.num_samples for u in updates)
    if total == 0:
        return clone_state(global_state)
    new_state: State = {}
    for key, w in global_state.items():
        if not torch.is_floating_point(w):
            new_state[key] = updates[0].state[key].clone()
            continue
        delta = sum((u.num_samples / total) * (u.state[key] - w) for u in updates)
        new_state[key] = w + server_lr * delta
    return new_state


class FedAvg(Engine):
    """Horizontal FL engine. ``model_fn`` builds a fresh (untrained) model."""

    def select_clients(self, round_idx: int, clients: Sequence[Tensors]) -> list[int]:
        """Clients with data; a seeded sample of ``client_fraction`` of them (at least one)."""
        eligible = [i for i, c in enumerate(clients) if len(c) > 0]
        k = max(1, round(self.config.client_fraction * len(eligible)))
        if k >= len(eligible):
            return eligible
        rng = np.random.default_rng([self.seed, round_idx])
        return sorted(rng.choice(eligible, size=k, replace=False).tolist())

    def local_update(self, global_state: State, data: Tensors, client: int, round_idx: int) -> ClientUpdate:
        model = self.model_from(global_state)
        seed = int(np.random.SeedSequence([self.seed, round_idx, client]).generate_state(1)[0])
        generator = torch.Generator().manual_seed(seed)
        loss = sgd_epochs(model, data, epochs=self.config.local_epochs, lr=self.config.lr,
                          batch_size=self.config.batch_size, momentum=self.config.momentum,
                          generator=generator)
        return ClientUpdate(client, {k: v.detach() for k, v in model.state_dict().items()}, len(data), loss)

    def run_round(self, state: State, clients: Sequence[Tensors], round_idx: int,
                  map_updates: MapUpdates = map_inline) -> RoundResult:
        jobs = [{"global_state": state, "data": clients[c], "client": c, "round_idx": round_idx}
                for c in self.select_clients(round_idx, clients)]
        updates = map_updates(self.local_update, jobs)
        return RoundResult(round_idx, aggregate(state, updates, self.config.server_lr), updates)

    def fit(self, clients: Sequence[Tensors], *, state: State | None = None, rounds: int | None = None,
            first_round: int = 0, map_updates: MapUpdates = map_inline,
            on_round: Callable[[RoundResult], None] | None = None) -> State:
        state = self.initial_state() if state is None else state
        for r in range(first_round, first_round + (rounds or self.config.rounds)):
            result = self.run_round(state, clients, r, map_updates)
            state = result.state
            if on_round is not None:
                on_round(result)
        return state
