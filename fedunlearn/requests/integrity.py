"""The ledger checked against the batch journals and the other stores, and its repair.

The ledger (``ledger.py``) detects damage to itself; what damage MEANS needs the batch records,
which are the journals of the appends, and the stores written only after an append returned
(``evidence``: processed request files, receipts, the data version in ``dvc.lock``, the
registry's ``batch_id`` tags). Each record holds its batch's ledger entries as they were written
(checksum and link included) once its append returned (status past ``formed``):

* a torn last line is the trace of an append that never returned — droppable — only if no
  journaled append is missing from the ledger, no record is damaged, its batch's record exists and
  no other store shows a request applied that the ledger lacks; otherwise it may be a completed
  batch's entry, and dropping it would bring the batch's samples back into the next data version;
* an entry of a journaled append missing from the ledger, an edited line, a broken link, a request
  another store shows applied, a record missing for a ledger entry: the run stops
  (``LedgerDamaged``), names the batch or request and the file, and ``repair`` restores the
  entries exactly from the records — or, when no record holds them, rebuilds them from the
  processed request files (and receipts), chained anew;
* a record that does not read back stops every batch (it may be an unfinished journal);
  ``repair`` rebuilds it from the batch's ledger entries, or sets it aside if the ledger holds
  none of them and no other store shows the batch applied (it never applied a deletion).

Pure: files only, no orchestration.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from fedunlearn.requests.batch import (BatchRecord, BatchRecordDamaged, BatchStatus, VersionChange, read_records,
                                       record_path)
from fedunlearn.requests.catalog import Resolution
from fedunlearn.requests.evidence import AppliedElsewhere, RegistryBatches, applied_elsewhere, processed_requests
from fedunlearn.requests.folders import RequestFolders, fsync_directory
from fedunlearn.requests.ledger import (GENESIS, Ledger, LedgerDamaged, LedgerEntry, LedgerInspection, LedgerProblem,
                                        field_in)
from fedunlearn.requests.model import DeletionRequestModel, RequestError, parse_request

# What ``repair`` resolves a request with when no record holds its entry: the request and the IDs
# the other entries delete → the sample IDs it deleted (``Catalog.resolve`` on the data without them).
Resolver = Callable[[DeletionRequestModel, set[str]], Resolution]


@dataclass
class MissingEntry:
    """An entry a batch record says was appended and the ledger does not hold (intact)."""

    batch_id: str
    entry: LedgerEntry
    batch_status: BatchStatus


@dataclass
class MissingRecord:
    """A batch whose chained entries the ledger holds and whose record file is gone."""

    batch_id: str
    path: Path
    request_ids: list[str]

    def __str__(self) -> str:
        return (f"the record of {self.batch_id} ({self.path}) is missing, though the ledger holds its "
                f"request(s) {', '.join(self.request_ids)}")


@dataclass
class LedgerCheck:
    ledger: Path
    inspection: LedgerInspection
    records: list[BatchRecord]
    damaged_records: list[BatchRecordDamaged]
    missing: list[MissingEntry] = field(default_factory=list)
    elsewhere: list[AppliedElsewhere] = field(default_factory=list)
    missing_records: list[MissingRecord] = field(default_factory=list)
    tail_orphaned: bool = False  # the torn line names a batch that has no record file: its journal is gone

    @property
    def tail_droppable(self) -> bool:
        """The torn tail can only be the trace of an append that never returned."""
        return (bool(self.inspection.torn_tail) and not self.missing and not self.damaged_records
                and not self.elsewhere and not self.tail_orphaned)

    @property
    def blocking(self) -> list[LedgerProblem]:
        """Ledger problems a batch must not run past (a droppable torn tail is not one)."""
        return [p for p in self.inspection.problems if not (p.kind == "torn tail" and self.tail_droppable)]

    @property
    def intact(self) -> bool:
        return not (self.inspection.problems or self.missing or self.damaged_records or self.elsewhere
                    or self.missing_records)

    def lines(self) -> list[str]:
        """What ``fedunlearn ledger verify`` prints."""
        inspection = self.inspection
        out = [f"{self.ledger}: {len(inspection.entries)} entries read back ({inspection.legacy_entries} written "
               f"before entries were chained), head {inspection.head[:16]}…; {len(self.records)} batch records"]
        out += [f"ledger {problem}" for problem in inspection.problems]
        if inspection.torn_tail:
            out.append("the torn tail is " + ("droppable: no completed append is missing (a crash cut off an append "
                                              "that never returned; the next run drops it)" if self.tail_droppable
                                              else f"NOT droppable: {self._kept_because()}"))
        out += [f"missing: request {m.entry.request_id} of {m.batch_id} ({m.batch_status.value}; "
                f"{len(m.entry.sample_ids)} sample IDs) is in the batch record but not in the ledger"
                for m in self.missing]
        out += [f"missing: {evidence}" for evidence in self.elsewhere]
        out += [f"missing batch record: {missing}" for missing in self.missing_records]
        out += [f"damaged batch record: {damage}" for damage in self.damaged_records]
        out.append("intact" if self.intact else "DAMAGED: run `fedunlearn ledger repair`")
        return out

    def _kept_because(self) -> str:
        if self.missing:
            return "a completed batch's entry is missing"
        if self.elsewhere:
            return "another store shows a request applied that the ledger lacks"
        if self.damaged_records:
            return "a batch record is damaged (it may hold the entry)"
        return "the line names a batch whose record is gone"

    def problems(self) -> list[LedgerProblem]:
        """Everything that stops a batch, as ledger problems (line 0: not a line of the file)."""
        found = list(self.blocking)
        found += [LedgerProblem(0, "missing entry", f"request {m.entry.request_id} of {m.batch_id}",
                                m.entry.request_id) for m in self.missing]
        found += [LedgerProblem(0, "missing entry", str(e), e.request_id) for e in self.elsewhere]
        found += [LedgerProblem(0, "missing batch record", str(m)) for m in self.missing_records]
        found += [LedgerProblem(0, "damaged batch record", str(d)) for d in self.damaged_records]
        return found


def check_ledger(folders: RequestFolders, ledger: Ledger, registry_batches: RegistryBatches | None = None
                 ) -> LedgerCheck:
    """The ledger against the batch records and the other stores. ``registry_batches`` (the batch
    IDs of registered versions) is called only when the ledger has a torn tail or a record is
    damaged: then it can decide whether something is dropped."""
    inspection = ledger.inspect()
    records, damaged = read_records(folders)
    present = {e.request_id: e for e in inspection.entries}
    check = LedgerCheck(ledger.path, inspection, records, damaged)
    for record in records:
        if record.status is BatchStatus.FORMED:
            continue  # its append may not have returned: nothing is owed yet
        appended = set(record.ledger_appended)
        for entry in record.requests:
            found = present.get(entry.request_id)
            written = entry.request_id in appended
            if written and (found is None or (entry.checksum and found.checksum != entry.checksum)):
                check.missing.append(MissingEntry(record.batch_id, entry, record.status))
    with_record = {r.batch_id for r in records} | {d.batch_id for d in damaged}
    orphans: dict[str, list[str]] = {}
    for entry in inspection.entries:  # entries written before chaining may predate the records
        if entry.checksum and entry.batch_id and entry.batch_id not in with_record:
            orphans.setdefault(entry.batch_id, []).append(entry.request_id)
    check.missing_records = [MissingRecord(b, record_path(folders, b), ids) for b, ids in orphans.items()]
    tail_batch = field_in(inspection.torn_tail, "batch_id") if inspection.torn_tail else None
    check.tail_orphaned = tail_batch is not None and tail_batch not in with_record
    journaled = {m.entry.request_id for m in check.missing}
    ask = registry_batches if inspection.torn_tail or damaged else None
    # An edited line's request is in the ledger, damaged: reported as such, not as missing.
    known = set(present) | {p.request_id for p in inspection.problems if p.kind == "checksum mismatch"}
    batches = {e.batch_id for e in inspection.entries if e.batch_id}
    check.elsewhere = [e for e in applied_elsewhere(folders, known, batches, records, ask)
                       if e.request_id is None or e.request_id not in journaled]
    return check


def ensure_intact(folders: RequestFolders, ledger: Ledger, registry_batches: RegistryBatches | None = None
                  ) -> str | None:
    """Before a batch, under the batch lock: drop a torn tail that only an unfinished append can
    have left (returns a warning saying so); raise ``LedgerDamaged`` / ``BatchRecordDamaged`` for
    anything else, so that no batch runs on a ledger that lost a deletion."""
    check = check_ledger(folders, ledger, registry_batches)
    problems = check.problems()
    if check.damaged_records and len(problems) == len(check.damaged_records):
        raise check.damaged_records[0]
    if problems:
        batches = sorted({m.batch_id for m in check.missing})
        detail = (f"; entries of {', '.join(batches)} (completed) are missing — their batch records "
                  "hold them" if batches else "")
        raise LedgerDamaged(ledger.path, problems, detail)
    if check.tail_droppable:
        _truncate_tail(ledger.path, len(check.inspection.torn_tail))
        return (f"dropped an incomplete last line of {ledger.path} ({len(check.inspection.torn_tail)} bytes): an "
                "append cut off by a crash, whose batch never recorded it; that batch appends it again")
    return None


def _truncate_tail(path: Path, size: int) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - size)
        os.fsync(handle.fileno())


@dataclass
class RepairReport:
    restored: list[str] = field(default_factory=list)  # request IDs written back from batch records
    rebuilt: dict[str, str] = field(default_factory=dict)  # request ID -> the file its entry was rebuilt from
    dropped_tail: bool = False
    replaced_tail: bool = False  # the torn last line was a completed append, now rebuilt
    rebuilt_records: list[str] = field(default_factory=list)
    set_aside_records: list[str] = field(default_factory=list)
    backup: Path | None = None
    unrepairable: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"restored from batch records: request {r}" for r in self.restored]
        out += [f"rebuilt from {source}: request {r}" for r, source in self.rebuilt.items()]
        out += ["dropped a torn last line (an append that never returned)"] if self.dropped_tail else []
        out += ["replaced the torn last line by the entry rebuilt from the other stores"] if self.replaced_tail else []
        out += [f"rebuilt the record of {b} from its ledger entries" for b in self.rebuilt_records]
        out += [f"set aside the record of {b} (the ledger holds none of its entries: it applied nothing)"
                for b in self.set_aside_records]
        out += [f"previous ledger kept as {self.backup}"] if self.backup else []
        out += [f"NOT repaired: {u}" for u in self.unrepairable]
        return out or ["nothing to repair"]


def repair_ledger(folders: RequestFolders, ledger: Ledger, datasets: dict[str, str],
                  receipts: dict[str, tuple[str | None, str | None]], resolve: Resolver | None = None,
                  registry_batches: RegistryBatches | None = None) -> RepairReport:
    """Restore the ledger and the batch records from each other and the other stores
    (``fedunlearn ledger repair``, under the batch lock). Entries come back exactly from the
    records that journaled them; an entry no record holds is rebuilt from its processed request
    file (``resolve`` gives the IDs it deleted), its batch taken from the receipt that names it.
    For records rebuilt from the ledger: ``datasets`` maps scenarios to their datasets,
    ``receipts`` batch IDs to the data versions (before, after) their receipts record. Never
    drops an entry a journal holds or another store shows applied."""
    report = RepairReport()
    check = check_ledger(folders, ledger, registry_batches)
    if check.inspection.problems or check.missing or check.elsewhere:
        _repair_entries(folders, ledger, check, resolve, report)
        if report.unrepairable:
            return report  # nothing rewritten, no record set aside: each may still hold what is missing
    _repair_records(folders, ledger, datasets, receipts, report)
    return report


def _repair_entries(folders: RequestFolders, ledger: Ledger, check: LedgerCheck, resolve: Resolver | None,
                    report: RepairReport) -> None:
    # Every entry known intact, by checksum: what the ledger still reads back plus the journals' copies.
    mismatched = {p.request_id for p in check.inspection.problems if p.kind == "checksum mismatch"}
    by_checksum = {e.checksum: e for e in check.inspection.entries if e.checksum}
    journaled = {e.request_id: e for r in check.records if r.status is not BatchStatus.FORMED
                 for e in r.requests if e.request_id in r.ledger_appended}
    by_checksum.update({e.checksum: e for e in journaled.values() if e.checksum})
    legacy = [e for e in check.inspection.entries if not e.checksum]
    chain, head, following = list(legacy), GENESIS, {e.prev_hash: e for e in by_checksum.values()}
    while head in following:
        chain.append(following.pop(head))
        head = chain[-1].checksum
    placed = {e.request_id for e in chain}
    for entry in following.values():
        report.unrepairable.append(f"entry of request {entry.request_id} does not link into the chain")
    for request_id in sorted(mismatched - placed):
        report.unrepairable.append(f"the line of request {request_id} was changed and no batch record holds the "
                                   "original: restore data/ledger/ledger.jsonl from a backup")
    unchained = [e for e in journaled.values() if not e.checksum and e.request_id not in placed]
    rebuilt = _rebuild_from_evidence(folders, check, chain + unchained, resolve, report)
    for entry in unchained + rebuilt:  # journaled before entries were chained, or rebuilt: written as new links
        chain.append(entry.chained(head, entry.applied_at or entry.submitted_at))
        head = chain[-1].checksum
    if report.unrepairable:
        return
    before = {e.request_id for e in check.inspection.entries if e.request_id not in mismatched}
    report.restored = [e.request_id for e in chain if e.request_id not in before and e.request_id not in report.rebuilt]
    report.dropped_tail = bool(check.inspection.torn_tail) and check.tail_droppable
    report.replaced_tail = bool(check.inspection.torn_tail) and not check.tail_droppable
    report.backup = ledger.rewrite(chain)


def _rebuild_from_evidence(folders: RequestFolders, check: LedgerCheck, chain: list[LedgerEntry],
                           resolve: Resolver | None, report: RepairReport) -> list[LedgerEntry]:
    """The entries of requests that other stores show applied and no journal holds, rebuilt from
    a batch record's copy or from the processed request file, oldest first, as ``plan_batch``
    formed them: an ID another entry deletes is listed as merged, not deleted twice."""
    placed = {e.request_id for e in chain}
    wanted = {e.request_id: e for e in check.elsewhere if e.request_id and e.request_id not in placed}
    # A sibling's record holds the entries resolved against another scenario's partition: no copy of the ledger's.
    copies = {e.request_id: (r, e) for r in check.records if not r.sibling for e in r.requests if e.request_id in wanted}
    files = {p.request_id: p for p in processed_requests(folders, placed) if p.request_id in wanted}
    requests, rebuilt = [], []
    for request_id, evidence in wanted.items():
        if request_id in copies:
            record, copy = copies[request_id]
            rebuilt.append(copy.model_copy(update={"batch_id": record.batch_id, "checksum": None, "prev_hash": None,
                                                   "applied_at": copy.applied_at or record.created_at}))
            report.rebuilt[request_id] = str(record_path(folders, record.batch_id))
        elif request_id in files:
            requests.append(_parse_processed(files[request_id], evidence, check, report))
        else:
            report.unrepairable.append(f"{evidence}; neither a batch record nor its request file in processed/ "
                                       "holds what it deleted: restore data/ledger/ledger.jsonl and the batch record "
                                       "from a backup (`fedunlearn restore`)")
    deleted = {i for e in chain + rebuilt for i in e.sample_ids}
    for request, source, batch_id, applied_at in sorted(filter(None, requests),
                                                        key=lambda r: (r[0].submitted_at, r[0].request_id)):
        entry = _resolved_entry(request, batch_id, deleted, resolve, report, source)
        if entry is not None:
            rebuilt.append(entry.model_copy(update={"applied_at": applied_at}))
            deleted |= set(entry.sample_ids)
            report.rebuilt[request.request_id] = source
    batches = {e.batch_id for e in chain + rebuilt}
    report.unrepairable += [f"{e}; no receipt, batch record or request file names its requests: restore "
                            "data/ledger/ledger.jsonl and the batch record from a backup (`fedunlearn restore`)"
                            for e in check.elsewhere if e.request_id is None and e.batch_id not in batches]
    return rebuilt


def _parse_processed(processed, evidence: AppliedElsewhere, check: LedgerCheck, report: RepairReport):
    """(request, its file, its batch, when it was applied) from a processed request file; the batch
    is the receipt's, the torn line's or the damaged record's that names the request."""
    receipt = next((e for e in check.elsewhere if e.store == "receipt" and e.request_id == processed.request_id),
                   None)
    tail = check.inspection.torn_tail
    tail_is_it = bool(tail) and field_in(tail, "request_id") == processed.request_id
    batch_id = (receipt.batch_id if receipt else field_in(tail, "batch_id") if tail_is_it else
                next((d.batch_id for d in check.damaged_records if _names(d.path, processed.request_id)), None))
    applied_at = _timestamp(field_in(tail, "applied_at") if tail_is_it else None) or \
        datetime.fromtimestamp(processed.path.stat().st_mtime, timezone.utc)
    scenario = (receipt.scenario if receipt else None) or (field_in(tail, "scenario") if tail_is_it else None)
    try:
        # The defaults ingest gave it, the file time as `submitted_at` included: its deadline is checked
        # against the same submission time as when it was accepted.
        submitted = datetime.fromtimestamp(processed.path.stat().st_mtime, timezone.utc)
        request = parse_request(processed.path.read_bytes(), {"request_id": processed.request_id,
                                                              "submitted_at": submitted,
                                                              **({"scenario": scenario} if scenario else {})})
    except RequestError as err:
        report.unrepairable.append(f"{evidence}; its file does not read back as a request ({err}): restore "
                                   "data/ledger/ledger.jsonl from a backup (`fedunlearn restore`)")
        return None
    return request, str(processed.path), batch_id, applied_at


def _timestamp(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def _names(path: Path, request_id: str) -> bool:
    try:
        return f'"{request_id}"' in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _resolved_entry(request: DeletionRequestModel, batch_id: str | None, deleted: set[str], resolve: Resolver | None,
                    report: RepairReport, source: str) -> LedgerEntry | None:
    """The entry ``plan_batch`` formed for ``request``, given the IDs the other entries delete."""
    if not request.scenario or resolve is None:
        report.unrepairable.append(f"request {request.request_id} ({source}) cannot be resolved to sample IDs "
                                   "here (no scenario named, or no data to resolve it against): restore "
                                   "data/ledger/ledger.jsonl from a backup (`fedunlearn restore`)")
        return None
    resolution = resolve(request, deleted)
    if resolution.problem:
        report.unrepairable.append(f"request {request.request_id} ({source}) no longer resolves: "
                                   f"{resolution.problem}; restore data/ledger/ledger.jsonl from a backup")
        return None
    fresh = [i for i in resolution.sample_ids if i not in deleted]
    return LedgerEntry(request_id=request.request_id, batch_id=batch_id, scenario=request.scenario,
                       kind=request.kind, subject=request.subject, submitted_at=request.submitted_at,
                       sample_ids=fresh, clients={str(c): kept for c, ids in sorted(resolution.clients.items())
                                                  if (kept := [i for i in ids if i not in deleted])},
                       held_out=[i for i in resolution.held_out if i not in deleted],
                       merged_ids=[i for i in resolution.sample_ids if i in deleted])


def _repair_records(folders: RequestFolders, ledger: Ledger, datasets: dict[str, str],
                    receipts: dict[str, tuple[str | None, str | None]], report: RepairReport) -> None:
    """Damaged records rebuilt from their batch's ledger entries (or set aside when the ledger holds
    none: that batch never applied a deletion), and records missing for ledger entries rebuilt."""
    _, damaged = read_records(folders)
    entries = ledger.inspect().entries
    for damage in damaged:
        own = [e for e in entries if e.batch_id == damage.batch_id]
        aside = damage.path.with_name(damage.path.name + ".damaged")
        os.replace(damage.path, aside)
        if own:
            _rebuild_record(folders, damage.batch_id, own, datasets, receipts, aside.name)
            report.rebuilt_records.append(damage.batch_id)
        else:
            report.set_aside_records.append(damage.batch_id)
        fsync_directory(folders.batches)
    records, _ = read_records(folders)
    with_record = {r.batch_id for r in records}
    orphans: dict[str, list[LedgerEntry]] = {}
    for entry in entries:
        if entry.checksum and entry.batch_id and entry.batch_id not in with_record:
            orphans.setdefault(entry.batch_id, []).append(entry)
    for batch_id, own in orphans.items():
        _rebuild_record(folders, batch_id, own, datasets, receipts, None)
        report.rebuilt_records.append(batch_id)


def _rebuild_record(folders: RequestFolders, batch_id: str, own: list[LedgerEntry], datasets: dict[str, str],
                    receipts: dict[str, tuple[str | None, str | None]], recovered_from: str | None) -> None:
    before, after = receipts.get(batch_id, (None, None))
    scenario = own[0].scenario or ""
    # Resumed from the ledger append: the next run reproduces the data version, verifies the
    # erasure and files the requests, all idempotent.
    BatchRecord(batch_id=batch_id, scenario=scenario, dataset=datasets.get(scenario, ""),
                status=BatchStatus.LEDGER_APPENDED, requests=own, ledger_appended=[e.request_id for e in own],
                data_versions={scenario: VersionChange(before=before, after=after)},
                recovered_from=recovered_from or "(none: the record was missing)").save(folders)
