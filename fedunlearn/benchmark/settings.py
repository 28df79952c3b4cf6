"""One adapter per federated setting: how a scenario's federation is loaded and its original
model trained. Requests, unlearning and evaluation are shared by every setting: a federation
state exposes ``clients``, ``test``, ``forget_data``, ``retained_clients``, ``model_from``,
``engine()``, ``train_config``, ``seed`` and ``device`` (``FederatedState`` for HFL,
``VerticalState`` for VFL)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import Params
from fedunlearn.data.store import load_horizontal
from fedunlearn.evaluation.cost import CostRecord
from fedunlearn.federation.vertical import VerticalState, load_vertical
from fedunlearn.unlearning.base import DeletionBatch, FederatedState, Monitor, fedavg_rounds
from models import build_model


def load_federation(scenario: str, params: Params, root: Path, device: torch.device) -> Any:
    """The scenario's federation on the current data version, with untrained (initial) weights."""
    cfg = params.scenario(scenario)
    if cfg.setting == "vfl":
        federation = load_vertical(scenario, root, device, config=cfg.train, seed=params.seed)
        return VerticalState.from_federation(federation, federation.initial_state())
    partition = load_horizontal(scenario, root)
    return FederatedState.from_partition(
        partition, model_fn=lambda: build_model(cfg.model, partition.input_shape, partition.num_classes, l2=cfg.l2),
        state={}, train_config=cfg.train, seed=params.seed, device=device, setting=cfg.setting)


def train_federation(fed_state: Any, batch: DeletionBatch) -> tuple[dict, CostRecord, list[dict]]:
    """Train the original model from scratch on all of ``fed_state``'s clients; ``batch`` only
    names the forget set whose accuracy the history records. Returns (state, cost, history);
    the cost's wall time leaves out the monitoring."""
    monitor = Monitor(fed_state, batch)
    start = time.perf_counter()
    if fed_state.setting == "vfl":
        federation = fed_state.engine()
        before = federation.meter()
        result = federation.fit(on_epoch=lambda epoch, state, loss: monitor.record("train", epoch, state,
                                                                                   train_loss=loss))
        state, cost = result.state, fed_state.cost_since(before)
    else:
        state, cost = fedavg_rounds(fed_state, fed_state.clients, state=None, rounds=fed_state.train_config.rounds,
                                    first_round=0, phase="train", monitor=monitor)
    return state, dataclasses.replace(cost, wall_seconds=time.perf_counter() - start - monitor.seconds), \
        monitor.history
