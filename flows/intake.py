"""The two stages that ``ingest-deletions`` and ``process-deletions`` share, each a task run under
which its steps' task runs nest (a task run's creation and state changes are events, not blocking
calls to the Prefect server):

    intake-requests   ledger checked against the journals ─▶ interrupted batches finished ─▶ the
                      batch an earlier run receipted without its end steps (process: finished first)
                      ─▶ the batch owed by an earlier run (process) — or the inbox: validate (GX +
                      domain rules) ─▶ quarantine invalid ─▶ one batch, journaled
    apply-deletions   ledger append ─▶ DVC stages + commit (new data version) ─▶ optional purge
                      ─▶ erasure check of every store ─▶ the forgetting owed by the dataset's other
                      scenarios recorded (``tasks.siblings``) ─▶ files to processed/ ─▶ with a default
                      DVC remote: data versions + state snapshot pushed (``stores.durable``)

Exactly once: the journal (batch record) is written before the ledger, the ledger skips requests
it already holds, and files move only after the ledger is durable; ``apply_deletions`` runs only
the steps the journal does not record as done, so a re-run after a crash finishes the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.faults import failpoint
from fedunlearn.requests.batch import BatchRecord, BatchStatus, QuarantineNote, Triage
from flows.batch import Applied
from tasks.backup import sync_state
from tasks.debt import close_by_retrain, open_batches
from tasks.erasure import capture_fingerprints, purge_cache, verify_erasure
from tasks.siblings import owe_siblings
from fedunlearn.batch_decisions import Owed
from tasks.progress import Unfinished, owed_batch, owes_model_steps, unfinished_end
from tasks.requests import (append_ledger, close_batch, collect_inbox, file_applied_requests, open_batch,
                            quarantine_requests, recover_interrupted_batches, reproduce_versions)
from tasks.validation import validate_requests
from stores.workspace import ScenarioScope, Workspace


@dataclass
class Intake:
    """What intake found: the batch to work on (None: nothing pending), whether an earlier run owed
    it, the batches of other scenarios it finished, how the inbox was sorted, and the batch an
    earlier run receipted and did not finish (``unfinished``: its end steps come first)."""

    batch: BatchRecord | None = None
    owed: bool = False
    resumed: list[BatchRecord] = field(default_factory=list)
    inbox: Triage = field(default_factory=Triage)
    already_applied: list[str] = field(default_factory=list)
    quarantined: list[QuarantineNote] = field(default_factory=list)
    unfinished: Unfinished | None = None
    retrain_open: bool = False  # the owed batches can only be closed by an exact retrain (``Owed``)


def finish_steps(ws: Workspace, record: BatchRecord) -> Applied:
    """Every ingest step the journal does not record as done, in order."""
    fingerprints, found_clean = None, {}
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
        record = verify_erasure(ws, record, fingerprints, found_clean)
    if record.status is BatchStatus.VERIFIED:
        owe_siblings(ws, record)  # before the record is complete: a re-run records what a crash left out
        record = close_batch(ws, record)
    sync_state(ws.root, f"{record.batch_id}: ledger and new data version")  # with a default DVC remote
    return Applied(record, fingerprints, found_clean)


@task(name="intake-requests", task_run_name="intake-requests", cache_policy=NO_CACHE)
def intake_requests(scope: ScenarioScope, purge: bool = False, take_owed: bool = False) -> Intake:
    """The batch this run works on. ``take_owed`` (process-deletions): a batch of the scenario an
    earlier run left unfinished comes first (``tasks.progress``), and the inbox waits; a batch it
    receipted without finishing is returned too (``unfinished``), for its end steps."""
    ws, scenario = scope.ws, scope.scenario
    interrupted = recover_interrupted_batches(ws)
    sync_state(ws.root, "the remote was behind this workspace")  # a push an earlier run could not make
    resumed = [finish_steps(ws, r).record for r in interrupted
               if not (take_owed and r.scenario == scenario and owes_model_steps(ws, r))]
    unfinished = unfinished_end(ws, scenario) if take_owed else None
    owed = owed_batch(ws, scenario) if take_owed else Owed()
    if owed.closes_open is not None:  # a model on the current data serves: the open batches get their receipts
        close_by_retrain(ws, scenario, ws.registry.alias_ref(scenario, owed.closes_open), "process-deletions",
                         open_batches(ws, scenario))
    if owed.batch is not None or owed.retrain_open:
        return Intake(batch=owed.batch, owed=True, resumed=resumed, unfinished=unfinished,
                      retrain_open=owed.retrain_open)
    inbox = collect_inbox(ws, scenario)
    already_applied = file_applied_requests(ws, inbox.applied)
    plan = validate_requests(ws, scenario, inbox.pending)
    quarantined = quarantine_requests(ws, inbox.rejected + plan.rejected)
    batch = open_batch(ws, plan, quarantined, purge) if plan.entries else None
    return Intake(batch, False, resumed, inbox, already_applied, quarantined, unfinished)


@task(name="apply-deletions", task_run_name="apply-deletions", cache_policy=NO_CACHE)
def apply_deletions(ws: Workspace, record: BatchRecord) -> Applied:
    """The batch's ingest steps: ledger, new data version, (purge), erasure check, files filed."""
    return finish_steps(ws, record)
