"""Where a deletion batch's wall time goes. The core's compute — reading the data version,
building the batch's evaluation sets, unlearning, evaluating — is timed inside the tasks that run
it (``@core_compute``); the flow's wall time minus that is orchestration and bookkeeping:
Prefect's task and flow runs, MLflow, DVC, Great Expectations, the ledger, the receipt."""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class ComputeClock:
    """Seconds spent inside ``@core_compute`` functions by this process, all threads together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds


CORE = ComputeClock()


def core_compute(function: F) -> F:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            CORE.add(time.perf_counter() - start)

    return timed  # type: ignore[return-value]


class FlowClock:
    """Started at the top of a flow: ``split()`` gives its wall seconds so far, the core's share
    and the rest (orchestration)."""

    def __init__(self) -> None:
        self.started, self.core_at_start = time.perf_counter(), CORE.seconds

    def split(self) -> dict[str, float]:
        wall, core = time.perf_counter() - self.started, CORE.seconds - self.core_at_start
        return {"flow_seconds": round(wall, 3), "core_seconds": round(core, 3),
                "orchestration_seconds": round(wall - core, 3),
                "orchestration_share": round((wall - core) / wall, 4) if wall > 0 else 0.0}
