"""From inbox to batch: triage of inbox items, the batch plan (one ledger entry per request,
duplicates merged), and the batch record, which is also the journal a re-run resumes from.

A batch moves through its statuses in order, and the record is saved (durably) after each:

    formed ─▶ ledger_appended ─▶ versioned ─▶ verified ─▶ complete
    (journal   (ledger fsynced)   (new data    (erasure    (inbox files moved
     written)                      version)     checked)    to processed/)

After the model steps and the receipt, ``finished_at`` records that the batch's end steps are done
(``flows.finish``): until it is set, a re-run completes them.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, computed_field

from fedunlearn.errors import StateDamaged
from fedunlearn.federation.local import Tensors
from fedunlearn.requests.catalog import Catalog
from fedunlearn.requests.erasure import ErasureReport
from fedunlearn.requests.folders import RequestFolders, write_json_atomic
from fedunlearn.requests.inbox import InboxItem
from fedunlearn.requests.ledger import LedgerEntry
from fedunlearn.requests.model import DeletionRequestModel, timestamped_id, utc_now
from fedunlearn.unlearning.base import ForgetSet


def new_batch_id() -> str:
    return timestamped_id("batch", hex_chars=6)


@dataclass
class PendingRequest:
    """A valid-looking request and its inbox file(s): identical re-submissions merge here."""

    request: DeletionRequestModel
    items: list[InboxItem]


@dataclass
class Rejection:
    items: list[InboxItem]
    reason: str
    request_id: str | None = None


@dataclass
class Triage:
    pending: list[PendingRequest] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    applied: list[InboxItem] = field(default_factory=list)  # already in the ledger: file only
    elsewhere: list[InboxItem] = field(default_factory=list)  # for another scenario: left pending
    waiting: list[InboxItem] = field(default_factory=list)  # still being written: left for the next run


def triage(items: list[InboxItem], applied: dict[str, LedgerEntry], scenario: str,
           known_scenarios: Collection[str]) -> Triage:
    """Sort inbox items: unreadable → rejected; request already in the ledger → applied (or
    rejected if the ID was reused for another subject); another known scenario → left for its
    own ingest; an unknown scenario → rejected; the rest pending, files of one request merged."""
    result = Triage()
    pending: dict[str, PendingRequest] = {}
    for item in items:
        request = item.request
        if item.waiting:
            result.waiting.append(item)
        elif request is None:
            result.rejected.append(Rejection([item], item.problem or "unreadable request"))
        elif request.request_id in applied:
            entry = applied[request.request_id]
            if entry.matches(request):
                result.applied.append(item)
            else:
                result.rejected.append(Rejection(
                    [item], f"request_id {request.request_id} was already applied in batch {entry.batch_id} to "
                            "another subject; submit this request under a new request_id", request.request_id))
        elif request.scenario not in known_scenarios:
            result.rejected.append(Rejection(
                [item], f"unknown scenario {request.scenario!r}; params.yaml defines {', '.join(known_scenarios)}",
                request.request_id))
        elif request.scenario != scenario:
            result.elsewhere.append(item)
        elif request.request_id in pending:
            first = pending[request.request_id]
            if first.request.same_subject(request):
                first.items.append(item)
            else:
                result.rejected.append(Rejection(
                    [item], f"request_id {request.request_id} is also used by {first.items[0].name} for another "
                            "subject; give each request its own request_id", request.request_id))
        else:
            pending[request.request_id] = PendingRequest(request, [item])
    result.pending = list(pending.values())
    return result


@dataclass
class BatchPlan:
    batch_id: str
    scenario: str
    dataset: str
    entries: list[LedgerEntry]
    request_files: dict[str, list[str]]
    rejected: list[Rejection]


def plan_batch(batch_id: str, pending: list[PendingRequest], catalog: Catalog) -> BatchPlan:
    """One ledger entry per resolvable request, oldest first. An ID named by several requests is
    deleted by the first and listed as merged in the others, so no ID is applied twice."""
    plan = BatchPlan(batch_id, catalog.scenario, catalog.dataset, [], {}, [])
    covered: set[str] = set()
    for waiting in sorted(pending, key=lambda p: (p.request.submitted_at, p.request.request_id)):
        request = waiting.request
        resolution = catalog.resolve(request)
        if resolution.problem:
            plan.rejected.append(Rejection(waiting.items, resolution.problem, request.request_id))
            continue
        fresh = set(resolution.sample_ids) - covered
        covered |= fresh
        plan.entries.append(LedgerEntry(
            request_id=request.request_id, batch_id=batch_id, scenario=catalog.scenario, kind=request.kind,
            subject=request.subject, submitted_at=request.submitted_at, deadline=request.deadline,
            sample_ids=[i for i in resolution.sample_ids if i in fresh],
            clients={str(c): kept for c, ids in sorted(resolution.clients.items())
                     if (kept := [i for i in ids if i in fresh])},
            held_out=[i for i in resolution.held_out if i in fresh],
            merged_ids=[i for i in resolution.sample_ids if i not in fresh]))
        plan.request_files[request.request_id] = [file.name for file in waiting.items]
    return plan


class BatchStatus(str, Enum):
    FORMED = "formed"
    LEDGER_APPENDED = "ledger_appended"
    VERSIONED = "versioned"
    VERIFIED = "verified"
    COMPLETE = "complete"


class VersionChange(BaseModel):
    before: str | None = None
    after: str | None = None


class QuarantineNote(BaseModel):
    file: str
    request_id: str | None = None
    reason: str
    moved_to: str


class BatchRecord(BaseModel):
    """``data/deletion_requests/batches/<batch_id>.json``: what the batch did, and how far."""

    batch_id: str
    scenario: str
    dataset: str
    status: BatchStatus = BatchStatus.FORMED
    created_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)
    completed_at: datetime | None = None
    requests: list[LedgerEntry] = Field(description="the ledger entries of this batch, one per request")
    request_files: dict[str, list[str]] = Field(default_factory=dict, description="request_id -> inbox files")
    quarantined: list[QuarantineNote] = Field(default_factory=list)
    data_versions: dict[str, VersionChange] = Field(
        default_factory=dict, description="every reproduced scenario: the batch's own and others of its dataset")
    ledger_appended: list[str] = Field(default_factory=list, description="request IDs this batch wrote to the "
                                                                         "ledger (a resumed run skips present ones)")
    purge_requested: bool = False
    purged: bool = False
    erasure: ErasureReport | None = None
    processed_files: list[str] = Field(default_factory=list)
    recovered_from: str | None = Field(None, description="rebuilt by `fedunlearn ledger repair` from the ledger; "
                                                         "the damaged file was set aside under this name")
    applied_by: list[str] = Field(default_factory=list, description="a sibling's owed forgetting: the batches that "
                                  "applied these deletions under another scenario of the same dataset. This "
                                  "scenario's models learnt the samples too, so it owes their forgetting; its "
                                  "entries are those batches' ledger entries resolved against this scenario's "
                                  "partition, not a journal of ledger appends (``ledger_appended`` stays empty)")
    finished_at: datetime | None = Field(None, description="when the batch's end steps were all done, after its "
                                         "receipt: log leaves and signed head published, repaid receipts marked, the "
                                         "retrain debt settled or scheduled, the status published. Until then a "
                                         "re-run completes them (``tasks.progress.unfinished_end``)")

    @computed_field
    @property
    def data_version_before(self) -> str | None:
        return self.data_versions[self.scenario].before if self.scenario in self.data_versions else None

    @computed_field
    @property
    def data_version_after(self) -> str | None:
        return self.data_versions[self.scenario].after if self.scenario in self.data_versions else None

    @property
    def sibling(self) -> bool:
        """The forgetting this scenario owes for deletions another scenario's batch applied (``applied_by``)."""
        return bool(self.applied_by)

    def deleted_ids(self) -> set[str]:
        return {i for entry in self.requests for i in entry.sample_ids}

    def deadlines(self, deadline_days: float) -> dict[str, datetime]:
        """Each request's deadline (``LedgerEntry.due``)."""
        return {e.request_id: e.due(deadline_days, self.created_at) for e in self.requests}

    @property
    def kind(self) -> str:
        """The requests' kind when they share one (methods treat whole clients and classes
        specially), else ``sample``."""
        kinds = {entry.kind.value if entry.kind else "sample" for entry in self.requests}
        return kinds.pop() if len(kinds) == 1 else "sample"

    def forget_set(self, clients: Sequence[Tensors]) -> ForgetSet | None:
        """The training samples the batch deletes, per client index of ``clients`` (the data before
        the batch) — the typed batch the methods take. None when it deletes only held-out test
        samples: no model was trained on those, so there is nothing to unlearn."""
        held_out = {i for entry in self.requests for i in entry.held_out}
        trained = [i for entry in self.requests for i in entry.sample_ids if i not in held_out]
        if not trained:
            return None
        located = ForgetSet.for_sample_ids(trained, clients, batch_id=self.batch_id)
        labels = sorted({e.subject["label"] for e in self.requests}) if self.kind == "class" else None
        return ForgetSet(self.kind, located.forget_ids,
                             clients=located.affected_clients if self.kind == "client" else None, labels=labels,
                             batch_id=self.batch_id)

    def save(self, folders: RequestFolders) -> "BatchRecord":
        self.updated_at = utc_now()
        write_json_atomic(record_path(folders, self.batch_id), self.model_dump(mode="json"))
        return self

    def advance(self, folders: RequestFolders, status: BatchStatus, **changes) -> "BatchRecord":
        """Record a finished step durably; the next run resumes after it."""
        return self.model_copy(update={"status": status, **changes}).save(folders)


def record_path(folders: RequestFolders, batch_id: str) -> Path:
    return folders.batches / f"{batch_id}.json"


class BatchRecordDamaged(StateDamaged):
    """A batch record (also the batch's journal) does not read back."""

    def __init__(self, path: Path, cause: str):
        self.path, self.batch_id = path, path.name.removesuffix(".json")
        super().__init__(f"the record of {self.batch_id} ({path}) cannot be read: {cause}. Every later "
                         "batch waits for it, since it may be the journal of an unfinished batch. Run `fedunlearn "
                         "ledger repair`: it rebuilds the record from the batch's ledger entries (and its receipt) "
                         "when "
                         "the ledger holds them, and otherwise sets the file aside, since the batch never applied a "
                         "deletion; or restore the file from a backup")


def read_records(folders: RequestFolders) -> tuple[list[BatchRecord], list[BatchRecordDamaged]]:
    """All readable batch records, oldest first, and one error per record that does not read back."""
    records, damaged = [], []
    for path in sorted(folders.batches.glob("*.json")):
        try:
            # json, not pydantic's parser: a quarantined file's undecodable name is kept as a lone
            # surrogate, which JSON escapes and Python reads back but pydantic's JSON parser refuses.
            records.append(BatchRecord.model_validate(json.loads(path.read_bytes())))
        except json.JSONDecodeError as err:
            damaged.append(BatchRecordDamaged(path, f"not JSON ({err.msg} at line {err.lineno} column {err.colno})"))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the file"
            damaged.append(BatchRecordDamaged(path, f"{first['msg']} at {where}"))
    return sorted(records, key=lambda r: r.created_at), damaged


def in_journal_order(records: Sequence[BatchRecord], ledger: Sequence[LedgerEntry]) -> list[BatchRecord]:
    """``records`` in the order their batches were applied: by where their requests stand in the
    append-only, hash-chained ledger. Batch IDs and ``created_at`` carry the clock's time, and a clock
    can run ahead (``FEDUNLEARN_NOW``) or be stepped back (NTP): the batch dated latest need not be the
    last applied. Records whose requests the ledger does not hold yet (journaled, not appended) come
    after, oldest first."""
    position = {entry.request_id: index for index, entry in enumerate(ledger)}

    def first_entry(record: BatchRecord) -> int | None:
        return min((position[e.request_id] for e in record.requests if e.request_id in position), default=None)

    placed = [(first_entry(record), record) for record in records]
    appended = sorted(((at, record) for at, record in placed if at is not None), key=lambda pair: pair[0])
    return [record for _, record in appended] + [record for at, record in placed if at is None]


def load_records(folders: RequestFolders) -> list[BatchRecord]:
    """All batch records, oldest first; a damaged one raises ``BatchRecordDamaged``."""
    records, damaged = read_records(folders)
    if damaged:
        raise damaged[0]
    return records
