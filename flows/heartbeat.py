"""One heartbeat per flow-run process: sub-flows beat with their parent's.

Prefect 3.8 gives every flow run — a sub-flow too — a heartbeat thread that sleeps in 1 s steps,
and a sub-flow's end joins it: up to a second per sub-flow (measured against a `prefect server`:
1.07 s per empty sub-flow with its heartbeat, 0.08 s without). A deletion batch runs six or more
sub-flows in its own process, whose liveness the top-level run's heartbeat already reports to the
server (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, 180 s by default, stays in force for it).
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
