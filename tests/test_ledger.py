"""The core of exactly-once deletion (no DVC, no Prefect): the idempotent, hash-chained ledger and
its check against the batch journals (a torn tail of a completed batch is damage, not a crash
trace), triage of inbox items, the batch plan that merges duplicates, the batch lock, and a
property test that random request streams never lose or duplicate a sample ID."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedunlearn.requests.batch import (BatchRecord, BatchRecordDamaged, BatchStatus, PendingRequest, load_records,
                                       plan_batch, triage)
from fedunlearn.requests.catalog import Catalog
from fedunlearn.requests.folders import BatchInProgress, RequestFolders, batch_lock
from fedunlearn.requests.inbox import InboxItem
from fedunlearn.requests.integrity import check_ledger, ensure_intact, repair_ledger
from fedunlearn.requests.ledger import GENESIS, Ledger, LedgerDamaged, LedgerEntry, read_deleted_ids
from fedunlearn.requests.model import DeletionRequestModel

IDS = [f"toy-{i:03d}" for i in range(60)]
HELD_OUT = set(IDS[::7])
CATALOG = Catalog(scenario="toy-hfl", dataset="toy", setting="hfl", num_classes=4,
                  labels={sid: i % 4 for i, sid in enumerate(IDS)},
                  owners={sid: i % 3 for i, sid in enumerate(IDS) if sid not in HELD_OUT},
                  held_out=set(HELD_OUT), clients=(0, 1, 2))


def sample_request(ids, request_id=None, **extra) -> DeletionRequestModel:
    fields = {"kind": "sample", "scenario": "toy-hfl", "sample_ids": list(ids), **extra}
    return DeletionRequestModel(**fields, **({"request_id": request_id} if request_id else {}))


def as_items(*requests: DeletionRequestModel) -> list[InboxItem]:
    return [InboxItem(f"{r.request_id}.json", Path("inbox") / f"{r.request_id}.json", request=r) for r in requests]


def entry(request_id: str, ids: list[str]) -> LedgerEntry:
    return LedgerEntry(request_id=request_id, batch_id="b1", scenario="toy-hfl", kind="sample",
                       subject={"sample_ids": ids}, sample_ids=ids)


def test_ledger_appends_each_request_once_chained_and_the_prepare_stage_reads_it(tmp_path):
    ledger = Ledger(tmp_path / "ledger" / "ledger.jsonl")
    first = ledger.append([entry("r1", IDS[:2]), entry("r2", IDS[2:3])])
    again = ledger.append([entry("r1", IDS[:2]), entry("r3", IDS[3:4])])  # a re-run after a crash, plus one new
    assert [e.request_id for e in first] == ["r1", "r2"] and [e.request_id for e in again] == ["r3"]
    lines = [json.loads(line) for line in ledger.path.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == ["r1", "r2", "r3"]
    assert {"request_id", "batch_id", "scenario", "kind", "sample_ids", "clients", "applied_at", "checksum",
            "prev_hash"} <= set(lines[0])
    assert [line["prev_hash"] for line in lines] == [GENESIS, lines[0]["checksum"], lines[1]["checksum"]]
    assert read_deleted_ids(ledger.path) == ledger.deleted_ids() == set(IDS[:4])


def damage(path: Path, edit) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(edit(lines)))


@pytest.mark.parametrize("edit, kind", [
    (lambda lines: [lines[0], lines[1].replace(IDS[2], IDS[9]), lines[2]], "checksum mismatch"),
    (lambda lines: [lines[0], lines[2]], "chain broken"),
    (lambda lines: [lines[0], lines[1], lines[2][:40]], "torn tail"),
    (lambda lines: [lines[0], "{not json\n", lines[2]], "unreadable"),
])
def test_every_kind_of_damage_is_found_and_stops_the_prepare_stage(tmp_path, edit, kind):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append([entry("r1", IDS[:2]), entry("r2", IDS[2:3]), entry("r3", IDS[3:4])])
    damage(ledger.path, edit)
    inspection = ledger.inspect()
    assert [p.kind for p in inspection.problems] == [kind]
    with pytest.raises(LedgerDamaged, match="fedunlearn ledger repair"):
        read_deleted_ids(ledger.path)  # the prepare stage would otherwise reproduce data without a deletion


def journal(folders: RequestFolders, batch_id: str, entries: list[LedgerEntry], status: BatchStatus) -> BatchRecord:
    """A batch record as the ingest steps leave it: after the append it holds the entries as written."""
    return BatchRecord(batch_id=batch_id, scenario="toy-hfl", dataset="toy", status=status, requests=entries,
                       ledger_appended=[e.request_id for e in entries] if status is not BatchStatus.FORMED else []
                       ).save(folders)


def test_a_torn_tail_is_dropped_only_when_its_batch_never_completed_the_append(tmp_path):
    folders = RequestFolders.create(tmp_path)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    done = ledger.append([entry("r1", IDS[:2])])
    journal(folders, "b1", done, BatchStatus.COMPLETE)
    pending = [entry("r2", IDS[2:4])]
    journal(folders, "b2", pending, BatchStatus.FORMED)
    with open(ledger.path, "a") as handle:  # b2's append cut off by a crash: b2's journal never recorded it
        handle.write('{"request_id": "r2", "sample_')
    assert "dropped an incomplete last line" in ensure_intact(folders, ledger)
    assert [e.request_id for e in ledger.entries()] == ["r1"] and ensure_intact(folders, ledger) is None


def test_a_torn_tail_of_a_completed_batch_stops_the_run_and_repair_restores_it(tmp_path):
    folders = RequestFolders.create(tmp_path)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    journal(folders, "b1", ledger.append([entry("r1", IDS[:2])]), BatchStatus.COMPLETE)
    journal(folders, "b2", ledger.append([entry("r2", IDS[2:4])]), BatchStatus.COMPLETE)
    written = ledger.path.read_bytes()
    ledger.path.write_bytes(written[:-30])  # the last line truncated, as a crash mid-append would leave it
    with pytest.raises(LedgerDamaged, match=r"entries of b2 \(completed\) are missing"):
        ensure_intact(folders, ledger)
    assert ledger.path.read_bytes() == written[:-30]  # nothing dropped: dropping would un-delete IDS[2:4]
    check = check_ledger(folders, ledger)
    assert not check.intact and not check.tail_droppable and [m.batch_id for m in check.missing] == ["b2"]

    report = repair_ledger(folders, ledger, {}, {})
    assert report.restored == ["r2"] and report.backup.read_bytes() == written[:-30]
    assert ledger.path.read_bytes() == written  # restored exactly, checksum and link included
    assert check_ledger(folders, ledger).intact and ledger.deleted_ids() == set(IDS[:4])


def test_a_changed_or_removed_entry_is_restored_from_its_batch_record(tmp_path):
    folders = RequestFolders.create(tmp_path)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    for n in range(3):
        journal(folders, f"b{n}", ledger.append([entry(f"r{n}", IDS[2 * n:2 * n + 2])]), BatchStatus.COMPLETE)
    written = ledger.path.read_bytes()
    damage(ledger.path, lambda lines: [lines[0], lines[2]])
    with pytest.raises(LedgerDamaged, match="chain broken"):
        ensure_intact(folders, ledger)
    assert repair_ledger(folders, ledger, {}, {}).restored == ["r1"] and ledger.path.read_bytes() == written
    damage(ledger.path, lambda lines: [lines[0], lines[1].replace(IDS[2], IDS[50]), lines[2]])
    repair_ledger(folders, ledger, {}, {})
    assert ledger.path.read_bytes() == written


def test_a_damaged_batch_record_names_itself_and_repair_rebuilds_or_sets_it_aside(tmp_path):
    folders = RequestFolders.create(tmp_path)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    journal(folders, "b1", ledger.append([entry("r1", IDS[:2])]), BatchStatus.COMPLETE)
    journal(folders, "b9", [entry("r9", IDS[9:10])], BatchStatus.FORMED)
    for name in ("b1", "b9"):
        path = folders.batches / f"{name}.json"
        path.write_text(path.read_text()[:50])
    with pytest.raises(BatchRecordDamaged, match=r"record of b1 .*b1\.json.*fedunlearn ledger repair"):
        load_records(folders)
    report = repair_ledger(folders, ledger, {"toy-hfl": "toy"}, {"b1": ("v0", "v1")})
    assert report.rebuilt_records == ["b1"] and report.set_aside_records == ["b9"]
    [rebuilt] = load_records(folders)
    assert rebuilt.status is BatchStatus.LEDGER_APPENDED and rebuilt.recovered_from == "b1.json.damaged"
    assert rebuilt.data_version_before == "v0" and rebuilt.dataset == "toy"
    assert sorted(p.name for p in folders.batches.iterdir()) == ["b1.json", "b1.json.damaged", "b9.json.damaged"]


def test_triage_files_resubmissions_and_rejects_reused_request_ids():
    applied = {"r1": entry("r1", IDS[:2])}
    same = sample_request(IDS[:2], "r1")
    reused = sample_request(IDS[5:6], "r1")
    other_scenario = sample_request(IDS[6:7], "r2", scenario="toy-vfl")
    twice = sample_request(IDS[7:8], "r3")
    clash = sample_request(IDS[8:9], "r3")
    typo = sample_request(IDS[9:10], "r4", scenario="toy-hlf")
    items = as_items(same, reused, other_scenario, twice, twice, clash, typo)
    result = triage(items, applied, "toy-hfl", ["toy-hfl", "toy-vfl"])
    assert result.applied == [items[0]] and result.elsewhere == [items[2]]
    assert [p.request.request_id for p in result.pending] == ["r3"] and result.pending[0].items == items[3:5]
    reasons = {r.items[0].name: r.reason for r in result.rejected}
    assert "already applied in batch b1 to another subject" in reasons[items[1].name]
    assert "also used by r3.json for another subject" in reasons[items[5].name]
    assert reasons[items[6].name] == "unknown scenario 'toy-hlf'; params.yaml defines toy-hfl, toy-vfl"


def test_the_plan_merges_ids_named_twice_and_groups_them_per_client():
    older = sample_request(IDS[1:5], submitted_at="2025-01-01T00:00:00Z")
    newer = sample_request(IDS[3:8], submitted_at="2025-01-02T00:00:00Z")
    plan = plan_batch("b1", [PendingRequest(r, as_items(r)) for r in (newer, older)], CATALOG)
    first, second = plan.entries
    assert first.request_id == older.request_id and first.sample_ids == IDS[1:5]
    assert second.sample_ids == IDS[5:8] and second.merged_ids == IDS[3:5]
    assert second.clients == {"0": ["toy-006"], "2": ["toy-005"]} and second.held_out == ["toy-007"]


def test_a_second_batch_waits_for_the_lock_then_says_so(tmp_path):
    folders = RequestFolders.create(tmp_path)
    with batch_lock(folders):
        with pytest.raises(BatchInProgress, match="another deletion batch is running .* wait for it to finish"):
            with batch_lock(folders, timeout=0.2):
                pass
    with batch_lock(folders, timeout=0.2):  # released: the next batch goes ahead
        pass


requests = st.one_of(
    st.builds(lambda ids: sample_request(ids), st.lists(st.sampled_from(IDS), min_size=1, max_size=8)),
    st.builds(lambda label: DeletionRequestModel(kind="class", scenario="toy-hfl", label=label), st.integers(0, 3)),
    st.builds(lambda c: DeletionRequestModel(kind="client", scenario="toy-hfl", client=c), st.integers(0, 2)))


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_random_request_streams_never_lose_or_duplicate_an_id(data):
    """Batches of random requests, re-submissions and crash re-runs (the same plan appended twice):
    every inbox item is filed exactly once, every applied request deletes all it resolved to, and
    no ID or request appears twice in the ledger."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp) / "ledger.jsonl")
        submitted: list[DeletionRequestModel] = []
        for batch in range(data.draw(st.integers(1, 4), label="batches")):
            new = data.draw(st.lists(requests, max_size=6), label="new requests")
            again = data.draw(st.lists(st.sampled_from(submitted), max_size=3), label="again") if submitted else []
            submitted += new
            live = CATALOG.without(ledger.deleted_ids())
            items = as_items(*new, *again)
            sorted_out = triage(items, ledger.by_request(), "toy-hfl", ["toy-hfl"])
            plan = plan_batch(f"b{batch}", sorted_out.pending, live)
            ledger.append(plan.entries)
            if data.draw(st.booleans(), label="crash and re-run"):
                assert ledger.append(plan.entries) == []

            filed = ([id(i) for i in sorted_out.applied] + [id(i) for r in sorted_out.rejected for i in r.items]
                     + [id(i) for r in plan.rejected for i in r.items]
                     + [id(i) for p in sorted_out.pending if p.request.request_id in plan.request_files
                        for i in p.items])
            assert sorted(filed) == sorted(id(i) for i in items)
            for planned in plan.entries:
                request = next(p.request for p in sorted_out.pending if p.request.request_id == planned.request_id)
                resolved = set(live.resolve(request).sample_ids)
                assert set(planned.sample_ids) | set(planned.merged_ids) == resolved
                assert resolved <= ledger.deleted_ids()
            for rejection in plan.rejected:
                assert live.resolve(next(p.request for p in sorted_out.pending
                                         if p.request.request_id == rejection.request_id)).problem

        entries = ledger.entries()
        all_ids = [i for e in entries for i in e.sample_ids]
        assert len(all_ids) == len(set(all_ids)) and set(all_ids) <= set(IDS)
        assert len({e.request_id for e in entries}) == len(entries)
