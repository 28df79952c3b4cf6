"""Prefect tasks for federated training: the hook that runs each unit of federated work — a
client update (HFL), a D-PSGD round of every node (DFL), a split-NN epoch of every party (VFL) —
through the flow's task runner.

Where the task runner has workers of its own (Dask, Ray), every unit is a task run and a round's
client updates run side by side across them. The default thread runner shares this machine's cores,
which torch's intra-op threads already use: there a round is one task run that does its units in
turn: client updates side by side on a few cores only contend for them (docs/BENCHMARKS.md), and
each task run adds three events to the Prefect server's writes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from fedunlearn.federation.cost import Cost
from fedunlearn.federation.fedavg import ClientUpdate
from fedunlearn.training import TrainingRound
from fedunlearn import timing
from fedunlearn_flower.engine import train_with_flower
from stores.workspace import Workspace

CLIENT_UPDATE = frozenset({"global_state", "data", "client", "round_idx"})


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


@task(name="train-round", cache_policy=NO_CACHE, task_run_name="{label}")
def train_round(update_fn: Callable[..., Any], label: str, jobs: list[dict]) -> list[Any]:
    """A round's units of work, in turn (the thread runner's task run)."""
    with timing.CORE.measure():
        return [update_fn(**job) for job in jobs]


def _label(update_fn: Callable[..., Any], jobs: list[dict]) -> str:
    """``train-clients-round-3`` (a round of client updates), ``dpsgd-nodes-round-3``,
    ``split-nn-parties-epoch-3``: the unit and where it is."""
    job = jobs[0]
    if set(job) == CLIENT_UPDATE:
        return f"train-clients-round-{job['round_idx']}"
    where = [f"{'round' if key == 'round_idx' else key}-{job[key]}" for key in ("round_idx", "epoch") if key in job]
    return "-".join([update_fn.__name__.replace("_", "-"), *where])


def _workers_of_their_own() -> bool:
    context = FlowRunContext.get()
    return context is not None and not isinstance(context.task_runner, ThreadPoolTaskRunner)


def map_with_prefect(update_fn: Callable[..., Any], jobs: list[dict]) -> list[Any]:
    """Run a round's units of work as Prefect task runs (``federation.map_updates``): one per unit on
    Dask or Ray, one for the whole round on the thread runner (module docstring)."""
    if not jobs:
        return []
    if not _workers_of_their_own():
        return train_round(update_fn, _label(update_fn, jobs), jobs)
    futures = [train_client.submit(update_fn, **job) if set(job) == CLIENT_UPDATE
               else federated_update.submit(update_fn, _label(update_fn, [job]), job) for job in jobs]
    return [future.result() for future in futures]


@task(name="train-through-flower", cache_policy=NO_CACHE)
def train_through_flower(ws: Workspace, scenario: str, engine: str, rounds: int | None,
                         on_round: Callable[[TrainingRound], None] | None = None) -> tuple[dict, str, Cost]:
    """The scenario trained by FedAvg through Flower's ``engine`` (``deployment`` or ``simulation``)
    on the workspace's current data version: the model, its ``runtime`` tag and its cost (FLOPs and
    bytes counted as the in-process trainer's; the wall time includes the engine's start and stop).
    ``on_round`` sees each round's model once the run has ended, as the in-process trainer's does."""
    with tempfile.TemporaryDirectory(prefix="fedunlearn-flower-", dir=ws.temporary_dir) as tmp:
        return train_with_flower(Path(ws.root).resolve(), scenario, tmp, runner=engine, rounds=rounds,
                                 on_round=on_round)
