"""Flow ``train-federated``: reproduce data → validate → federated training → register.

    dvc repro (prepare, partition) ─▶ Great Expectations ─▶ FedAvg rounds (client updates as
    mapped task runs) ─▶ MLflow run + per-round metrics ─▶ registered version, alias ``original``
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from prefect import flow, get_run_logger

from fedunlearn.benchmark.spec import parse_request
from fedunlearn.config import load_params
from fedunlearn.device import resolve_device
from fedunlearn.evaluation.backdoor import poison_clients
from fedunlearn.federation.fedavg import FedAvg, RoundResult, map_inline
from fedunlearn.federation.local import Tensors
from models import build_model
from tasks.data import load_partition, reproduce_data, validate_partition
from tasks.training import log_round, map_with_prefect, register_model, start_run


def client_tensors(partition, device: torch.device) -> tuple[list[Tensors], Tensors]:
    clients = [Tensors.from_arrays(c.features, c.labels, c.sample_ids, device) for c in partition.clients]
    test = Tensors.from_arrays(partition.test.features, partition.test.labels, partition.test.sample_ids, device)
    return clients, test


@flow(name="train-federated", log_prints=True)
def train_federated(scenario: str = "mnist5k-hfl", root: str = ".", rounds: int | None = None,
                    local_epochs: int | None = None, client_tasks: bool = True,
                    device: str | None = None, backdoor_request: str | None = None) -> dict:
    """Train the scenario's federated model from scratch on the current data version and
    register it as the ``original`` version. ``client_tasks=False`` runs client updates inline.
    ``backdoor_request`` (a benchmark request SPEC) puts the 4×4 trigger with target label 0 on
    those samples before training, so that forgetting them can later be seen in the backdoor."""
    started = time.perf_counter()
    logger = get_run_logger()
    workspace = Path(root).resolve()
    params = load_params(workspace / "params.yaml")
    cfg = params.scenario(scenario)
    if cfg.setting != "hfl":
        raise ValueError(f"scenario {scenario!r} is {cfg.setting.upper()}; this flow trains HFL scenarios "
                         f"({', '.join(n for n, s in params.scenarios.items() if s.setting == 'hfl')})")
    overrides = {k: v for k, v in {"rounds": rounds, "local_epochs": local_epochs}.items() if v is not None}
    train_cfg = cfg.train.model_copy(update=overrides)

    data_version = reproduce_data(workspace, scenario)
    validate_partition(workspace, scenario)
    partition = load_partition(workspace, scenario)
    dev = resolve_device(device or params.device)
    clients, test = client_tensors(partition, dev)
    tags = {"role": "original", "scenario": scenario, "data_version": data_version}
    if backdoor_request:
        batch = parse_request(backdoor_request).resolve(clients, partition.num_classes, params.seed)
        clients = poison_clients(clients, batch.forget_ids)
        tags["backdoor"] = backdoor_request
        print(f"backdoor trigger on {batch.num_forget} samples of clients {batch.affected_clients}")
    engine = FedAvg(lambda: build_model(cfg.model, partition.input_shape, partition.num_classes, l2=cfg.l2),
                    train_cfg, params.seed, dev)

    run_id = start_run(workspace, scenario, f"train-{scenario}",
                       {"scenario": scenario, "dataset": cfg.dataset, "model": cfg.model, "seed": params.seed,
                        "device": str(dev), "data_version": data_version,
                        **{f"partition.{k}": v for k, v in cfg.partition.model_dump().items()},
                        **{f"train.{k}": v for k, v in train_cfg.model_dump().items()}},
                       tags)

    def report(result: RoundResult) -> None:
        test_acc = engine.test_accuracy(result.state, test)
        log_round(workspace, run_id, {"test_acc": test_acc, "train_loss": result.train_loss}, result.round + 1)
        print(f"round {result.round + 1}/{train_cfg.rounds}: test_acc={test_acc:.4f} "
              f"train_loss={result.train_loss:.4f}")

    state = engine.fit(clients, map_updates=map_with_prefect if client_tasks else map_inline, on_round=report)
    test_acc = engine.test_accuracy(state, test)
    version = register_model(workspace, run_id, engine.model_from(state), test.x[:2], scenario, tags, "original")
    logger.info("registered %s version %s (alias 'original'), test_acc=%.4f", scenario, version, test_acc)
    return {"scenario": scenario, "data_version": data_version, "test_acc": test_acc, "model_version": version,
            "run_id": run_id, "device": str(dev), "wall_seconds": time.perf_counter() - started}
