"""What every federation state offers, whatever the setting: the interface the trainer, the
unlearning methods, the evaluator and the pipeline program against.

``FederatedState`` (HFL, ``unlearning.base``), ``VerticalState`` (VFL, ``federation.vertical``)
and ``DecentralizedState`` (DFL, ``unlearning.dfl_retrain``) implement it. Requests are keyed by
client index: in VFL the single key 0 stands for "all parties" (every party holds a slice of every
sample), so class and sample requests resolve the same way everywhere.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from fedunlearn.config import TrainConfig
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.local import MapUpdates, State, Tensors


@runtime_checkable
class Federation(Protocol):
    setting: str                 # "hfl", "vfl" or "dfl"
    state: Any                   # the trained model: a state dict, or one per party (VFL)
    test: Tensors                # the held-out split, full features (the auditor's view in VFL)
    map_updates: MapUpdates      # how units of federated work run: inline, or as Prefect task runs

    @property
    def clients(self) -> list[Tensors]: ...  # the training data per client (VFL: one entry, all samples)

    @property
    def train_config(self) -> TrainConfig: ...

    @property
    def seed(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def num_classes(self) -> int: ...

    def model_from(self, state: State) -> nn.Module:
        """The model ``state`` describes, as one module over full features (for evaluation)."""

    def forget_masks(self, forget_set: ForgetSet) -> dict[int, np.ndarray]: ...

    def forget_data(self, forget_set: ForgetSet) -> Tensors: ...

    def forget_by_client(self, forget_set: ForgetSet) -> dict[int, Tensors]: ...

    def retained_clients(self, forget_set: ForgetSet) -> list[Tensors]: ...
