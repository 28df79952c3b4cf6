"""Flow ``ingest-deletions``: deletion requests in, a new verified data version out.

    requests (form) ─▶ inbox ─▶ validate (GX + domain rules) ─▶ quarantine invalid ─▶ batch journal
    ─▶ ledger append ─▶ DVC stages + commit (new data version) ─▶ optional purge ─▶ verify erasure
    ─▶ batch record complete, files to processed/

Its two stages, ``intake-requests`` and ``apply-deletions`` (``flows.intake``), are the first
two of ``process-deletions`` too. Exactly once: batches run under a file lock; the journal is
written before the ledger, the ledger skips requests it already holds, and files move only after
the ledger is durable, so a re-run after a crash at any point first finishes the interrupted
batch. No unlearning here: that is ``fedunlearn process`` (the unlearning flows).
"""

from __future__ import annotations

from collections import Counter

from prefect import flow, get_run_logger

from fedunlearn.requests.batch import BatchRecord, record_path
from fedunlearn.requests.folders import LOCK_TIMEOUT_S
from fedunlearn.requests.idle import NO_PENDING
from fedunlearn.requests.model import DeletionRequestModel
from flows.intake import Intake, apply_deletions, intake_requests
from flows.results import IngestResult
from tasks.requests import submit_requests
from stores.workspace import ScenarioScope, Workspace



@flow(name="ingest-deletions")
def ingest_deletions(scenario: str = "mnist5k-hfl", root: str = ".", purge: bool = False,
                     requests: list[DeletionRequestModel] | None = None) -> IngestResult:
    """Apply all pending deletion requests of ``scenario`` as one batch: a new data version
    without the deleted samples, verified free of their bytes. ``requests`` (a form in the
    Prefect UI) are written to the inbox first; ``purge`` removes earlier data versions from
    the DVC cache."""
    logger = get_run_logger()
    ws = Workspace.open(root)
    scope = ScenarioScope(ws, scenario)  # an unknown scenario stops here
    if requests:
        submit_requests(scope, requests)
    with ws.batch_lock(LOCK_TIMEOUT_S, f"fedunlearn ingest --scenario {scenario}"):
        taken = intake_requests(scope, purge=purge)
        record = apply_deletions(ws, taken.batch).record if taken.batch else None
    summary = summarize(scope, record, taken)
    logger.info("%s: %d quarantined, %d resumed batch(es), data version %s -> %s", summary.status,
                len(taken.quarantined), len(taken.resumed), summary.data_version_before, summary.data_version_after)
    return summary


def summarize(scope: ScenarioScope, record: BatchRecord | None, taken: Intake) -> IngestResult:
    """What the CLI prints and the flow returns (``process-deletions`` adds its batch's fields):
    ``record``, the batch worked on (None: none), and what intake found."""
    inbox, folders = taken.inbox, scope.ws.folders
    # A batch an earlier run receipted and this run finished (its end steps) is reported as resumed too.
    finished = [taken.unfinished.record.batch_id] if taken.unfinished is not None else []
    summary = {"scenario": scope.scenario, "resumed": [r.batch_id for r in taken.resumed] + finished,
               "quarantined": list(taken.quarantined), "already_applied": taken.already_applied,
               "left_pending": [item.name for item in inbox.elsewhere],
               "waiting": {item.name: item.waiting for item in inbox.waiting}}
    if record is None:
        return IngestResult(**summary, status="no valid requests" if taken.quarantined else NO_PENDING)
    per_client = Counter()
    for entry in record.requests:
        per_client.update({int(client): len(ids) for client, ids in entry.clients.items()})
    return IngestResult(**summary, status=record.status.value, batch_id=record.batch_id,
                        applied=[entry.request_id for entry in record.requests],
                        deleted_ids=len(record.deleted_ids()), per_client=dict(sorted(per_client.items())),
                        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
                        erasure=record.erasure,
                        record=record_path(folders, record.batch_id).relative_to(folders.workspace).as_posix())
