"""Flow ``submit-deletion-requests``: the Prefect UI's form for deletion requests that wait for
the next batch (``process-deletions``'s own ``requests`` form forgets them at once instead).

    requests (form) ─▶ validated (pydantic) ─▶ inbox files ─▶ the inbox watcher of
    ``fedunlearn serve`` announces each (``fedunlearn.request.submitted``) ─▶ the deployment
    triggers decide when the batch runs
"""

from __future__ import annotations

from prefect import flow

from fedunlearn.requests.model import DeletionRequestModel
from tasks.requests import submit_requests
from stores.workspace import ScenarioScope, Workspace


@flow(name="submit-deletion-requests", log_prints=True)
def submit_deletion_requests(requests: list[DeletionRequestModel], scenario: str = "mnist5k-hfl",
                             root: str = ".") -> list[str]:
    """Write ``requests`` to the inbox of ``scenario`` (a request naming no scenario gets it);
    returns the files written. Nothing is applied here.

    Args:
        requests: the deletion requests (kind, sample IDs, client or label, reason, deadline).
        scenario: the scenario a request naming none belongs to.
        root: the workspace (the directory holding params.yaml).
    """
    ws = Workspace.open(root)
    written = submit_requests(ScenarioScope(ws, scenario), requests)
    print(f"{len(written)} request(s) in the inbox of {scenario}: {', '.join(written)}")
    return written
