"""Prefect tasks for federated training: one task run per client update, tracking, registry."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.federation.fedavg import ClientUpdate
from tasks import timing, tracking


@task(name="train-client", cache_policy=NO_CACHE, task_run_name="train-client-{client}-round-{round_idx}")
def train_client(update_fn: Callable[..., ClientUpdate], global_state: dict, data, client: int,
                 round_idx: int) -> ClientUpdate:
    # Timed in the body through the module, not by a decorator or a global clock: Dask pickles this
    # function by value, with the globals it names (a module goes by reference, a lock cannot go).
    with timing.CORE.measure():
        return update_fn(global_state=global_state, data=data, client=client, round_idx=round_idx)


def map_with_prefect(update_fn: Callable[..., ClientUpdate], jobs: list[dict]) -> list[ClientUpdate]:
    """Run a round's client updates as Prefect task runs on the flow's task runner."""
    futures = [train_client.submit(update_fn, **job) for job in jobs]
    return [future.result() for future in futures]


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(root: Path, experiment: str, run_name: str, params: dict, tags: dict) -> str:
    return tracking.start_run(root, experiment, run_name, params, tags)


@task(name="log-round", cache_policy=NO_CACHE)
def log_round(root: Path, run_id: str, metrics: dict, step: int) -> None:
    tracking.log_metrics(root, run_id, metrics, step)


@task(name="register-model", cache_policy=NO_CACHE)
def register_model(root: Path, run_id: str, model: torch.nn.Module, input_shape: tuple[int, ...], name: str,
                   tags: dict, alias: str | None) -> str:
    version = tracking.register_model(root, run_id, model, input_shape, name, tags, alias)
    tracking.end_run(root, run_id)
    return version
