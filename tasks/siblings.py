"""A deletion reaches every model that learnt the data: the unit of deletion is the dataset, the
unit of forgetting the scenario (docs/DESIGN.md §2, "Sibling scenarios").

The ledger removes a sample from every scenario of its dataset: a batch reproduces each of them
(``data_versions``). A sibling scenario whose data held a deleted sample and that has a model
trained on it is owed that forgetting: before the batch's record is complete, each such sibling
gets a record of its own (``BatchRecord.applied_by``), its entries being the batch's resolved
against the sibling's partition, with the requests' deadlines. Nothing else is needed to repay
it: that record is owed like a batch applied by ``fedunlearn ingest`` alone (``tasks.progress``),
so the sibling's ``status`` lists its requests as pending and its ``process`` unlearns it from the
sibling's model on the data before (or, when several are owed and no model fits the first, an
exact retrain closes them all). While it is owed, the next batch's deletions join it, so one
batch of the sibling forgets them all.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.receipts import ModelRef, Receipt, read_receipt, write_receipt
from fedunlearn.requests.batch import BatchRecord, BatchStatus, VersionChange, load_records
from fedunlearn.requests.catalog import Catalog, source_catalog
from fedunlearn.requests.ledger import LedgerEntry
from fedunlearn.requests.model import RequestKind, utc_now
from stores.workspace import Workspace
from tasks.models import SOURCE_ALIASES


def sibling_batch_id(batch_id: str, scenario: str) -> str:
    return f"{batch_id}-{scenario}"


def owing_siblings(ws: Workspace, record: BatchRecord) -> list[str]:
    """The other scenarios of the batch's dataset whose data the batch changed and that have a model
    (a version under ``current``, ``retrained`` or ``original``): those models learnt the samples."""
    changed = [s for s, change in record.data_versions.items()
               if s != record.scenario and change.before and change.after and change.before != change.after]
    return [s for s in changed if any(ws.registry.by_alias(s, alias) is not None for alias in SOURCE_ALIASES)]


def resolved_for(entry: LedgerEntry, batch_id: str, catalog: Catalog, deleted: set[str]) -> LedgerEntry | None:
    """``entry`` as the sibling ``catalog`` holds its samples: the same request, deadline and IDs, the
    sibling's clients and held-out split. A client request is a sample request there (the sibling's
    clients are others); a class request stays one only if no training sample of the class is left
    (``deleted``: every ID the ledger deletes). None when the sibling never held the samples."""
    ids = [i for i in entry.sample_ids if i in catalog.labels]
    if not ids:
        return None
    clients: dict[str, list[str]] = {}
    for i in ids:
        if i in catalog.owners and i not in catalog.held_out:
            clients.setdefault(str(catalog.owners[i]), []).append(i)
    kind, subject = RequestKind.SAMPLE, {"sample_ids": ids}
    if entry.kind is RequestKind.CLASS:
        label = entry.subject.get("label")
        if not any(catalog.labels[i] == label for i in catalog.training_ids() if i not in deleted):
            kind, subject = RequestKind.CLASS, dict(entry.subject)
    return LedgerEntry(request_id=entry.request_id, batch_id=batch_id, scenario=catalog.scenario, kind=kind,
                       subject=subject, sample_ids=ids, clients=dict(sorted(clients.items())),
                       held_out=[i for i in ids if i in catalog.held_out], submitted_at=entry.submitted_at,
                       deadline=entry.deadline, applied_at=entry.applied_at)


def open_sibling(ws: Workspace, scenario: str, before: str) -> BatchRecord | None:
    """The sibling's owed record the next deletions may join: open (no receipt), nothing registered
    for it yet, and ending on the data version they start from."""
    for record in load_records(ws.folders):
        if (record.scenario == scenario and record.sibling and record.data_version_after == before
                and read_receipt(ws.root, record.batch_id) is None
                and not ws.registry.versions(scenario, batch_id=record.batch_id)):
            return record
    return None


@task(name="owe-siblings", cache_policy=NO_CACHE)
def owe_siblings(ws: Workspace, record: BatchRecord) -> list[str]:
    """Each sibling scenario the batch owes forgetting gets it recorded (a new record, or the owed one
    it joins), before the batch's record is complete; a re-run records nothing twice. Returns the
    sibling records written."""
    written = []
    siblings = owing_siblings(ws, record)
    deleted = ws.ledger.deleted_ids() if siblings else set()
    for scenario in siblings:
        known = [r for r in load_records(ws.folders) if r.scenario == scenario and record.batch_id in r.applied_by]
        if known:
            continue
        change = record.data_versions[scenario]
        batch_id = sibling_batch_id(record.batch_id, scenario)
        catalog = source_catalog(scenario, ws.params)
        entries = [e for e in (resolved_for(e, batch_id, catalog, deleted) for e in record.requests) if e]
        if entries:
            written.append(owe(ws, record, scenario, change, entries).batch_id)
    return written


def owe(ws: Workspace, record: BatchRecord, scenario: str, change: VersionChange,
        entries: list[LedgerEntry]) -> BatchRecord:
    """The sibling's owed record, new or joined: complete (the data is already changed), no receipt."""
    joined = open_sibling(ws, scenario, change.before)
    if joined is not None:
        present = {e.request_id for e in joined.requests}
        entries = [e.model_copy(update={"batch_id": joined.batch_id}) for e in entries if e.request_id not in present]
        return joined.model_copy(update={
            "requests": joined.requests + entries, "applied_by": joined.applied_by + [record.batch_id],
            "data_versions": {scenario: VersionChange(before=joined.data_version_before, after=change.after)},
        }).save(ws.folders)
    return BatchRecord(batch_id=entries[0].batch_id, scenario=scenario, dataset=record.dataset,
                       status=BatchStatus.COMPLETE, requests=entries, applied_by=[record.batch_id],
                       data_versions={scenario: change}, erasure=record.erasure,
                       completed_at=utc_now()).save(ws.folders)


def serving_model(ws: Workspace, scenario: str) -> ModelRef | None:
    """The scenario's model a deletion batch would unlearn from: the first of ``current``,
    ``retrained``, ``original`` registered (a model just trained has only ``original``)."""
    return next((ref for alias in SOURCE_ALIASES if (ref := ws.registry.alias_ref(scenario, alias)) is not None), None)


def serving_siblings(ws: Workspace, batch_id: str) -> dict[str, dict]:
    """For a batch's receipt: each sibling scenario it owes forgetting, the record that owes it, the
    version that serves (or served, once that record is receipted) on the deleted samples, and the
    version that forgot them."""
    owed = {}
    for record in load_records(ws.folders):
        if batch_id not in record.applied_by:
            continue
        closed = read_receipt(ws.root, record.batch_id)
        serving = closed.models.get("source") if closed else serving_model(ws, record.scenario)
        forgotten = closed.models.get("current") if closed else None
        owed[record.scenario] = {"owed_by": record.batch_id, "serving": serving.model_dump() if serving else None,
                                 "forgotten_by": forgotten.model_dump() if forgotten else None}
    return owed


def open_siblings(ws: Workspace, dataset: str) -> list[BatchRecord]:
    """The sibling records of ``dataset``'s scenarios that no receipt closes yet: models that still
    serve samples deleted under another scenario."""
    return [r for r in load_records(ws.folders) if r.sibling and r.dataset == dataset
            and read_receipt(ws.root, r.batch_id) is None]


def note_forgotten(ws: Workspace, receipt: Receipt) -> None:
    """A sibling's batch is receipted: the receipts of the batches that applied its deletions name the
    version that forgot them there (``siblings``). Idempotent."""
    for batch_id in receipt.applied_by:
        applier = read_receipt(ws.root, batch_id)
        if applier is not None:
            applier.siblings = {**applier.siblings, **serving_siblings(ws, batch_id)}
            write_receipt(ws.root, applier)
