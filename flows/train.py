"""Flow ``train-federated``: reproduce data → validate → federated training → register.

    dvc repro (prepare, partition) ─▶ Great Expectations ─▶ FedAvg rounds (client updates as
    mapped task runs) ─▶ MLflow run + per-round metrics ─▶ registered version, alias ``original``
    (``retrained`` when the retrain-reference flow trains the gold standard of a data version)
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Literal

import torch
from prefect import flow, get_run_logger

from fedunlearn.benchmark.spec import parse_request
from fedunlearn.certify.certificate import EXACT_RETRAIN, NOT_CERTIFIED
from fedunlearn.config import load_params
from fedunlearn.device import resolve_device
from fedunlearn.evaluation.backdoor import poison_clients
from fedunlearn.evaluation.cost import communication_bytes, flops_per_sample, training_flops
from fedunlearn.federation.fedavg import FedAvg, RoundResult, map_inline
from fedunlearn.federation.local import Tensors, accuracy
from fedunlearn.unlearning.base import num_params
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
                    device: str | None = None, backdoor_request: str | None = None,
                    role: Literal["original", "retrained"] = "original", batch_id: str | None = None) -> dict:
    """Train the scenario's federated model from scratch on the current data version and
    register it as the ``original`` version. ``client_tasks=False`` runs client updates inline.
    ``backdoor_request`` (a benchmark request SPEC) puts the 4×4 trigger with target label 0 on
    those samples before training, so that forgetting them can later be seen in the backdoor.
    ``role="retrained"`` registers it as the exact reference of the data version instead (tag and
    alias ``retrained``; ``batch_id`` names the deletion batch it is the reference for)."""
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
    tags = {"role": role, "scenario": scenario, "data_version": data_version,
            "certificate": EXACT_RETRAIN if role == "retrained" else NOT_CERTIFIED,  # nothing unlearned
            **({"batch_id": batch_id} if batch_id else {})}
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

    participants: list[int] = []
    samples: list[int] = []

    def report(result: RoundResult) -> None:
        participants.append(len(result.updates))
        samples.append(sum(u.num_samples for u in result.updates))
        test_acc = engine.test_accuracy(result.state, test)
        log_round(workspace, run_id, {"test_acc": test_acc, "train_loss": result.train_loss}, result.round + 1)
        print(f"round {result.round + 1}/{train_cfg.rounds}: test_acc={test_acc:.4f} "
              f"train_loss={result.train_loss:.4f}")

    fit_started = time.perf_counter()
    state = engine.fit(clients, map_updates=map_with_prefect if client_tasks else map_inline, on_round=report)
    wall_seconds = time.perf_counter() - fit_started
    test_acc = engine.test_accuracy(state, test)
    model = engine.model_from(state)
    # Every registered version's run carries the same metric keys (receipts.VERSION_METRICS, for
    # `fedunlearn compare` and MLflow's compare view); no forget set yet: forget accuracy and MIA AUC are
    # NaN at step 0, which a deletion batch replaces when this model is its retrained reference.
    per_sample = flops_per_sample(model, tuple(test.x.shape[1:]))
    log_round(workspace, run_id, {
        "retain_acc": sum(accuracy(model, c) * len(c) for c in clients) / sum(len(c) for c in clients),
        "forget_acc": math.nan, "mia_auc": math.nan, "wall_seconds": wall_seconds,
        "flops": training_flops(per_sample, sum(samples), train_cfg.local_epochs),
        "comm_bytes": communication_bytes(num_params(state), participants)}, 0)
    version = register_model(workspace, run_id, model, tuple(test.x.shape[1:]), scenario, tags, role)
    logger.info("registered %s version %s (alias %r), test_acc=%.4f", scenario, version, role, test_acc)
    return {"scenario": scenario, "data_version": data_version, "test_acc": test_acc, "model_version": version,
            "run_id": run_id, "device": str(dev), "wall_seconds": time.perf_counter() - started}
