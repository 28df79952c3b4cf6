"""The two stages that ``ingest-deletions`` and ``process-deletions`` share, each a task run under
which its steps' task runs nest (as sub-flows, each stage's creation and two state changes would be
blocking calls to the Prefect server; a task run's are events):

    intake-requests   ledger checked against the journals ─▶ interrupted batches finished ─▶ the
                      batch owed by an earlier run (process) — or the inbox: validate (GX + domain
                      rules) ─▶ quarantine invalid ─▶ one batch, journaled
    apply-deletions   ledger append ─▶ DVC stages + commit (new data version) ─▶ optional purge
                      ─▶ erasure check of every store ─▶ files to processed/ ─▶ with a default DVC
                      remote: data versions + state snapshot pushed (``stores.durable``)

Exactly once: the journal (batch record) is written before the ledger, the ledger skips requests
it already holds, and files move only after the ledger is durable; ``apply_deletions`` runs only
the steps the journal does not record as done, so a re-run after a crash finishes the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.faults import failpoint
from fedunlearn.requests.batch import BatchRecord, BatchStatus, QuarantineNote, Triage, load_records
from fedunlearn.requests.erasure import Fingerprints
from tasks.backup import sync_state
from tasks.progress import owed_batch
from tasks.requests import (append_ledger, capture_fingerprints, close_batch, collect_inbox, file_applied_requests,
                            open_batch, purge_cache, quarantine_requests, recover_interrupted_batches,
                            reproduce_versions, validate_requests, verify_erasure)
from stores.workspace import Workspace


@dataclass
class Intake:
    """What intake found: the batch to work on (None: nothing pending), whether an earlier run owed
    it, the batches of other scenarios it finished, and how the inbox was sorted."""

    batch: BatchRecord | None = None
    owed: bool = False
    resumed: list[BatchRecord] = field(default_factory=list)
    inbox: Triage = field(default_factory=Triage)
    already_applied: list[str] = field(default_factory=list)
    quarantined: list[QuarantineNote] = field(default_factory=list)


@dataclass
class Applied:
    record: BatchRecord
    fingerprints: Fingerprints | None  # the deleted rows' bytes, memory only; None if taken by an earlier run


def finish_steps(ws: Workspace, record: BatchRecord) -> Applied:
    """Every ingest step the journal does not record as done, in order."""
    fingerprints = None
    if record.status in (BatchStatus.FORMED, BatchStatus.LEDGER_APPENDED, BatchStatus.VERSIONED):
        fingerprints = capture_fingerprints(ws, record)
    if record.status is BatchStatus.FORMED:
        failpoint("after-ingest")
        record = append_ledger(ws, record)
    if record.status is BatchStatus.LEDGER_APPENDED:
        record = reproduce_versions(ws, record)
    if record.status is BatchStatus.VERSIONED:
        if record.purge_requested and not record.purged:
            record = purge_cache(ws, record, fingerprints)
        record = verify_erasure(ws, record, fingerprints)
    if record.status is BatchStatus.VERIFIED:
        record = close_batch(ws, record)
    sync_state(ws.root, f"batch {record.batch_id}: ledger and new data version")  # with a default DVC remote
    return Applied(record, fingerprints)


@task(name="intake-requests", task_run_name="intake-requests", cache_policy=NO_CACHE)
def intake_requests(root: str, scenario: str, purge: bool = False, take_owed: bool = False) -> Intake:
    """The batch this run works on. ``take_owed`` (process-deletions): a batch of ``scenario`` an
    earlier run left unfinished comes first (``tasks.progress``), and the inbox waits."""
    ws = Workspace.open(root)
    interrupted = recover_interrupted_batches(ws)
    sync_state(ws.root, "the remote was behind this workspace")  # a push an earlier run could not make
    resumed = [finish_steps(ws, r).record for r in interrupted if not (take_owed and r.scenario == scenario)]
    owed = owed_batch(ws, scenario) if take_owed else None
    if owed is not None:
        return Intake(batch=owed, owed=True, resumed=resumed)
    inbox = collect_inbox(ws, scenario)
    already_applied = file_applied_requests(ws, inbox.applied)
    plan = validate_requests(ws, scenario, inbox.pending)
    quarantined = quarantine_requests(ws, inbox.rejected + plan.rejected)
    batch = open_batch(ws, plan, quarantined, purge) if plan.entries else None
    return Intake(batch, False, resumed, inbox, already_applied, quarantined)


@task(name="apply-deletions", task_run_name="apply-deletions", cache_policy=NO_CACHE)
def apply_deletions(root: str, batch_id: str) -> Applied:
    """The batch's ingest steps: ledger, new data version, (purge), erasure check, files filed."""
    ws = Workspace.open(root)
    [record] = [r for r in load_records(ws.folders) if r.batch_id == batch_id]
    return finish_steps(ws, record)
