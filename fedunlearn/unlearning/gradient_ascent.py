"""Projected gradient ascent (PGA) [1]_: the target clients ascend the loss on their forget data.

From the trained model, each target client maximises its forget loss with the gradient norm clipped
and every iterate projected onto the L2 ball of radius δ around a reference model w_ref, the average
of the other clients' models; it stops early once a mini-batch loss exceeds τ. The server averages
the ascended models by forget size, then optional FedAvg recovery rounds follow. Clients here keep no
state, so w_ref is recomputed by replaying the targets' last update, which also extends PGA to
several targets and to sample and class requests: docs/methods.md, "ga"; cost: "Cost accounting".

Hyperparameters (default; value in the paper, as reported in PUF [2]_, Appendix A):
    lr: ascent step size (None: the clients' own step size, ``TrainConfig.lr``; PUF tunes PGA's
        local learning rate but does not report the value).
    epochs: local unlearning epochs over the forget data (5; 5).
    batch_size: mini-batch size of the ascent (512; 512 or 1024).
    clip_norm: gradient-norm clipping threshold (5.0; 5.0).
    stop_loss: early stopping threshold τ on the forget mini-batch loss (2.2, just below
        ln 10 ≈ 2.30, a uniform guess over 10 classes; PUF tuned τ in [2.2, 10.0] and chose
        9.0 for IID and 6.5 for non-IID CIFAR).
    radius: δ, the projection radius around w_ref (None: derived with ``radius_fraction``).
    radius_fraction: δ = radius_fraction · ‖w_ref − w_random‖ when ``radius`` is None (1/3, as
        Halimi et al. do); w_random is the training's seeded initial model.
    recovery_rounds: FedAvg rounds on the retained data after the ascent (2; PGA's few rounds
        of post-training, reported by PUF as recovery rounds).

References
----------
.. [1] Halimi, Kadhe, Rawat and Baracaldo (2022), "Federated Unlearning: How to Efficiently Erase a
   Client in FL?", arXiv:2207.05521.
.. [2] "Federated Unlearning via Negated Pseudo-Gradients" (puf-negated-pseudo-gradients.txt):
   Appendix A (PGA's hyperparameters), Appendix B (cost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.federation.cost import Cost, communication_bytes, training_flops
from fedunlearn.federation.fedavg import ClientUpdate, aggregate
from fedunlearn.federation.local import State, Tensors
from fedunlearn.unlearning.base import (ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod,
                                        fedavg_rounds, num_params)
from fedunlearn.unlearning.registry import register


@dataclass
class AscentUpdate(ClientUpdate):
    steps: int = 0
    samples_processed: int = 0  # forward + backward passes, for the FLOP count
    early_stopped: bool = False


@register
class GradientAscent(UnlearningMethod):
    name = "ga"
    roles = {"hfl": "fallback"}
    rank = 1
    stronger_scales = ("epochs",)
    settings = frozenset({"hfl"})
    request_kinds = frozenset({"sample", "class", "client"})
    guarantee = EMPIRICAL_ONLY

    def __init__(self, *, lr: float | None = None, epochs: int = 5, batch_size: int = 512, clip_norm: float = 5.0,
                 stop_loss: float = 2.2, radius: float | None = None, radius_fraction: float = 1 / 3,
                 recovery_rounds: int = 2):
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.clip_norm = clip_norm
        self.stop_loss = stop_loss
        self.radius = radius
        self.radius_fraction = radius_fraction
        self.recovery_rounds = recovery_rounds
        self._require(lr is None or lr > 0, "lr", "> 0 or None")
        self._require(isinstance(epochs, int) and epochs >= 1, "epochs", "an integer >= 1")
        self._require(isinstance(batch_size, int) and batch_size >= 1, "batch_size", "an integer >= 1")
        self._require(clip_norm > 0, "clip_norm", "> 0")
        self._require(stop_loss > 0, "stop_loss", "> 0")
        self._require(radius is None or radius > 0, "radius", "> 0 or None")
        self._require(radius_fraction > 0, "radius_fraction", "> 0")
        self._require(isinstance(recovery_rounds, int) and recovery_rounds >= 0, "recovery_rounds",
                      "an integer >= 0")

    def _unlearn(self, fed_state: FederatedState, forget_set: ForgetSet, monitor: Monitor) -> Outcome:
        trained = fed_state.state
        forget = fed_state.forget_by_client(forget_set)
        reference = self._reference(fed_state, forget)
        radius = self.projection_radius(fed_state.engine().initial_state(), reference)
        jobs = [{"fed_state": fed_state, "reference": reference, "radius": radius, "data": data, "client": c}
                for c, data in forget.items()]
        updates: list[AscentUpdate] = fed_state.map_updates(self._ascend, jobs)
        unlearned = aggregate(trained, updates)  # server_lr 1: the server adopts the ascended models
        forget_all = fed_state.forget_data(forget_set)
        numbers = {"radius": radius, "reference_distance": _distance(trained, reference),
                   "unlearned_distance": _distance(unlearned, reference),
                   "forget_loss_before": _loss(fed_state, trained, forget_all),
                   "forget_loss_after": _loss(fed_state, unlearned, forget_all),
                   "ascent_steps": sum(u.steps for u in updates),
                   "early_stopped_clients": sum(u.early_stopped for u in updates),
                   "recovery_rounds": self.recovery_rounds}
        monitor.record("unlearn", 1, unlearned, forget_loss=numbers["forget_loss_after"])
        state, recovery_cost = fedavg_rounds(fed_state, fed_state.retained_clients(forget_set), state=unlearned,
                                             rounds=self.recovery_rounds,
                                             first_round=fed_state.train_config.rounds,
                                             phase="recovery", monitor=monitor)
        return Outcome(state, _ascent_cost(fed_state, forget_set, updates) + recovery_cost, certificate_inputs=numbers,
                       notes={"target_clients": list(forget), "reference": "replayed forget-data update"})

    @staticmethod
    def _reference(fed_state: FederatedState, forget: dict[int, Tensors]) -> State:
        """w_ref = (n·w − Σ n_u·w_u)/(n − Σ n_u), with w_u replayed on each client's forget data."""
        engine = fed_state.engine()
        jobs = [{"global_state": fed_state.state, "data": data, "client": c,
                 "round_idx": fed_state.train_config.rounds} for c, data in forget.items()]
        replayed = fed_state.map_updates(engine.local_update, jobs)
        return reference_model(fed_state.state, replayed, sum(len(c) for c in fed_state.clients))

    def projection_radius(self, initial: State, reference: State) -> float:
        """δ: ``radius``, else ``radius_fraction`` · ‖w_ref − w_random‖ (``initial``: the training's seeded start)."""
        return self.radius if self.radius is not None else self.radius_fraction * _distance(initial, reference)

    def _ascend(self, fed_state: FederatedState, reference: State, radius: float, data: Tensors,
                client: int) -> AscentUpdate:
        """One target client's projected gradient ascent on its forget data."""
        return self.ascend(fed_state.model_from(fed_state.state), data, reference, radius,
                           lr=self.lr or fed_state.train_config.lr, seed=fed_state.seed,
                           round_idx=fed_state.train_config.rounds, client=client)

    def ascend(self, model: nn.Module, data: Tensors, reference: State, radius: float, *, lr: float, seed: int,
               round_idx: int, client: int) -> AscentUpdate:
        """The client's side of PGA, wherever the client runs (here, or a Flower ClientApp:
        ``fedunlearn_flower.gradient_ascent``): ``model`` (the trained one) ascended on its forget
        ``data`` within the ball of ``radius`` around ``reference``, ``lr`` the resolved step size."""
        _project(model, reference, radius)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        # Seeded like a FedAvg client in the first round after training (``round_idx``): reproducible per client.
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, round_idx, client])
                                                      .generate_state(1)[0]))
        model.train()
        steps, processed, loss = 0, 0, float("nan")
        for _ in range(self.epochs):
            order = torch.randperm(len(data), generator=generator).to(data.x.device)
            for start in range(0, len(data), self.batch_size):
                index = order[start:start + self.batch_size]
                # Plain cross-entropy: ascending the regulariser too would only inflate the weights.
                batch_loss = F.cross_entropy(model(data.x[index]), data.y[index])
                loss = float(batch_loss.detach())
                if loss > self.stop_loss:
                    return self._update(client, model, data, loss, steps, processed, early_stopped=True)
                optimizer.zero_grad(set_to_none=True)
                (-batch_loss).backward()
                nn.utils.clip_grad_norm_(model.parameters(), self.clip_norm)
                optimizer.step()
                _project(model, reference, radius)
                steps += 1
                processed += len(index)
        return self._update(client, model, data, loss, steps, processed, early_stopped=False)

    @staticmethod
    def _update(client: int, model: nn.Module, data: Tensors, loss: float, steps: int, processed: int,
                early_stopped: bool) -> AscentUpdate:
        state = {k: v.detach() for k, v in model.state_dict().items()}
        return AscentUpdate(client, state, len(data), loss, steps=steps, samples_processed=processed,
                            early_stopped=early_stopped)


def reference_model(trained: State, replayed: list[ClientUpdate], total_samples: int) -> State:
    """w_ref = (n·w − Σ n_u·w_u)/(n − Σ n_u): the trained model ``trained`` (w, on ``total_samples``
    samples) without the targets' updates ``replayed`` (w_u, each on its n_u forget samples)."""
    n_forget = sum(update.num_samples for update in replayed)
    return aggregate(trained, replayed, server_lr=-n_forget / (total_samples - n_forget))


def _ascent_cost(fed_state: FederatedState, forget_set: ForgetSet, updates: list[AscentUpdate]) -> Cost:
    """Replayed reference updates + the ascent steps taken; one download + upload per target client."""
    per_sample = fed_state.flops_per_sample()
    replay = training_flops(per_sample, forget_set.num_forget, fed_state.train_config.local_epochs)
    ascent = training_flops(per_sample, sum(u.samples_processed for u in updates), epochs=1)
    return Cost(flops=replay + ascent, comm_bytes=communication_bytes(num_params(fed_state.state), len(updates)))


@torch.no_grad()
def _project(model: nn.Module, reference: State, radius: float) -> None:
    """Move the parameters back onto the ball ‖θ − w_ref‖₂ ≤ radius if a step left it."""
    params = dict(model.named_parameters())
    norm = math.sqrt(sum(float((p - reference[name]).pow(2).sum()) for name, p in params.items()))
    if norm > radius:
        for name, p in params.items():
            p.copy_(reference[name] + (p - reference[name]) * (radius / norm))


def _distance(a: State, b: State) -> float:
    """L2 distance over the floating-point entries (the parameters of the models used here)."""
    return math.sqrt(sum(float((a[k] - b[k]).pow(2).sum()) for k in a if torch.is_floating_point(a[k])))


@torch.no_grad()
def _loss(fed_state: FederatedState, state: State, data: Tensors) -> float:
    model = fed_state.model_from(state)
    model.eval()
    return float(F.cross_entropy(model(data.x), data.y))
