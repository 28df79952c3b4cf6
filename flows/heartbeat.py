"""One heartbeat per flow-run process: sub-flows beat with their parent's.

Prefect gives every flow run — a sub-flow too — a heartbeat thread that sleeps in steps, and a
sub-flow's end joins it, so each sub-flow can wait up to one step. A deletion batch runs several
sub-flows in its own process, whose liveness the top-level run's heartbeat already reports to the
server (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` stays in force for it). Through Prefect's public
settings API (``temporary_settings``): nothing of Prefect is patched.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings


@contextmanager
def parent_heartbeat() -> Iterator[None]:
    """Sub-flows started in the block send no heartbeat of their own."""
    if get_current_settings().flows.heartbeat_frequency is None:  # a sub-flow's own sub-flows: in force already
        yield
        return
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
