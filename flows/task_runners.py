"""Task runners for client work: a thread pool by default; Dask or Ray for several machines."""

from __future__ import annotations

from enum import Enum


class RunnerKind(str, Enum):
    thread = "thread"
    dask = "dask"
    ray = "ray"


def make_task_runner(kind: RunnerKind | str = RunnerKind.thread, address: str | None = None,
                     max_workers: int | None = None):
    kind = RunnerKind(kind)
    if kind is RunnerKind.thread:
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=max_workers)
    try:
        if kind is RunnerKind.dask:
            from prefect_dask import DaskTaskRunner

            return DaskTaskRunner(address=address) if address else DaskTaskRunner()
        from prefect_ray import RayTaskRunner

        return RayTaskRunner(address=address) if address else RayTaskRunner()
    except ImportError as err:
        raise ValueError(f"task runner {kind.value!r} needs the prefect-{kind.value} package: "
                         f"pip install prefect-{kind.value}") from err
