"""The workspace pushed to its DVC remote as a Prefect task run, when the remote is behind it."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from stores.durable import push_state, stale


@task(name="push-durable-state", cache_policy=NO_CACHE)
def push_durable_state(root: Path, why: str) -> str | None:
    name = push_state(root)
    if name:
        get_run_logger().info("pushed the data versions and the state snapshot %s to the DVC remote (%s)", name, why)
    return name


def sync_state(root: Path, why: str) -> str | None:
    """What a flow calls under the batch lock: push when the remote is behind this workspace (a
    Prefect task run only then), a no-op without a remote."""
    return push_durable_state(Path(root), why) if stale(root) else None
