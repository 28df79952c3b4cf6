"""The ledger checked against the batch journals, and its repair.

The ledger (``ledger.py``) detects damage to itself; what damage MEANS needs the batch records,
which are the journals of the appends. Each record holds its batch's ledger entries as they were
written (checksum and link included) once its append returned (status past ``formed``):

* a torn last line is the trace of an append that never returned — droppable — only if no
  journaled append is missing from the ledger; otherwise it is a completed batch's entry, and
  dropping it would bring the batch's samples back into the next data version;
* an entry of a journaled append missing from the ledger, an edited line, a broken link: the
  run stops (``LedgerDamaged``), names the batch, and ``repair`` restores the entries exactly
  from the records;
* a record that does not read back stops every batch (it may be an unfinished journal);
  ``repair`` rebuilds it from the batch's ledger entries, or sets it aside if the ledger holds
  none of them (that batch never applied a deletion).

Pure: files only, no orchestration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fedunlearn.requests.batch import BatchRecord, BatchRecordDamaged, BatchStatus, VersionChange, read_records
from fedunlearn.requests.folders import RequestFolders, fsync_directory
from fedunlearn.requests.ledger import GENESIS, Ledger, LedgerDamaged, LedgerEntry, LedgerInspection, LedgerProblem


@dataclass
class MissingEntry:
    """An entry a batch record says was appended and the ledger does not hold (intact)."""

    batch_id: str
    entry: LedgerEntry
    batch_status: BatchStatus


@dataclass
class LedgerCheck:
    ledger: Path
    inspection: LedgerInspection
    records: list[BatchRecord]
    damaged_records: list[BatchRecordDamaged]
    missing: list[MissingEntry] = field(default_factory=list)

    @property
    def tail_droppable(self) -> bool:
        """The torn tail can only be the trace of an append that never returned."""
        return bool(self.inspection.torn_tail) and not self.missing and not self.damaged_records

    @property
    def blocking(self) -> list[LedgerProblem]:
        """Ledger problems a batch must not run past (a droppable torn tail is not one)."""
        return [p for p in self.inspection.problems if not (p.kind == "torn tail" and self.tail_droppable)]

    @property
    def intact(self) -> bool:
        return not self.inspection.problems and not self.missing and not self.damaged_records

    def lines(self) -> list[str]:
        """What ``fedunlearn ledger verify`` prints."""
        inspection = self.inspection
        out = [f"{self.ledger}: {len(inspection.entries)} entries read back ({inspection.legacy_entries} written "
               f"before entries were chained), head {inspection.head[:16]}…; {len(self.records)} batch records"]
        out += [f"ledger {problem}" for problem in inspection.problems]
        if inspection.torn_tail:
            out.append("the torn tail is " + ("droppable: no completed append is missing (a crash cut off an append "
                                              "that never returned; the next run drops it)" if self.tail_droppable
                                              else "NOT droppable: a completed batch's entry is missing"))
        out += [f"missing: request {m.entry.request_id} of batch {m.batch_id} ({m.batch_status.value}; "
                f"{len(m.entry.sample_ids)} sample IDs) is in the batch record but not in the ledger"
                for m in self.missing]
        out += [f"damaged batch record: {damage}" for damage in self.damaged_records]
        out.append("intact" if self.intact else "DAMAGED: run `fedunlearn ledger repair`")
        return out


def check_ledger(folders: RequestFolders, ledger: Ledger) -> LedgerCheck:
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
    return check


def ensure_intact(folders: RequestFolders, ledger: Ledger) -> str | None:
    """Before a batch, under the batch lock: drop a torn tail that only an unfinished append can
    have left (returns a warning saying so); raise ``LedgerDamaged`` / ``BatchRecordDamaged`` for
    anything else, so that no batch runs on a ledger that lost a deletion."""
    check = check_ledger(folders, ledger)
    if check.damaged_records:
        raise check.damaged_records[0]
    if check.blocking or check.missing:
        batches = sorted({m.batch_id for m in check.missing})
        detail = (f"; entries of completed batch(es) {', '.join(batches)} are missing — their batch records "
                  "hold them" if batches else "")
        raise LedgerDamaged(ledger.path, check.blocking + [LedgerProblem(0, "missing entry", f"request "
                                                                         f"{m.entry.request_id} of batch {m.batch_id}",
                                                                         m.entry.request_id) for m in check.missing],
                            detail)
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
    dropped_tail: bool = False
    rebuilt_records: list[str] = field(default_factory=list)
    set_aside_records: list[str] = field(default_factory=list)
    backup: Path | None = None
    unrepairable: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"restored from batch records: request {r}" for r in self.restored]
        out += ["dropped a torn last line (an append that never returned)"] if self.dropped_tail else []
        out += [f"rebuilt batch record {b} from its ledger entries" for b in self.rebuilt_records]
        out += [f"set aside batch record {b} (the ledger holds none of its entries: it applied nothing)"
                for b in self.set_aside_records]
        out += [f"previous ledger kept as {self.backup}"] if self.backup else []
        out += [f"NOT repaired: {u}" for u in self.unrepairable]
        return out or ["nothing to repair"]


def repair_ledger(folders: RequestFolders, ledger: Ledger, datasets: dict[str, str],
                  receipts: dict[str, tuple[str | None, str | None]]) -> RepairReport:
    """Restore the ledger and the batch records from each other (``fedunlearn ledger repair``,
    under the batch lock). For records rebuilt from the ledger: ``datasets`` maps scenarios to
    their datasets, ``receipts`` batch IDs to the data versions (before, after) their receipts
    record. Never drops an entry a journal holds."""
    report = RepairReport()
    _repair_records(folders, ledger, datasets, receipts, report)
    check = check_ledger(folders, ledger)
    if not check.inspection.problems and not check.missing:
        return report
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
    for entry in unchained:  # journaled before entries were chained: written back as new links
        chain.append(entry.chained(head, entry.applied_at or entry.submitted_at))
        head = chain[-1].checksum
    if report.unrepairable:
        return report
    before = {e.request_id for e in check.inspection.entries if e.request_id not in mismatched}
    report.restored = [e.request_id for e in chain if e.request_id not in before]
    report.dropped_tail = bool(check.inspection.torn_tail)
    report.backup = ledger.rewrite(chain)
    return report


def _repair_records(folders: RequestFolders, ledger: Ledger, datasets: dict[str, str],
                    receipts: dict[str, tuple[str | None, str | None]], report: RepairReport) -> None:
    _, damaged = read_records(folders)
    if not damaged:
        return
    entries = ledger.inspect().entries
    for damage in damaged:
        own = [e for e in entries if e.batch_id == damage.batch_id]
        aside = damage.path.with_name(damage.path.name + ".damaged")
        os.replace(damage.path, aside)
        if own:
            before, after = receipts.get(damage.batch_id, (None, None))
            scenario = own[0].scenario or ""
            # Resumed from the ledger append: the next run reproduces the data version, verifies the
            # erasure and files the requests, all idempotent.
            BatchRecord(batch_id=damage.batch_id, scenario=scenario, dataset=datasets.get(scenario, ""),
                        status=BatchStatus.LEDGER_APPENDED,
                        requests=own, ledger_appended=[e.request_id for e in own],
                        data_versions={scenario: VersionChange(before=before, after=after)},
                        recovered_from=aside.name).save(folders)
            report.rebuilt_records.append(damage.batch_id)
        else:
            report.set_aside_records.append(damage.batch_id)
        fsync_directory(folders.batches)
