"""What one client holds: its own split of the workspace's data version and the scenario's model.

Both sides read the scenario from the workspace's params.yaml; a client reads only its own
``client_<i>`` directory of the partition (the DVC stage's output), so the data it trains on is the
data version the pipeline prepared, and no other client's rows are ever opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from fedunlearn.config import ScenarioConfig, load_params
from fedunlearn.data.store import PARTITIONS_DIR, read_manifest
from fedunlearn.errors import InputError
from fedunlearn.federation.local import Tensors
from models import build_model

CPU = torch.device("cpu")


@dataclass
class Scenario:
    """The scenario as both sides need it: configuration, seed, model builder, client count."""

    name: str
    config: ScenarioConfig
    seed: int
    manifest: dict

    @classmethod
    def load(cls, root: str | Path, name: str) -> "Scenario":
        params = load_params(Path(root) / "params.yaml")
        config = params.scenario(name)
        if config.setting != "hfl":
            raise InputError(f"scenario {name} is {config.setting}; the Flower app runs HFL scenarios only")
        return cls(name, config, params.seed, read_manifest(name, Path(root)))

    @property
    def num_clients(self) -> int:
        return len(self.manifest["clients"])

    @property
    def model_fn(self) -> Callable[[], nn.Module]:
        shape, classes = tuple(self.manifest["input_shape"]), int(self.manifest["num_classes"])
        return lambda: build_model(self.config.model, shape, classes, l2=self.config.l2)

    def model_from(self, state: dict[str, torch.Tensor]) -> nn.Module:
        model = self.model_fn().to(CPU)
        model.load_state_dict(state)
        return model


def own_split(root: str | Path, scenario: str, partition_id: int) -> Tensors:
    """Client ``partition_id``'s training split, read from its own directory only."""
    directory = Path(root) / PARTITIONS_DIR / scenario / f"client_{partition_id:03d}"
    if not directory.is_dir():
        raise InputError(f"partition {partition_id} of {scenario} not found: {directory} is missing")
    arrays = [np.load(directory / f"{name}.npy", allow_pickle=False) for name in ("features", "labels", "sample_ids")]
    return Tensors.from_arrays(*arrays, CPU)


def subset(data: Tensors, which: str, forget_ids: Sequence[str]) -> Tensors:
    """``all`` the client's data, its ``forget`` samples (those of ``forget_ids`` it holds) or the
    ``retained`` rest; a forget ID the client does not hold is an error, as in the core."""
    if which == "all":
        return data
    mask = np.isin(data.sample_ids, np.asarray(list(forget_ids), dtype=str))
    if which == "forget" and mask.sum() != len(set(forget_ids)):
        missing = sorted(set(forget_ids) - set(data.sample_ids[mask].tolist()))[:5]
        raise InputError(f"the client does not hold sample ID(s) {missing}")
    if which not in ("forget", "retained"):
        raise InputError(f"unknown subset {which!r}; choose all, forget or retained")
    return data.select(mask if which == "forget" else ~mask)
