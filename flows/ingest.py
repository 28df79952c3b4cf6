"""Flow ``ingest-deletions``: deletion requests in, a new verified data version out.

    requests (form) ─▶ inbox ─▶ validate (GX + domain rules) ─▶ quarantine invalid ─▶ batch journal
    ─▶ ledger append ─▶ DVC stages + commit (new data version) ─▶ optional purge ─▶ verify erasure
    ─▶ batch record complete, files to processed/

Exactly once: batches run under a file lock; the journal is written before the ledger, the
ledger skips requests it already holds, and files move only after the ledger is durable, so a
re-run after a crash at any point first finishes the interrupted batch. No unlearning here:
that is ``fedunlearn process`` (the unlearning flows).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from prefect import flow, get_run_logger

from fedunlearn.config import load_params
from fedunlearn.faults import failpoint
from fedunlearn.requests.batch import BatchRecord, BatchStatus, QuarantineNote, Triage, record_path
from fedunlearn.requests.erasure import Fingerprints
from fedunlearn.requests.folders import RequestFolders, batch_lock
from fedunlearn.requests.model import DeletionRequestModel
from tasks.requests import (append_ledger, capture_fingerprints, close_batch, collect_inbox, file_applied_requests,
                            open_batch, purge_cache, quarantine_requests, recover_interrupted_batches,
                            reproduce_versions, submit_requests, validate_requests, verify_erasure)

NO_PENDING = "no pending requests"


def finish_batch(workspace: Path, record: BatchRecord) -> tuple[BatchRecord, Fingerprints | None]:
    """Run every step the journal does not record as done: a fresh batch runs them all, a batch
    interrupted by a crash resumes after its last recorded step. Returns the record and the deleted
    rows' fingerprints (memory only; None when the batch was already verified)."""
    fingerprints = None
    if record.status in (BatchStatus.FORMED, BatchStatus.LEDGER_APPENDED, BatchStatus.VERSIONED):
        fingerprints = capture_fingerprints(workspace, record)
    if record.status is BatchStatus.FORMED:
        failpoint("after-ingest")
        record = append_ledger(workspace, record)
    if record.status is BatchStatus.LEDGER_APPENDED:
        record = reproduce_versions(workspace, record)
    if record.status is BatchStatus.VERSIONED:
        if record.purge_requested and not record.purged:
            record = purge_cache(workspace, record, fingerprints)
        record = verify_erasure(workspace, record, fingerprints)
    if record.status is BatchStatus.VERIFIED:
        record = close_batch(workspace, record)
    return record, fingerprints


@flow(name="ingest-deletions")
def ingest_deletions(scenario: str = "mnist5k-hfl", root: str = ".", purge: bool = False,
                     requests: list[DeletionRequestModel] | None = None) -> dict:
    """Apply all pending deletion requests of ``scenario`` as one batch: a new data version
    without the deleted samples, verified free of their bytes. ``requests`` (a form in the
    Prefect UI) are written to the inbox first; ``purge`` removes earlier data versions from
    the DVC cache."""
    logger = get_run_logger()
    workspace = Path(root).resolve()
    load_params(workspace / "params.yaml").scenario(scenario)  # an unknown scenario stops here
    folders = RequestFolders.create(workspace)
    if requests:
        submit_requests(workspace, scenario, requests)
    with batch_lock(folders):
        resumed = [finish_batch(workspace, record)[0] for record in recover_interrupted_batches(workspace)]
        inbox = collect_inbox(workspace, scenario)
        already_applied = file_applied_requests(workspace, inbox.applied)
        plan = validate_requests(workspace, scenario, inbox.pending)
        quarantined = quarantine_requests(workspace, inbox.rejected + plan.rejected)
        record = None
        if plan.entries:
            record, _ = finish_batch(workspace, open_batch(workspace, plan, quarantined, purge))
    summary = summarize(folders, scenario, record, resumed, inbox, quarantined, already_applied)
    logger.info("%s: %d quarantined, %d resumed batch(es), data version %s -> %s", summary["status"],
                len(quarantined), len(resumed), summary.get("data_version_before"), summary.get("data_version_after"))
    return summary


def summarize(folders: RequestFolders, scenario: str, record: BatchRecord | None, resumed: list[BatchRecord],
              inbox: Triage, quarantined: list[QuarantineNote], already_applied: list[str]) -> dict:
    """What the CLI prints and the flow returns."""
    summary = {"scenario": scenario, "resumed": [r.batch_id for r in resumed],
               "quarantined": [note.model_dump() for note in quarantined], "already_applied": already_applied,
               "left_pending": [item.name for item in inbox.elsewhere],
               "waiting": {item.name: item.waiting for item in inbox.waiting}}
    if record is None:
        return {**summary, "status": "no valid requests" if quarantined else NO_PENDING}
    per_client = Counter()
    for entry in record.requests:
        per_client.update({int(client): len(ids) for client, ids in entry.clients.items()})
    return {**summary, "status": record.status.value, "batch_id": record.batch_id,
            "applied": [entry.request_id for entry in record.requests],
            "deleted_ids": len(record.deleted_ids()), "per_client": dict(sorted(per_client.items())),
            "data_version_before": record.data_version_before, "data_version_after": record.data_version_after,
            "erasure": record.erasure.model_dump() if record.erasure else None,
            "record": record_path(folders, record.batch_id).relative_to(folders.workspace).as_posix()}
