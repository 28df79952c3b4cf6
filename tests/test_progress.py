"""Which batch a run owes (``tasks.progress.owed_batch``) when the clock lies: batch IDs and record
times carry the clock's time, and a clock can run ahead (``FEDUNLEARN_NOW``) or be stepped back
(NTP). The last batch is the last one the ledger applied. Plain files and a stand-in for the registry;
no Prefect server, no DVC."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from fedunlearn.receipts import ModelRef, Receipt, write_receipt
from fedunlearn.requests.batch import BatchRecord, BatchStatus, VersionChange, in_journal_order
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.ledger import Ledger, LedgerEntry
from tasks.progress import owed_batch

SCENARIO = "toy-hfl"
NOW = datetime(2026, 5, 1, 12, tzinfo=timezone.utc)


def entry(request_id: str, batch_id: str) -> LedgerEntry:
    return LedgerEntry(request_id=request_id, batch_id=batch_id, scenario=SCENARIO, kind="sample",
                       subject={"sample_ids": [f"id-{request_id}"]}, sample_ids=[f"id-{request_id}"])


def record(batch_id: str, request_id: str, created_at: datetime, before: str, after: str) -> BatchRecord:
    return BatchRecord(batch_id=batch_id, scenario=SCENARIO, dataset="toy", status=BatchStatus.COMPLETE,
                       created_at=created_at, requests=[entry(request_id, batch_id)],
                       data_versions={SCENARIO: VersionChange(before=before, after=after)})


def receipt(batch: BatchRecord) -> Receipt:
    model = ModelRef(version="2", role="unlearned", data_version=batch.data_version_after, run_id="r2")
    return Receipt(batch_id=batch.batch_id, scenario=SCENARIO, request_ids=[e.request_id for e in batch.requests],
                   deleted_samples=1, forgotten_per_client={}, data_version_before=batch.data_version_before,
                   data_version_after=batch.data_version_after, method="puf-special",
                   models={"original": None, "source": None, "unlearned": model, "retrained": None, "current": model},
                   certificate={"method": "puf-special", "guarantee": "empirical only"}, attempts=[], promoted=True,
                   metrics={}, costs={}, batch_record="data/deletion_requests/batches/b.json")


@dataclass
class Version:
    version: str
    tags: dict[str, str] = field(default_factory=dict)


class Registry:
    """The two questions owed_batch asks: versions tagged with a batch, and what each alias is on."""

    def __init__(self, aliases: dict[str, Version], registered_for: str):
        self.aliases, self.registered_for = aliases, registered_for

    def versions(self, scenario: str, **tags: str) -> list:
        # The crashed batch registered its first attempt before it was killed.
        return [Version("3", {"batch_id": self.registered_for})] if tags.get("batch_id") == self.registered_for else []

    def by_alias(self, scenario: str, alias: str):
        return self.aliases.get(alias)


def test_a_crashed_batch_is_owed_although_an_earlier_one_was_dated_a_day_ahead(tmp_path):
    folders = RequestFolders.create(tmp_path)
    ledger = Ledger(tmp_path / "data/ledger/ledger.jsonl")
    ahead = record("batch-20260502T120000Z-aaaaaa", "r1", NOW + timedelta(days=1), "v0", "v1")  # FEDUNLEARN_NOW ahead
    crashed = record("batch-20260501T120000Z-bbbbbb", "r2", NOW, "v1", "v2")  # real clock, killed mid-batch
    for batch in (ahead, crashed):  # the order they ran in: the ledger's
        ledger.append(batch.requests)
        batch.save(folders)
    write_receipt(tmp_path, receipt(ahead))
    ws = SimpleNamespace(root=tmp_path, folders=folders, ledger=ledger, data_version=lambda scenario: "v2",
                         registry=Registry({"current": Version("2", {"data_version": "v1"})}, crashed.batch_id))

    assert [r.batch_id for r in in_journal_order([ahead, crashed], ledger.entries())] == [ahead.batch_id,
                                                                                          crashed.batch_id]
    assert [r.batch_id for r in in_journal_order([crashed, ahead], ledger.entries())] == [ahead.batch_id,
                                                                                          crashed.batch_id]
    # The clock's order would take the batch dated ahead as the last, find its receipt and owe nothing.
    owed = owed_batch.fn(ws, SCENARIO)
    assert owed.batch is not None and owed.batch.batch_id == crashed.batch_id and owed.closes_open is None


def test_a_journaled_batch_not_yet_in_the_ledger_comes_after_every_applied_one():
    applied = record("batch-b", "r1", NOW + timedelta(days=1), "v0", "v1")
    formed = record("batch-a", "r2", NOW, "v1", "v2").model_copy(update={"status": BatchStatus.FORMED})
    assert [r.batch_id for r in in_journal_order([formed, applied], [entry("r1", "batch-b")])] == ["batch-b",
                                                                                                   "batch-a"]
