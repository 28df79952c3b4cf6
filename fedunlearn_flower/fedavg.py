"""Federated Averaging (FedAvg) [McMahan et al., 2017] over Flower, written as server SGD on
pseudo-gradients [Reddi et al., 2021], the form the PUF paper builds on.

Paper: arxiv.org/abs/1602.05629 (FedAvg); arxiv.org/abs/2003.00295 (server optimisers).

The in-process engine (``fedunlearn.federation.fedavg``) run through Flower: the same client
sampling (seeded by round), the same local update at each client (the ClientApp's ``train``
handler calls it), the same aggregation in the same client order. Same seeds, same model.
"""

from __future__ import annotations

from typing import Callable

from fedunlearn.config import TrainConfig
from fedunlearn.federation.fedavg import FedAvg as InProcessFedAvg
from fedunlearn.federation.fedavg import RoundResult, aggregate
from fedunlearn.federation.local import State
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.partition import CPU


class FedAvg:
    """Federated Averaging strategy on a ``Federation`` (Flower's Grid with the scenario's clients).

    Parameters
    ----------
    rounds : int (default: 20)
        Communication rounds of a training run.
    local_epochs : int (default: 1)
        Epochs each sampled client trains per round.
    lr : float (default: 0.05)
        Client SGD learning rate.
    batch_size : int (default: 32)
        Client mini-batch size.
    momentum : float (default: 0.0)
        Client SGD momentum.
    client_fraction : float (default: 1.0)
        Share of the clients with data sampled per round (at least one), seeded by (seed, round).
    server_lr : float (default: 1.0)
        η_s in w ← w + η_s Σ_i (n_i/n)(w_i − w); 1.0 is classic FedAvg.
    """

    def __init__(self, rounds: int = 20, local_epochs: int = 1, lr: float = 0.05, batch_size: int = 32,
                 momentum: float = 0.0, client_fraction: float = 1.0, server_lr: float = 1.0):
        self.config = TrainConfig(rounds=rounds, local_epochs=local_epochs, lr=lr, batch_size=batch_size,
                                  momentum=momentum, client_fraction=client_fraction, server_lr=server_lr)

    @classmethod
    def from_config(cls, config: TrainConfig) -> "FedAvg":
        # min_test_acc gates the original the pipeline registers; it is no setting of the algorithm.
        return cls(**config.model_dump(exclude={"min_test_acc"}))

    @property
    def rounds(self) -> int:
        return self.config.rounds

    def client_hyperparameters(self, local_epochs: int | None = None) -> dict:
        """What a ``train`` message carries besides the model (``local_epochs``: PUF's E_u)."""
        return {"local_epochs": local_epochs or self.config.local_epochs, "lr": self.config.lr,
                "batch_size": self.config.batch_size, "momentum": self.config.momentum}

    def initial_state(self, federation: Federation) -> State:
        """The seeded initial model, as the in-process engine draws it."""
        scenario = federation.scenario
        return InProcessFedAvg(scenario.model_fn, self.config, scenario.seed, CPU).initial_state()

    def select(self, federation: Federation, round_idx: int, sizes: dict[int, int]) -> list[int]:
        """The clients round ``round_idx`` samples, given each client's sample count: the in-process
        engine's draw, seeded by (seed, round)."""
        scenario = federation.scenario
        engine = InProcessFedAvg(scenario.model_fn, self.config, scenario.seed, CPU)
        # The in-process sampler reads only each client's length: ranges stand in for the data.
        return engine.select_clients(round_idx, [range(sizes.get(c, 0)) for c in range(scenario.num_clients)])

    def run(self, federation: Federation, state: State, *, first_round: int = 0, rounds: int | None = None,
            sizes: dict[int, int] | None = None, forget_ids: dict[int, list[str]] | None = None,
            on_round: Callable[[RoundResult], None] | None = None) -> State:
        """``rounds`` rounds from ``state``, numbered from ``first_round`` (later phases keep their
        shuffling seeds apart from training's). With ``forget_ids``, clients train on their retained
        data only, and ``sizes`` are the retained counts (a client with none is never sampled)."""
        sizes = sizes or federation.sizes
        for r in range(first_round, first_round + (self.config.rounds if rounds is None else rounds)):
            chosen = self.select(federation, r, sizes)
            updates = federation.train(state, r, chosen, subset="retained" if forget_ids else "all",
                                       forget_ids=forget_ids, **self.client_hyperparameters())
            state = aggregate(state, updates, self.config.server_lr)
            if on_round is not None:
                on_round(RoundResult(r, state, updates))
        return state
