"""Where a deletion batch's wall time goes. The core's compute — reading the data version,
writing the new one (the prepare and partition stages), building the batch's evaluation sets,
unlearning, evaluating (the audit references' scores included), and the client updates of a retrained reference — is timed inside the
tasks that run it (``@core_compute``, ``CORE.measure()``); the flow's
wall time minus that is orchestration and bookkeeping: Prefect's task and flow runs, MLflow,
DVC, Great Expectations, the ledger, the receipt."""

from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class ComputeClock:
    """Wall seconds during which at least one ``@core_compute`` call was running in this process:
    the union of their intervals, so client updates running in parallel threads (or a compute
    step inside another) count once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._closed = 0.0

    @property
    def seconds(self) -> float:
        with self._lock:
            return self._closed + (time.perf_counter() - self._since if self._active else 0.0)

    @contextmanager
    def measure(self) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._closed += time.perf_counter() - self._since


    def __reduce__(self):
        # Dask ships a flow's code by value, and with it the functions that time through this clock: on
        # another process the clock is that process's own (a lock cannot be pickled anyway).
        return (process_clock, ())


CORE = ComputeClock()


def process_clock() -> ComputeClock:
    """This process's compute clock."""
    return CORE


def core_compute(function: F) -> F:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with CORE.measure():
            return function(*args, **kwargs)

    return timed  # type: ignore[return-value]


class FlowClock:
    """Started at the top of a flow: ``split()`` gives its wall seconds so far, the core's share
    and the rest (orchestration); ``stage(name)`` ends a stage, whose orchestration seconds
    ``split()`` lists by name (``orchestration_by_stage``, the time since the previous stage)."""

    def __init__(self) -> None:
        self.started, self.core_at_start = time.perf_counter(), CORE.seconds
        self._stage_started = (self.started, self.core_at_start)
        self.stages: dict[str, float] = {}

    def stage(self, name: str) -> None:
        now, core = time.perf_counter(), CORE.seconds
        self.stages[name] = round((now - self._stage_started[0]) - (core - self._stage_started[1]), 3)
        self._stage_started = (now, core)

    def split(self) -> dict[str, Any]:
        wall, core = time.perf_counter() - self.started, CORE.seconds - self.core_at_start
        return {"flow_seconds": round(wall, 3), "core_seconds": round(core, 3),
                "orchestration_seconds": round(wall - core, 3),
                "orchestration_share": round((wall - core) / wall, 4) if wall > 0 else 0.0,
                **({"orchestration_by_stage": dict(self.stages)} if self.stages else {})}
