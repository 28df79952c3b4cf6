"""What one party does with its own data: the objective, local SGD, evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from fedunlearn.config import TrainConfig

State = dict[str, torch.Tensor]


@dataclass
class Tensors:
    """A split's features and labels as tensors on the chosen device, plus its sample IDs."""

    x: torch.Tensor
    y: torch.Tensor
    sample_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    @classmethod
    def from_arrays(cls, features: np.ndarray, labels: np.ndarray, sample_ids: np.ndarray,
                    device: torch.device) -> "Tensors":
        return cls(torch.as_tensor(features, dtype=torch.float32, device=device),
                   torch.as_tensor(labels, dtype=torch.long, device=device), sample_ids)

    def select(self, mask: np.ndarray) -> "Tensors":
        index = torch.as_tensor(np.flatnonzero(mask), device=self.x.device)
        return Tensors(self.x[index], self.y[index], self.sample_ids[mask])


def objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy plus the model's regulariser, if it has one. The regulariser belongs
    to every per-sample term (docs/DESIGN.md §3: left out, Newton steps land far from the retrained optimum)."""
    loss = F.cross_entropy(model(x), y)
    regularizer = getattr(model, "regularizer", None)
    return loss + regularizer() if regularizer is not None else loss


def sgd_epochs(model: nn.Module, data: Tensors, *, epochs: int, lr: float, batch_size: int,
               momentum: float, generator: torch.Generator) -> float:
    """Plain mini-batch SGD; returns the mean training loss of the last epoch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    last = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(data), generator=generator).to(data.x.device)
        total, seen = 0.0, 0
        for start in range(0, len(data), batch_size):
            batch = order[start:start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = objective(model, data.x[batch], data.y[batch])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            seen += len(batch)
        last = total / max(seen, 1)
    return last


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    model.eval()
    return torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]) if len(x) else \
        torch.empty(0)


@torch.no_grad()
def accuracy(model: nn.Module, data: Tensors) -> float:
    if len(data) == 0:
        return float("nan")
    return int((predict_logits(model, data.x).argmax(1) == data.y).sum()) / len(data)


# How a round's units of federated work (client updates, a D-PSGD round, a split-NN epoch) are
# executed: ``map_updates(fn, jobs)`` returns ``[fn(**job) for job in jobs]``, inline or, in the
# flows, one Prefect task run per job.
MapUpdates = Callable[[Callable[..., Any], list[dict]], list[Any]]


def map_inline(fn: Callable[..., Any], jobs: list[dict]) -> list[Any]:
    return [fn(**job) for job in jobs]


class Engine:
    """What every federated engine shares: fresh models from ``model_fn``, seeded initial weights
    and the device everything lives on."""

    def __init__(self, model_fn: Callable[[], nn.Module], config: "TrainConfig", seed: int, device: torch.device):
        self.model_fn = model_fn
        self.config = config
        self.seed = seed
        self.device = device

    def initial_state(self) -> State:
        torch.manual_seed(self.seed)
        return {k: v.to(self.device) for k, v in self.model_fn().state_dict().items()}

    def model_from(self, state: State) -> nn.Module:
        model = self.model_fn().to(self.device)
        model.load_state_dict(state)
        return model

    def test_accuracy(self, state: State, test: Tensors) -> float:
        return accuracy(self.model_from(state), test)
