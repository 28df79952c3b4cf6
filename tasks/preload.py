"""Load what a deletion batch will need in a background thread while the CLI waits for the ephemeral
Prefect server to start (7–15 s with the main thread idle): Great Expectations (3–4 s to import)
and MLflow's model logging (``tracking.prepare_model_logging``, 2–3 s). Paid in the flow's
critical path they were a third of a batch's orchestration time on 2 CPU cores. Started in the
flow itself they gained nothing: there they compete for the GIL with the flow's own Python work.
The flow calls ``wait()`` before its first tensor work. A served run has all of it, and more
(``import_registry_stores``, ``prepare_dvc``, ``prepare_plotting``), from the warm process it is
forked from (``flows.warm_start`` runs the steps with ``now``).

A failure here is only a lost head start: the step that needs the library reports real problems.
"""

from __future__ import annotations

import io
import logging
import tempfile
import threading
from pathlib import Path
from typing import Callable

from stores.registry import prepare_model_logging

logger = logging.getLogger(__name__)
_started: list[threading.Thread] = []


def import_validation() -> None:
    import great_expectations  # noqa: F401


def import_registry_stores() -> None:
    """MLflow's SQL stores (with alembic): 0.2 s of the first registry query of a process."""
    import mlflow.store.model_registry.sqlalchemy_store  # noqa: F401
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def prepare_dvc() -> None:
    """DVC's Python API (``stores.workspace`` commits data versions in process): 0.15 s, and 0.08 s
    more that a repository's first open and commit import lazily (440 modules: SCM, plots, stage
    cache, transfer), paid here on a throwaway repository whose caches stay in its directory."""
    from stores.workspace import commit_stage

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / ".dvc").mkdir()
        (root / ".dvc" / "config").write_text(f"[core]\n    no_scm = True\n    site_cache_dir = {root / 'site'}\n")
        (root / "dvc.yaml").write_text("stages:\n  probe:\n    cmd: 'true'\n    outs: [out]\n")
        (root / "out").mkdir()
        (root / "out" / "probe").write_text("probe\n")
        commit_stage(root, "probe")


def prepare_plotting() -> None:
    """Save a small histogram: a process's first figure pays ~0.35 s for matplotlib's fonts and
    renderer, the audit plot of every version after it ~0.04 s."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(1.0, 1.0))
    figure.subplots().hist([0.0, 1.0])
    figure.savefig(io.BytesIO(), format="png")


def now(*steps: Callable[[], None]) -> None:
    """Run ``steps`` one after the other in this thread (the warm process of ``flows.warm``)."""
    for step in steps:
        try:
            step()
        except Exception as err:
            logger.warning("preloading %s failed: %s", step.__name__, err)


def in_background(*steps: Callable[[], None]) -> None:
    """Run ``steps`` one after the other in a daemon thread; ``wait()`` joins it."""
    thread = threading.Thread(target=now, args=steps, name="fedunlearn-preload", daemon=True)
    thread.start()
    _started.append(thread)


def wait() -> None:
    """Until every preload started in this process has finished."""
    while _started:
        _started.pop().join()


BATCH_LIBRARIES = (import_validation, prepare_model_logging)

