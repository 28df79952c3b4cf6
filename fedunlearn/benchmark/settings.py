"""One adapter per federated setting: how a scenario's federation is loaded and its original
model trained. Requests, unlearning and evaluation are shared by every setting: a federation
state exposes ``clients``, ``test``, ``forget_data``, ``retained_clients``, ``model_from``,
``engine()``, ``train_config``, ``seed`` and ``device`` (``FederatedState`` for HFL,
``VerticalState`` for VFL, ``DecentralizedState`` (with its graph) for DFL)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from fedunlearn.config import Params
from fedunlearn.data.store import load_horizontal
from fedunlearn.evaluation.cost import CostRecord
from fedunlearn.federation.dpsgd import average_state
from fedunlearn.federation.topology import build_topology
from fedunlearn.federation.vertical import VerticalState, load_vertical
from fedunlearn.unlearning.base import DeletionBatch, FederatedState, Monitor, fedavg_rounds
from fedunlearn.unlearning.certified_dfu import precompute_statistics
from fedunlearn.unlearning.dfl_retrain import DecentralizedState, dpsgd_rounds
from models import build_model


def load_federation(scenario: str, params: Params, root: Path, device: torch.device) -> Any:
    """The scenario's federation on the current data version, with untrained (initial) weights."""
    cfg = params.scenario(scenario)
    if cfg.setting == "vfl":
        federation = load_vertical(scenario, root, device, config=cfg.train, seed=params.seed)
        return VerticalState.from_federation(federation, federation.initial_state())
    partition = load_horizontal(scenario, root)
    fed_state = FederatedState.from_partition(
        partition, model_fn=lambda: build_model(cfg.model, partition.input_shape, partition.num_classes, l2=cfg.l2),
        state={}, train_config=cfg.train, seed=params.seed, device=device, setting=cfg.setting)
    if cfg.setting == "dfl":
        topology = build_topology(cfg.topology, len(fed_state.clients), params.seed)
        return DecentralizedState.from_federation(fed_state, topology)
    return fed_state


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
    elif fed_state.setting == "dfl":
        nodes, cost = dpsgd_rounds(fed_state, fed_state.clients, state=None, rounds=fed_state.train_config.rounds,
                                   first_round=0, phase="train", monitor=monitor)
        state = average_state(nodes)  # the reported global model: the average of the local models
    else:
        state, cost = fedavg_rounds(fed_state, fed_state.clients, state=None, rounds=fed_state.train_config.rounds,
                                    first_round=0, phase="train", monitor=monitor)
    return state, dataclasses.replace(cost, wall_seconds=time.perf_counter() - start - monitor.seconds), \
        monitor.history


def prepare_unlearning(fed_state: Any, original: dict) -> dict[str, float]:
    """One-off work after training that every later request reuses; returns its seconds by name.
    DFL: each node's curvature statistic at the trained model (Step 4 of the certified
    decentralized unlearning paper), stored in the federation state shared by every method."""
    if not isinstance(fed_state, DecentralizedState):
        return {}
    return {"curvature_statistics_seconds": precompute_statistics(dataclasses.replace(fed_state, state=original))}
