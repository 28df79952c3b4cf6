"""Load what a deletion batch will need in a background thread while the CLI waits for the ephemeral
Prefect server to start (7–15 s with the main thread idle): Great Expectations (3–4 s to import)
and MLflow's model logging (``tracking.prepare_model_logging``, 2–3 s). Paid in the flow's
critical path they were a third of a batch's orchestration time on 2 CPU cores. Started in the
flow itself they gained nothing: there they compete for the GIL with the flow's own Python work.
The flow calls ``wait()`` before its first tensor work.

A failure here is only a lost head start: the step that needs the library reports real problems.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from tasks.registry import prepare_model_logging

logger = logging.getLogger(__name__)
_started: list[threading.Thread] = []


def import_validation() -> None:
    import great_expectations  # noqa: F401


def _run(steps: tuple[Callable[[], None], ...]) -> None:
    for step in steps:
        try:
            step()
        except Exception as err:
            logger.warning("preloading %s failed: %s", step.__name__, err)


def in_background(*steps: Callable[[], None]) -> None:
    """Run ``steps`` one after the other in a daemon thread; ``wait()`` joins it."""
    thread = threading.Thread(target=_run, args=(steps,), name="fedunlearn-preload", daemon=True)
    thread.start()
    _started.append(thread)


def wait() -> None:
    """Until every preload started in this process has finished."""
    while _started:
        _started.pop().join()


BATCH_LIBRARIES = (import_validation, prepare_model_logging)

