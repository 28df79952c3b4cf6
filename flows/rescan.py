"""Flow ``rescan-source``: the user's source file read again for the rows their deletion batches left
there (a system of record the pipeline does not rewrite): each receipt whose rows are gone says so,
and the status artifact ``deletion-status-<scenario>`` is published again."""

from __future__ import annotations

from prefect import flow

from fedunlearn.requests.folders import LOCK_TIMEOUT_S
from tasks.erasure import Rescan, rescan_sources
from tasks.status import publish_status
from stores.workspace import ScenarioScope, Workspace


@flow(name="rescan-source", log_prints=True)
def rescan_source(scenario: str = "mnist5k-hfl", root: str = ".") -> Rescan:
    """Read the scenario's dataset source again for the rows still pending erasure there.

    Args:
        scenario: a scenario of the workspace's params.yaml (its dataset's source is read).
        root: the workspace (the directory holding params.yaml).
    """
    ws = Workspace.open(root)
    with ws.batch_lock(LOCK_TIMEOUT_S, f"fedunlearn rescan --scenario {scenario}"):
        result = rescan_sources(ws, scenario)
        publish_status(ScenarioScope(ws, scenario))
    return result
