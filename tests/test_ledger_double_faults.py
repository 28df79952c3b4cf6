"""Issue 26, item 1: a torn or missing ledger entry is dropped only when no store shows its request
applied. The core (no DVC, no Prefect): a torn last line together with a damaged or deleted batch
record, a record deleted under an intact ledger, and each other store's evidence (processed request
files, receipts, the data version in dvc.lock, the registry's batch tags) — each stops the run
naming the request, the file and `fedunlearn ledger repair`, and the repair rebuilds the entry
(hash chain included) instead of dropping it."""

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from fedunlearn.requests.batch import BatchStatus, VersionChange, load_records
from fedunlearn.requests.folders import RECEIPTS_DIR, RequestFolders
from fedunlearn.requests.integrity import check_ledger, ensure_intact, repair_ledger
from fedunlearn.requests.ledger import GENESIS, Ledger, LedgerDamaged, LedgerEntry, content_checksum
from tests.test_ledger import CATALOG, IDS, journal, sample_request


def resolve(request, deleted):
    return CATALOG.without(deleted).resolve(request)


def planned(request_id: str, batch_id: str, ids: list[str], submitted_at: str) -> tuple[LedgerEntry, object]:
    """The entry ``plan_batch`` forms for a sample request, and the request (as its file holds it)."""
    request = sample_request(ids, request_id, submitted_at=submitted_at)
    resolution = CATALOG.resolve(request)
    entry = LedgerEntry(request_id=request_id, batch_id=batch_id, scenario="toy-hfl", kind="sample",
                        subject=request.subject, submitted_at=request.submitted_at, sample_ids=list(ids),
                        clients={str(c): i for c, i in sorted(resolution.clients.items())},
                        held_out=resolution.held_out)
    return entry, request


def two_completed_batches(tmp_path: Path, receipt: bool = True):
    """Batches b1 (r1) and b2 (r2) applied and filed: ledger, records, processed files and, when
    ``receipt``, b2's receipt — the stores as ``ingest`` (and ``process``) leave them."""
    folders = RequestFolders.create(tmp_path)
    ledger = Ledger(tmp_path / "data/ledger/ledger.jsonl")
    for n, (batch, ids) in enumerate((("b1", IDS[:3]), ("b2", IDS[10:13]))):
        entry, request = planned(f"r{n + 1}", batch, ids, f"2025-01-0{n + 1}T00:00:00Z")
        journal(folders, batch, ledger.append([entry]), BatchStatus.COMPLETE)
        (folders.processed / f"{request.request_id}.json").write_text(request.to_json())
    if receipt:
        (tmp_path / RECEIPTS_DIR).mkdir(parents=True)
        (tmp_path / RECEIPTS_DIR / "b2.json").write_text(json.dumps({"batch_id": "b2", "scenario": "toy-hfl",
                                                                      "request_ids": ["r2"]}))
    return folders, ledger, ledger.path.read_bytes()


def assert_rebuilt(folders: RequestFolders, ledger: Ledger, written: bytes) -> None:
    """r2's entry is back, deleting what it deleted, in a chain that verifies, and b2 has a record."""
    entries = ledger.entries()
    assert [e.request_id for e in entries] == ["r1", "r2"] and entries[1].batch_id == "b2"
    assert entries[1].sample_ids == IDS[10:13] and ledger.deleted_ids() == set(IDS[:3]) | set(IDS[10:13])
    assert entries[1].prev_hash == entries[0].checksum == json.loads(written.splitlines()[0])["checksum"]
    assert entries[1].checksum == content_checksum(entries[1].document())
    assert entries[1].clients == json.loads(written.splitlines()[1])["clients"]
    assert check_ledger(folders, ledger).intact
    assert {r.batch_id: r.requests[0].request_id for r in load_records(folders)}["b2"] == "r2"


def stops_naming(folders, ledger, *names: str) -> None:
    before = ledger.path.read_bytes()
    with pytest.raises(LedgerDamaged) as raised:
        ensure_intact(folders, ledger)
    for name in (*names, "fedunlearn ledger repair"):
        assert name in str(raised.value)
    assert ledger.path.read_bytes() == before  # nothing dropped


def test_a_torn_line_and_a_truncated_record_stop_the_run_and_repair_rebuilds_the_entry(tmp_path):
    folders, ledger, written = two_completed_batches(tmp_path)
    ledger.path.write_bytes(written[:-30])
    record = folders.batches / "b2.json"
    record.write_text(record.read_text()[:60])
    check = check_ledger(folders, ledger)
    assert not check.tail_droppable and "NOT droppable" in "\n".join(check.lines())
    stops_naming(folders, ledger, "request r2", str(folders.processed / "r2.json"), "b2.json")

    report = repair_ledger(folders, ledger, {"toy-hfl": "toy"}, {}, resolve)
    assert report.rebuilt == {"r2": str(folders.processed / "r2.json")} and not report.dropped_tail
    assert report.rebuilt_records == ["b2"] and not report.set_aside_records
    assert_rebuilt(folders, ledger, written)


def test_a_file_without_submitted_at_is_rebuilt_against_its_file_time_so_a_passed_deadline_still_reads(tmp_path):
    """Ingest took the file time as `submitted_at` of a file without one; repair checks the deadline
    against the same time, not against the time of the repair (which a passed deadline precedes)."""
    folders, ledger, written = two_completed_batches(tmp_path)
    ledger.path.write_bytes(written[:-30])
    record = folders.batches / "b2.json"
    record.write_text(record.read_text()[:60])
    passed = (datetime.now(timezone.utc) - timedelta(days=1)).isoformat()
    processed = folders.processed / "r2.json"
    processed.write_text(json.dumps({"kind": "sample", "scenario": "toy-hfl", "sample_ids": IDS[10:13],
                                     "deadline": passed}))
    two_days_ago = time.time() - 2 * 86400
    os.utime(processed, (two_days_ago, two_days_ago))

    report = repair_ledger(folders, ledger, {"toy-hfl": "toy"}, {}, resolve)

    assert report.rebuilt == {"r2": str(processed)} and not report.unrepairable
    assert_rebuilt(folders, ledger, written)


def test_a_torn_line_and_a_deleted_record_stop_the_run_and_repair_rebuilds_both(tmp_path):
    folders, ledger, written = two_completed_batches(tmp_path, receipt=False)
    ledger.path.write_bytes(written[:-30])
    (folders.batches / "b2.json").unlink()
    check = check_ledger(folders, ledger)
    assert not check.tail_droppable and not check.intact
    stops_naming(folders, ledger, "request r2", str(folders.processed / "r2.json"))

    report = repair_ledger(folders, ledger, {"toy-hfl": "toy"}, {}, resolve)
    assert list(report.rebuilt) == ["r2"] and report.replaced_tail and report.rebuilt_records == ["b2"]
    assert_rebuilt(folders, ledger, written)
    original = json.loads(written.splitlines()[1])
    assert ledger.entries()[1].document()["applied_at"] == original["applied_at"]  # what the torn line still showed
    assert ensure_intact(folders, ledger) is None


def test_a_record_deleted_under_an_intact_ledger_is_noticed_and_rebuilt(tmp_path):
    folders, ledger, written = two_completed_batches(tmp_path)
    (folders.batches / "b1.json").unlink()
    check = check_ledger(folders, ledger)
    assert [m.batch_id for m in check.missing_records] == ["b1"] and not check.intact
    assert any("missing batch record" in line and "r1" in line for line in check.lines())
    stops_naming(folders, ledger, "b1.json", "r1")
    report = repair_ledger(folders, ledger, {"toy-hfl": "toy"}, {"b1": ("v0", "v1")}, resolve)
    assert report.rebuilt_records == ["b1"] and ledger.path.read_bytes() == written
    rebuilt = next(r for r in load_records(folders) if r.batch_id == "b1")
    assert rebuilt.status is BatchStatus.LEDGER_APPENDED and rebuilt.data_version_before == "v0"
    assert check_ledger(folders, ledger).intact


def test_a_whole_lost_line_is_found_by_the_receipt_or_the_processed_file_alone(tmp_path):
    folders, ledger, written = two_completed_batches(tmp_path)
    (folders.batches / "b2.json").unlink()
    ledger.path.write_bytes(written.splitlines(keepends=True)[0])  # reads back as a whole, intact chain
    (folders.processed / "r2.json").unlink()
    check = check_ledger(folders, ledger)
    assert [(e.store, e.request_id, e.batch_id) for e in check.elsewhere] == [("receipt", "r2", "b2")]
    stops_naming(folders, ledger, "request r2", str(tmp_path / RECEIPTS_DIR / "b2.json"))
    report = repair_ledger(folders, ledger, {}, {}, resolve)  # what r2 deleted is nowhere else
    assert report.unrepairable and "fedunlearn restore" in report.unrepairable[0]
    assert ledger.path.read_bytes() == written.splitlines(keepends=True)[0]


def test_the_data_version_and_the_registry_are_evidence_too(tmp_path):
    folders, ledger, written = two_completed_batches(tmp_path, receipt=False)
    b2 = next(r for r in load_records(folders) if r.batch_id == "b2")
    # A record rolled back to `formed` whose data version after is the current one was applied.
    b2.model_copy(update={"status": BatchStatus.FORMED, "ledger_appended": [],
                          "data_versions": {"toy-hfl": VersionChange(before="v1", after="v2")}}).save(folders)
    (tmp_path / "dvc.lock").write_text("stages:\n  partition@toy-hfl:\n    outs:\n    - path: data/partitions/toy-hfl"
                                       "\n      md5: v2.dir\n")
    (folders.processed / "r2.json").unlink()
    ledger.path.write_bytes(written[:-30])
    check = check_ledger(folders, ledger)
    assert [e.request_id for e in check.elsewhere] == ["r2"] and "dvc.lock" in str(check.elsewhere[0])
    stops_naming(folders, ledger, "request r2", "dvc.lock")
    assert list(repair_ledger(folders, ledger, {}, {}, resolve).rebuilt) == ["r2"]
    assert_rebuilt(folders, ledger, written)

    # A torn line whose batch's record and request files are gone: only the registry knows the batch.
    ledger.path.write_bytes(written[:-30])
    for path in (*folders.batches.iterdir(), *folders.processed.iterdir()):
        path.unlink()
    journal(folders, "b1", ledger.inspect().entries, BatchStatus.COMPLETE)
    assert check_ledger(folders, ledger, lambda: set()).tail_droppable is False  # b2's journal is gone
    check = check_ledger(folders, ledger, lambda: {"b2"})
    assert [(e.store, e.batch_id) for e in check.elsewhere] == [("model registry (versions tagged batch_id)", "b2")]


def test_only_an_unfinished_append_is_dropped_and_renamed_files_are_no_evidence(tmp_path):
    folders, ledger, written = two_completed_batches(tmp_path)
    # r1 submitted again and filed under a taken name, without a request_id of its own: not a lost request.
    (folders.processed / "r1-1.json").write_text(json.dumps({"kind": "sample", "sample_ids": IDS[:3]}))
    pending, _ = planned("r3", "b3", IDS[20:22], "2025-01-03T00:00:00Z")
    journal(folders, "b3", [pending], BatchStatus.FORMED)
    with open(ledger.path, "a") as handle:  # b3's append cut off: no store shows r3 applied
        handle.write(pending.chained(GENESIS, pending.submitted_at).line()[:80])
    assert check_ledger(folders, ledger, lambda: {"b1"}).tail_droppable
    assert "dropped an incomplete last line" in ensure_intact(folders, ledger, lambda: {"b1"})
    assert ledger.path.read_bytes() == written and check_ledger(folders, ledger).intact


# --- through the CLI, on a digits-hfl workspace ------------------------------------------------

SCENARIO = "digits-hfl"


@dataclass
class Ingested:
    workspace: Path
    ids: list[str]     # two IDs of client 1, deleted by the batch
    request_id: str


@pytest.fixture(scope="module")
def ingested(prefect_server, tmp_path_factory) -> Ingested:
    """Two IDs of client 1 requested and ingested (one Prefect server for the module); each test
    damages a copy."""
    from fedunlearn.data.store import load_horizontal
    from stores.workspace import init_workspace
    from workspaces import PROJECT_ROOT, call_cli

    workspace = init_workspace(tmp_path_factory.mktemp("double-faults") / "workspace", template=PROJECT_ROOT)
    assert call_cli(workspace, "prepare", "--scenario", SCENARIO).status == 0
    ids = load_horizontal(SCENARIO, workspace).clients[1].sample_ids[:2].tolist()
    requested = call_cli(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids)
    assert requested.status == 0, requested.err
    assert call_cli(workspace, "ingest", "--scenario", SCENARIO).status == 0
    return Ingested(workspace, ids, requested.out.strip())


@pytest.mark.parametrize("fault", ["truncated record", "deleted record", "record only"])
def test_double_faults_through_the_cli_bring_nothing_back(ingested, fault, tmp_path, capsys):
    """The ingested batch's ledger line torn with its record truncated or deleted, or the record
    deleted alone: the next `ingest` stops (exit 4) naming the request and `fedunlearn ledger
    repair`, the IDs stay out of data/raw and the partition; `ledger repair` restores the entry (or
    the record); `verify` is intact; `ingest` changes nothing."""
    from cli import main
    from fedunlearn.data.store import PARTITIONS_DIR, RAW_DIR
    from fedunlearn.errors import StateDamaged
    from fedunlearn.requests.ledger import LEDGER_PATH
    from workspaces import copy_workspace

    workspace, ids, request_id = copy_workspace(ingested.workspace, tmp_path / "workspace"), ingested.ids, \
        ingested.request_id

    def cli(*args: str, status: int = 0) -> tuple[str, str]:
        assert main(["--root", str(workspace), *args]) == status, capsys.readouterr()
        captured = capsys.readouterr()
        return captured.out, captured.err

    def present() -> set[str]:
        raw = set(np.load(workspace / RAW_DIR / "digits" / "sample_ids.npy").tolist())
        parts = {i for f in (workspace / PARTITIONS_DIR / SCENARIO).glob("*/sample_ids.npy") for i in np.load(f)}
        return (raw | parts) & set(ids)

    folders = RequestFolders.create(workspace)
    ledger = workspace / LEDGER_PATH
    [record] = list(folders.batches.glob("*.json"))
    written, journal_text = ledger.read_bytes(), record.read_text()
    assert not present()
    if fault != "record only":
        ledger.write_bytes(written[:-20])
    if fault == "truncated record":
        record.write_text(journal_text[:100])
    else:
        record.unlink()
    lock = (workspace / "dvc.lock").read_bytes()

    _, err = cli("ingest", "--scenario", SCENARIO, status=StateDamaged.exit_code)

    assert request_id in err and "fedunlearn ledger repair" in err
    assert (str(folders.processed / f"{request_id}.json") in err) or (str(record) in err)
    assert (workspace / "dvc.lock").read_bytes() == lock and not present()
    cli("ledger", "verify", status=StateDamaged.exit_code)
    out, _ = cli("ledger", "repair")
    assert out.strip().endswith("intact") and ledger.read_bytes() == written  # the entry as written
    assert set(ids) <= Ledger(ledger).deleted_ids() and record.is_file()
    cli("ingest", "--scenario", SCENARIO)  # finishes the rebuilt record's batch: nothing comes back
    assert not present() and (workspace / "dvc.lock").read_bytes() == lock
    out, _ = cli("ledger", "verify")
    assert out.strip().endswith("intact")
