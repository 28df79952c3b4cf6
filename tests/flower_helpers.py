"""What the Flower tests share: a prepared digits-hfl workspace (params, raw data, partition — the
DVC stages' outputs, without DVC), and the in-process engine's results to compare with."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch

from fedunlearn.config import load_params
from fedunlearn.data.store import load_horizontal, partition_scenario, prepare_dataset
from fedunlearn.federation.batch import DeletionBatch
from fedunlearn.federation.fedavg import FedAvg
from fedunlearn.unlearning import FederatedState, get_method

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCENARIO = "digits-hfl"
CPU = torch.device("cpu")


def prepared_workspace(root: Path) -> Path:
    """``root`` with the project's params.yaml and digits-hfl's data version prepared and partitioned."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(PROJECT_ROOT / "params.yaml", root / "params.yaml")
    params = load_params(root / "params.yaml")
    prepare_dataset(params.scenario(SCENARIO).dataset, params, root, set())
    partition_scenario(SCENARIO, params, root)
    return root


def in_process(root: Path, rounds: int) -> FederatedState:
    """digits-hfl trained ``rounds`` rounds by the in-process FedAvg, from the same partition files."""
    from fedunlearn_flower.partition import Scenario

    scenario = Scenario.load(root, SCENARIO)
    config = scenario.config.train.model_copy(update={"rounds": rounds})
    partition = load_horizontal(SCENARIO, root)
    fed = FederatedState.from_partition(partition, model_fn=scenario.model_fn, state={}, train_config=config,
                                        seed=scenario.seed, device=CPU)
    fed.state = FedAvg(scenario.model_fn, config, scenario.seed, CPU).fit(fed.clients)
    return fed


def sample_batch(root: Path, client: int = 1, count: int = 10) -> DeletionBatch:
    """The first ``count`` samples of ``client``: a sample request."""
    ids = load_horizontal(SCENARIO, root).clients[client].sample_ids[:count]
    return DeletionBatch("sample", {client: np.asarray(ids)})


def unlearned_in_process(fed: FederatedState, batch: DeletionBatch, method: str, **params) -> dict:
    return get_method(method, **params).unlearn(fed, batch).state


def max_difference(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
