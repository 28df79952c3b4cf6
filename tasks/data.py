"""Prefect tasks over the data plane: reproduce the DVC stages, validate, load."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.data.store import HorizontalPartition, load_horizontal
from tasks import validation, workspace


@task(name="reproduce-data", cache_policy=NO_CACHE, retries=1)
def reproduce_data(root: Path, scenario: str) -> str:
    """The scenario's prepare + partition stages, committed to DVC; returns the data version."""
    workspace.init_workspace(root)
    return workspace.reproduce(root, scenario)


@task(name="validate-partition", cache_policy=NO_CACHE)
def validate_partition(root: Path, scenario: str) -> dict:
    return validation.validate_partition(scenario, root)


@task(name="load-federation", cache_policy=NO_CACHE)
def load_federation(root: Path, scenario: str, params, device):
    """The scenario's federation (any setting) with initial weights, on the current data version."""
    from fedunlearn.benchmark.settings import load_federation as load

    return load(scenario, params, root, device)


@task(name="load-partition", cache_policy=NO_CACHE)
def load_partition(root: Path, scenario: str) -> HorizontalPartition:
    return load_horizontal(scenario, root)
