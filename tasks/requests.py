"""Prefect tasks for deletion requests and the ledger's steps: the inbox (submit, sort, file,
quarantine), the batch journal, the ledger append, the new data version, the batch closed —
thin steps over ``fedunlearn.requests``. Validation is ``tasks.validation``; erasure checks are
``tasks.erasure``."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from fedunlearn.data.store import PARTITIONS_DIR
from fedunlearn.faults import failpoint
from fedunlearn.requests.batch import (BatchPlan, BatchRecord, BatchStatus, QuarantineNote, Rejection, Triage,
                                       VersionChange, load_records, record_path, triage)
from fedunlearn.requests.inbox import InboxItem, file_processed, quarantine, scan_inbox, submit_request
from fedunlearn.requests.integrity import ensure_intact
from fedunlearn.requests.model import DeletionRequestModel, utc_now
from stores.registry import registered_batch_ids
from stores.workspace import ScenarioScope, Workspace


@task(name="submit-requests", cache_policy=NO_CACHE)
def submit_requests(scope: ScenarioScope, requests: list[DeletionRequestModel]) -> list[str]:
    """Write requests given as flow parameters into the inbox: from here on they are files. A request
    naming no scenario gets the scope's."""
    folders = scope.ws.folders
    return [submit_request(folders, r if r.scenario else r.model_copy(update={"scenario": scope.scenario})).name
            for r in requests]


@task(name="recover-interrupted-batches", cache_policy=NO_CACHE)
def recover_interrupted_batches(ws: Workspace) -> list[BatchRecord]:
    """Batches a crash left unfinished (to resume), once the ledger is checked against the batch
    journals: a torn tail only an unfinished append can have left is dropped, anything else stops
    the run (``LedgerDamaged``) before a deletion could be undone."""
    warning = ensure_intact(ws.folders, ws.ledger, lambda: registered_batch_ids(ws.root))  # asked only if it decides
    if warning:
        get_run_logger().warning(warning)
    return [record for record in load_records(ws.folders) if record.status is not BatchStatus.COMPLETE]


def read_inbox(ws: Workspace, scenario: str) -> Triage:
    """The inbox sorted: pending, rejected, already applied, for another scenario, still being written."""
    params = ws.params
    items = scan_inbox(ws.folders, scenario, params.requests.inbox_grace_seconds)
    return triage(items, ws.ledger.by_request(), scenario, list(params.scenarios))


@task(name="collect-inbox", cache_policy=NO_CACHE)
def collect_inbox(ws: Workspace, scenario: str) -> Triage:
    return read_inbox(ws, scenario)


@task(name="file-applied-requests", cache_policy=NO_CACHE)
def file_applied_requests(ws: Workspace, items: list[InboxItem]) -> list[str]:
    """Inbox files whose request is already in the ledger go to processed/, nothing re-applied."""
    folders = ws.folders
    return [file_processed(folders, item).name for item in items]


def _markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


@task(name="quarantine-requests", cache_policy=NO_CACHE)
def quarantine_requests(ws: Workspace, rejections: list[Rejection]) -> list[QuarantineNote]:
    """Move each rejected file to quarantine/ with its reason beside it; one artifact lists them."""
    folders = ws.folders
    notes = [QuarantineNote(file=item.name, request_id=rejection.request_id, reason=rejection.reason,
                            moved_to=ws.relative(quarantine(folders, item, rejection.reason)))
             for rejection in rejections for item in rejection.items]
    if notes:
        create_markdown_artifact(
            key="deletion-quarantine", description="deletion requests rejected by ingest-deletions",
            markdown="## Quarantined deletion requests\n\n" + _markdown_table(
                ["file", "request_id", "reason", "moved to"],
                [[repr(n.file), n.request_id or "-", n.reason, n.moved_to] for n in notes]))
    return notes


def scenarios_sharing_dataset(ws: Workspace, scenario: str) -> list[str]:
    """The scenario and every other scenario of its dataset that this workspace has data for: the
    ledger removes a sample from all of them, so all get a new version (and none keeps the bytes)."""
    dataset = ws.scenario(scenario).dataset
    others = [name for name, cfg in ws.params.scenarios.items()
              if name != scenario and cfg.dataset == dataset
              and ((ws.root / PARTITIONS_DIR / name).is_dir() or _version_or_none(ws, name))]
    return [scenario, *others]


def _version_or_none(ws: Workspace, scenario: str) -> str | None:
    try:
        return ws.data_version(scenario)
    except FileNotFoundError:
        return None


@task(name="open-batch", cache_policy=NO_CACHE)
def open_batch(ws: Workspace, plan: BatchPlan, quarantined: list[QuarantineNote], purge: bool) -> BatchRecord:
    """Write the batch journal before anything changes: from here on a re-run finishes the batch."""
    scenarios = scenarios_sharing_dataset(ws, plan.scenario)
    record = BatchRecord(batch_id=plan.batch_id, scenario=plan.scenario, dataset=plan.dataset, requests=plan.entries,
                         request_files=plan.request_files, quarantined=quarantined, purge_requested=purge,
                         data_versions={s: VersionChange(before=_version_or_none(ws, s)) for s in scenarios})
    return record.save(ws.folders)


@task(name="append-ledger", cache_policy=NO_CACHE)
def append_ledger(ws: Workspace, record: BatchRecord) -> BatchRecord:
    """Append one entry per request (skipping those already there) and fsync."""
    ledger = ws.ledger
    ledger.append(record.requests)
    failpoint("after-ledger-append")
    written = ledger.by_request()
    return record.advance(ws.folders, BatchStatus.LEDGER_APPENDED,
                          requests=[written[e.request_id] for e in record.requests],
                          ledger_appended=[e.request_id for e in record.requests
                                           if written[e.request_id].batch_id == record.batch_id])


@task(name="reproduce-versions", cache_policy=NO_CACHE, retries=1)
def reproduce_versions(ws: Workspace, record: BatchRecord) -> BatchRecord:
    """The DVC stages again (``workspace.reproduce``): they now exclude the ledger IDs, giving each
    scenario a new version."""
    versions = {scenario: VersionChange(before=change.before, after=ws.reproduce(scenario))
                for scenario, change in record.data_versions.items()}
    return record.advance(ws.folders, BatchStatus.VERSIONED, data_versions=versions)


def batch_markdown(ws: Workspace, record: BatchRecord) -> str:
    rows = [[e.request_id, e.kind.value if e.kind else "-", len(e.sample_ids),
             ", ".join(f"{c}: {len(ids)}" for c, ids in e.clients.items()) or "-", len(e.merged_ids)]
            for e in record.requests]
    report = record.erasure
    verdict = ("not run" if report is None else
               f"{'verified' if report.verified else 'NOT verified'}: {report.checked_samples} of "
               f"{report.deleted_samples} deleted samples checked, {len(report.found)} found, "
               f"{report.files_scanned} files scanned in the stores "
               f"{', '.join(s.name for s in report.stores if s.in_scope)}")
    return "\n\n".join([
        f"## Deletion {record.batch_id} ({record.scenario})",
        f"Data version {record.data_version_before} → {record.data_version_after}; "
        f"cache purged: {record.purged}; erasure {verdict}.",
        _markdown_table(["request_id", "kind", "deleted IDs", "per client", "merged"], rows),
        f"Record: `{ws.relative(record_path(ws.folders, record.batch_id))}`"])


@task(name="close-batch", cache_policy=NO_CACHE)
def close_batch(ws: Workspace, record: BatchRecord) -> BatchRecord:
    """The ledger is durable: move the batch's inbox files to processed/ and mark it complete."""
    folders = ws.folders
    ours = set(record.request_files)
    moved = [file_processed(folders, item).name for item in read_inbox(ws, record.scenario).applied
             if item.request.request_id in ours]
    record = record.advance(folders, BatchStatus.COMPLETE, processed_files=record.processed_files + moved,
                            completed_at=utc_now())
    create_markdown_artifact(key="deletion-batch", markdown=batch_markdown(ws, record),
                             description=f"record of {record.batch_id}")
    return record
