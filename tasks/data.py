"""Prefect tasks over the data plane: reproduce the DVC stages, validate, load a data version."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.device import resolve_device
from fedunlearn.evaluation.backdoor import poison_clients
from fedunlearn.federation.local import MapUpdates, map_inline
from fedunlearn.federation.protocol import Federation
from fedunlearn.training import load_federation
from fedunlearn.unlearning.base import ForgetSet
from stores import validation
from fedunlearn.timing import core_compute
from stores.workspace import Workspace, checkout_from_cache


def command_device(ws: Workspace, device: str | None) -> torch.device:
    """The device a command computes on, chosen once where its flow starts (``device``, else
    params.yaml's); everything below takes the ``torch.device`` it returns."""
    return resolve_device(device or ws.params.device)


@task(name="reproduce-data", cache_policy=NO_CACHE, retries=1)
def reproduce_data(ws: Workspace, scenario: str) -> str:
    """The scenario's prepare + partition stages, committed to DVC; returns the data version."""
    return ws.reproduce(scenario)


@task(name="validate-partition", cache_policy=NO_CACHE)
def validate_partition(ws: Workspace, scenario: str) -> dict:
    return validation.validate_partition(scenario, ws.root)


@task(name="load-data-version", cache_policy=NO_CACHE)
def load_data(ws: Workspace, scenario: str, device: torch.device, data_version: str | None = None, *,
              map_updates: MapUpdates = map_inline, backdoor_ids: list[str] | None = None) -> Federation:
    """``read_federation`` as a task run of the flow."""
    return read_federation(ws, scenario, device, data_version, map_updates=map_updates, backdoor_ids=backdoor_ids)


@core_compute
def read_federation(ws: Workspace, scenario: str, device: torch.device, data_version: str | None = None, *,
                    map_updates: MapUpdates = map_inline, backdoor_ids: list[str] | None = None) -> Federation:
    """The federation of ``data_version`` (default: the current one) with untrained weights: the
    workspace's files while they are that version, otherwise DVC's cache (the data before a batch
    whose ledger append moved the workspace on — its deleted samples are still in it). Read into
    memory only. ``backdoor_ids``: samples the lineage's original was trained with the trigger on
    (``--backdoor``); those still in the data carry it again, as they did in training."""
    if data_version is None or ws.data_version(scenario) == data_version:
        federation = load_federation(scenario, ws.params, ws.root, device)
    else:
        with tempfile.TemporaryDirectory(prefix="fedunlearn-version-", dir=ws.temporary_dir) as tmp:
            checkout_from_cache(ws.root, scenario, data_version, Path(tmp))
            federation = load_federation(scenario, ws.params, Path(tmp), device)
    federation.map_updates = map_updates
    if backdoor_ids:
        poisoned = set(backdoor_ids)
        present = [i for c in federation.clients for i in c.sample_ids.tolist() if i in poisoned]
        if present:
            federation.clients = poison_clients(federation.clients,
                                                ForgetSet.for_sample_ids(present, federation.clients).forget_ids)
    return federation
