"""D-PSGD — decentralized parallel SGD (Lian et al., 2017), the training algorithm of certified
decentralized unlearning (certified-decentralized-unlearning.txt §IV-A, Steps 1–4):

    x_i ← Σ_j Q_ij x_j − γ ∇F_i(x_i, ξ_i)

every node i takes a mini-batch gradient at its own model, averages its neighbours' models with
the mixing weights Q (``federation.topology``: Metropolis weights, checked) and applies its
gradient to the average. No server; the reported global model is the average of the local
models, x̄ = (1/N) Σ_i x_i (§III-A), ``average_state``.

Hyperparameters (``TrainConfig``): ``rounds``; ``local_epochs`` and ``batch_size`` — a round is
``local_epochs · ⌈max_i n_i / batch_size⌉`` iterations, so every node passes over its data at
least ``local_epochs`` times (a node with fewer samples reshuffles and continues: the
iterations are synchronous); ``lr`` is γ. The paper: batch size 100, one epoch per round,
γ = 0.001. D-PSGD is plain SGD with one mixing step per iteration, so ``momentum``,
``client_fraction`` and ``server_lr`` (FedAvg's) must keep their defaults.

Seeded and deterministic: the initial model comes from the seed (every node starts from the same
one, as FedAvg's clients do), node i's mini-batches in round r from (seed, r, i). All nodes'
gradients are one vectorised call (``torch.func.vmap``), which is how N devices computing in
parallel are simulated on one. The mixing runs in the parameters' dtype (a float64 model, as the
certified unlearning's float64 oracles use, mixes in float64). Nodes without data (a removed
client) have left the graph: the engine trains on the subgraph of the others and checks it is
connected (ρ < 1).

Cost: every iteration each node sends its model to each neighbour, 2|E| copies of P floats —
``communication_bytes(P, |E|)`` per iteration, PUF's 2·P·B formula with one "participant" per
edge. FLOPs: F per sample for every sample of every mini-batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from fedunlearn.config import TrainConfig
from fedunlearn.federation.cost import communication_bytes
from fedunlearn.federation.local import Engine, MapUpdates, State, Tensors, map_inline, objective
from fedunlearn.federation.topology import Topology


@dataclass
class DPSGDRound:
    """One round: the nodes' models (aligned with the clients; None for a node without data),
    the mean mini-batch objective, and what the round sent and computed."""

    round: int
    node_states: list[State | None]
    train_loss: float
    iterations: int
    comm_bytes: int
    samples: int

    @property
    def state(self) -> State:
        return average_state(self.node_states)


def average_state(node_states: Sequence[State | None]) -> State:
    """x̄ = (1/N) Σ_i x_i over the nodes that have a model; other entries are taken from the first."""
    states = [s for s in node_states if s is not None]
    if not states:
        raise ValueError("no node has a model to average")
    return {k: torch.stack([s[k] for s in states]).mean(0) if torch.is_floating_point(v) else v.clone()
            for k, v in states[0].items()}


class _Objective(nn.Module):
    """``objective(model, x, y)`` as a forward pass, so that ``functional_call`` swaps the
    parameters for the regulariser too, not only for the logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return objective(self.model, x, y)


class DPSGD(Engine):
    """Decentralized engine. ``model_fn`` builds a fresh (untrained) model; ``topology`` has one
    node per client."""

    def __init__(self, model_fn: Callable[[], nn.Module], config: TrainConfig, topology: Topology, seed: int,
                 device: torch.device):
        hfl_only = {k: v for k, v in (("momentum", 0.0), ("client_fraction", 1.0), ("server_lr", 1.0))
                    if getattr(config, k) != v}
        if hfl_only:
            raise ValueError(f"D-PSGD is plain SGD with every node in every iteration; "
                             f"{', '.join(f'{k}={getattr(config, k)}' for k in hfl_only)} must keep its default")
        super().__init__(model_fn, config, seed, device)
        self.topology = topology

    def active_topology(self, clients: Sequence[Tensors]) -> Topology:
        """The graph of the nodes that hold data, its mixing matrix checked (connected, ρ < 1)."""
        if len(clients) != len(self.topology):
            raise ValueError(f"{len(clients)} clients for a topology of {len(self.topology)} nodes")
        active = [i for i, c in enumerate(clients) if len(c) > 0]
        if not active:
            raise ValueError("no node holds data")
        graph = self.topology.induced([self.topology.nodes[i] for i in active])
        graph.mixing()
        return graph

    def steps_per_round(self, clients: Sequence[Tensors]) -> int:
        return self.config.local_epochs * math.ceil(max(len(c) for c in clients) / self.config.batch_size)

    def fit(self, clients: Sequence[Tensors], *, state: State | Sequence[State | None] | None = None,
            rounds: int | None = None, first_round: int = 0, on_round: Callable[[DPSGDRound], None] | None = None,
            map_updates: MapUpdates = map_inline) -> list[State | None]:
        """Train for ``rounds`` rounds (default: the configured number). ``state``: None (the
        seeded initial model at every node), one state (at every node) or one per client.
        ``map_updates`` runs each round (every node's steps and mixing: one unit of work)."""
        graph = self.active_topology(clients)
        active = [i for i, c in enumerate(clients) if len(c) > 0]
        starts = self._starting_states(state, len(clients), active)
        model = self.model_fn().to(self.device)
        if next(model.buffers(), None) is not None:
            raise ValueError(f"D-PSGD trains parameters only; {type(model).__name__} has buffers")
        wrapper = _Objective(model).train()

        def loss(params: State, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return functional_call(wrapper, {f"model.{k}": v for k, v in params.items()}, (x, y))

        gradients = vmap(grad_and_value(loss))
        stacked = {k: torch.stack([starts[i][k] for i in active]).to(self.device) for k in starts[active[0]]}
        # Q in the parameters' dtype: tensordot does not promote, so a float32 Q fails on a float64 model.
        q = torch.as_tensor(graph.mixing(), dtype=next(iter(stacked.values())).dtype, device=self.device)
        num_params = sum(v[0].numel() for v in stacked.values())
        steps = self.steps_per_round([clients[i] for i in active])
        batch = self.config.batch_size
        def dpsgd_nodes(stacked: State, round_idx: int) -> tuple[State, float]:
            """One round: every node's ``steps`` local steps, each followed by mixing with its neighbours."""
            order = [self._batch_order(clients[i], round_idx, i, steps) for i in active]
            losses = torch.zeros(len(active), device=self.device)
            for t in range(steps):
                xb = torch.stack([clients[i].x[order[k][t]] for k, i in enumerate(active)])
                yb = torch.stack([clients[i].y[order[k][t]] for k, i in enumerate(active)])
                grads, values = gradients(stacked, xb, yb)
                # Step 2 (mix the neighbours' models) and Step 3 (apply the gradient taken at the
                # node's own pre-mixing model) of the paper's §IV-A.
                stacked = {k: torch.tensordot(q, v, dims=1) - self.config.lr * grads[k] for k, v in stacked.items()}
                losses += values.detach()
            return stacked, float(losses.mean()) / steps

        for r in range(first_round, first_round + (rounds or self.config.rounds)):
            [(stacked, loss)] = map_updates(dpsgd_nodes, [{"stacked": stacked, "round_idx": r}])
            if on_round is not None:
                on_round(DPSGDRound(r, _unstack(stacked, active, len(clients)), loss, steps,
                                    communication_bytes(num_params, graph.num_edges, rounds=steps),
                                    steps * batch * len(active)))
        return _unstack(stacked, active, len(clients))

    def _starting_states(self, state: State | Sequence[State | None] | None, num_clients: int,
                         active: list[int]) -> list[State | None]:
        if state is None or isinstance(state, dict):
            start = self.initial_state() if state is None else state
            return [start] * num_clients
        states = list(state)
        if len(states) != num_clients or any(states[i] is None for i in active):
            raise ValueError("give one starting state per client, at least for every client with data")
        return states

    def _batch_order(self, data: Tensors, round_idx: int, client: int, steps: int) -> torch.Tensor:
        """``steps`` mini-batches of indices: seeded reshuffled passes over the node's data."""
        seed = int(np.random.SeedSequence([self.seed, round_idx, client]).generate_state(1)[0])
        generator = torch.Generator().manual_seed(seed)
        needed = steps * self.config.batch_size
        passes = [torch.randperm(len(data), generator=generator) for _ in range(math.ceil(needed / len(data)))]
        return torch.cat(passes)[:needed].view(steps, self.config.batch_size).to(data.x.device)


def _unstack(stacked: State, active: list[int], num_clients: int) -> list[State | None]:
    """Per-client states from the stacked parameters of the active nodes (None elsewhere)."""
    states: list[State | None] = [None] * num_clients
    for k, i in enumerate(active):
        states[i] = {name: v[k].detach().clone() for name, v in stacked.items()}
    return states
