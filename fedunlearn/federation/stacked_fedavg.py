"""FedAvg of several federations of one architecture at once, as one vectorised batch: the shards
of a federation in shards (``fedunlearn.sharded_federation``) trained together.

The shards' models are stacked (``torch.func.stack_module_state``) and every local SGD step of the
j-th selected client of each shard is one ``torch.func.vmap`` of ``grad`` over the stack — on a GPU
one kernel launch for all shards instead of one per shard (FedShard, 2025, trains its shards side by
side the same way; vectorised ensembles: ``torch.func`` "model ensembling"). Each shard follows its
own ``FedAvg`` exactly as the loop does: its client selection, its clients' shuffling seeds, its
batch order, plain SGD with momentum as ``torch.optim.SGD``, the server step of ``fedavg.aggregate``.
Clients of different sizes take different numbers of steps: a shard whose client has no batch left
at a step is masked (its weights and momentum unchanged). The result equals the loop's up to
floating-point summation order (tests/test_shards.py).

Hyperparameters: none of its own; every shard's ``TrainConfig`` (rounds, local_epochs, lr,
batch_size, momentum, client_fraction, server_lr; defaults in ``fedunlearn.config``) must be the
same. Models with a regulariser of their own (``logreg``) are not stacked: the loop trains them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, stack_module_state, vmap

from fedunlearn.federation.fedavg import ClientUpdate, FedAvg, aggregate
from fedunlearn.federation.local import State, Tensors


@dataclass
class StackedRound:
    """One round of every shard: their new states and, per shard, the participants and samples."""

    states: list[State]
    participants: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    train_losses: list[float] = field(default_factory=list)


class StackedFedAvg:
    """``engines[k]`` trains ``clients[k]`` (module docstring)."""

    def __init__(self, engines: Sequence[FedAvg]):
        configs = {e.config.model_dump_json() for e in engines}
        if len(configs) != 1:
            raise ValueError("stacked FedAvg needs one training configuration for every shard")
        self.engines, self.config = list(engines), engines[0].config
        self.model = engines[0].model_fn().to(engines[0].device)

    @staticmethod
    def supports(model: torch.nn.Module) -> bool:
        """Whether a model can be stacked: no regulariser of its own in the objective."""
        return getattr(model, "regularizer", None) is None

    def fit(self, clients: Sequence[Sequence[Tensors]], *, rounds: int | None = None,
            on_round: Callable[[int, StackedRound], None] | None = None) -> list[StackedRound]:
        states = [e.initial_state() for e in self.engines]
        history = []
        for r in range(rounds or self.config.rounds):
            history.append(self.run_round(states, clients, r))
            states = history[-1].states
            if on_round is not None:
                on_round(r + 1, history[-1])
        return history

    def run_round(self, states: list[State], clients: Sequence[Sequence[Tensors]], round_idx: int) -> StackedRound:
        selected = [e.select_clients(round_idx, c) for e, c in zip(self.engines, clients)]
        updates: list[list[ClientUpdate]] = [[] for _ in self.engines]
        for slot in range(max(len(s) for s in selected)):
            jobs = [(k, s[slot]) for k, s in enumerate(selected) if slot < len(s)]
            for (k, _), update in zip(jobs, self.local_updates(states, clients, jobs, round_idx)):
                updates[k].append(update)
        new = [aggregate(states[k], updates[k], self.config.server_lr) for k in range(len(self.engines))]
        losses = [sum(u.train_loss * u.num_samples for u in us) / max(sum(u.num_samples for u in us), 1)
                  for us in updates]
        return StackedRound(new, [len(us) for us in updates], [sum(u.num_samples for u in us) for us in updates],
                            losses)

    def local_updates(self, states: list[State], clients: Sequence[Sequence[Tensors]], jobs: list[tuple[int, int]],
                      round_idx: int) -> list[ClientUpdate]:
        """Client ``c`` of shard ``k`` for each job, all from their shard's global state, stacked."""
        models = []
        for k, _ in jobs:
            models.append(self.engines[k].model_from(states[k]))
        params, buffers = stack_module_state(models)
        data = [clients[k][c] for k, c in jobs]
        generators = [torch.Generator().manual_seed(
            int(np.random.SeedSequence([self.engines[k].seed, round_idx, c]).generate_state(1)[0])) for k, c in jobs]
        params, losses = self.sgd_epochs(params, buffers, data, generators)
        keys = list(states[jobs[0][0]])
        stacked = {**params, **buffers}
        return [ClientUpdate(c, {key: stacked[key][j].detach() for key in keys}, len(data[j]), losses[j])
                for j, (_, c) in enumerate(jobs)]

    def sgd_epochs(self, params: dict, buffers: dict, data: list[Tensors], generators: list[torch.Generator]
                   ) -> tuple[dict, list[float]]:
        """``local.sgd_epochs`` for every stacked model on its own data; returns the parameters and
        each model's mean loss of the last epoch."""
        config, momentum = self.config, {}
        step = vmap(grad_and_value(self._loss), in_dims=(0, 0, 0, 0, 0))
        last = [0.0] * len(data)
        for _ in range(config.local_epochs):
            orders = [torch.randperm(len(d), generator=g).to(d.x.device) for d, g in zip(data, generators)]
            totals = [0.0] * len(data)
            for start in range(0, max(len(d) for d in data), config.batch_size):
                x, y, mask = self._batch(data, orders, start)
                grads, loss = step(params, buffers, x, y, mask)
                active = mask.sum(1) > 0
                params, momentum = self._sgd_step(params, grads, momentum, active)
                loss, counts = loss.detach().tolist(), mask.sum(1).tolist()
                totals = [t + loss[j] * counts[j] for j, t in enumerate(totals)]
            last = [t / max(len(d), 1) for t, d in zip(totals, data)]
        return params, last

    def _batch(self, data: list[Tensors], orders: list[torch.Tensor], start: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The mini-batch at ``start`` of every model, padded to ``batch_size`` rows with a mask."""
        size = self.config.batch_size
        xs, ys, masks = [], [], []
        for d, order in zip(data, orders):
            index = order[start:start + size]
            pad = size - len(index)
            index = torch.cat([index, index.new_zeros(pad)])
            masks.append(torch.cat([torch.ones(size - pad), torch.zeros(pad)]).to(d.x))
            xs.append(d.x[index])
            ys.append(d.y[index])
        return torch.stack(xs), torch.stack(ys), torch.stack(masks)

    def _loss(self, params: dict, buffers: dict, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
              ) -> torch.Tensor:
        losses = F.cross_entropy(functional_call(self.model, (params, buffers), (x,)), y, reduction="none")
        return (losses * mask).sum() / mask.sum().clamp_min(1)

    def _sgd_step(self, params: dict, grads: dict, momentum: dict, active: torch.Tensor) -> tuple[dict, dict]:
        """``torch.optim.SGD`` (momentum, no dampening) on the models where ``active``."""
        lr, mu = self.config.lr, self.config.momentum
        new_params, new_momentum = {}, {}
        for key, p in params.items():
            keep = active.view(-1, *([1] * (p.dim() - 1)))
            direction = grads[key]
            if mu:
                direction = direction if key not in momentum else mu * momentum[key] + direction
                new_momentum[key] = torch.where(keep, direction, momentum.get(key, direction))
            new_params[key] = torch.where(keep, p - lr * direction, p).detach()
        return new_params, new_momentum

