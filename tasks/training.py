"""Prefect tasks for federated training: the hook that runs each unit of federated work — a
client update (HFL), a D-PSGD round of every node (DFL), a split-NN epoch of every party (VFL) —
as a task run on the flow's task runner (threads, Dask or Ray)."""

from __future__ import annotations

from typing import Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.federation.fedavg import ClientUpdate
from tasks import timing

CLIENT_UPDATE = {"global_state", "data", "client", "round_idx"}


@task(name="train-client", cache_policy=NO_CACHE, task_run_name="train-client-{client}-round-{round_idx}")
def train_client(update_fn: Callable[..., ClientUpdate], global_state: dict, data, client: int,
                 round_idx: int) -> ClientUpdate:
    # Timed in the body through the module, not by a decorator or a global clock: Dask pickles this
    # function by value, with the globals it names (a module goes by reference, a lock cannot go).
    with timing.CORE.measure():
        return update_fn(global_state=global_state, data=data, client=client, round_idx=round_idx)


@task(name="federated-update", cache_policy=NO_CACHE, task_run_name="{label}")
def federated_update(update_fn: Callable[..., Any], label: str, job: dict) -> Any:
    with timing.CORE.measure():
        return update_fn(**job)


def _label(update_fn: Callable[..., Any], job: dict) -> str:
    """``dpsgd-nodes-round-3``, ``split-nn-parties-epoch-3``: the unit and where it is."""
    where = [f"{'round' if key == 'round_idx' else key}-{job[key]}" for key in ("round_idx", "epoch") if key in job]
    return "-".join([update_fn.__name__.replace("_", "-"), *where])


def map_with_prefect(update_fn: Callable[..., Any], jobs: list[dict]) -> list[Any]:
    """Run a round's units of work as Prefect task runs (``federation.map_updates``)."""
    futures = [train_client.submit(update_fn, **job) if set(job) == CLIENT_UPDATE
               else federated_update.submit(update_fn, _label(update_fn, job), job) for job in jobs]
    return [future.result() for future in futures]
