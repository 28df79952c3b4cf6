"""The user's source file is part of the erasure (``fedunlearn.data.source_erasure``,
``tasks.erasure.settle_source``): a batch rewrites a CSV or image folder inside the workspace
without the deleted rows, atomically, and the scan then finds none; a system of record is left
alone, its rows named and the erasure pending (never ``exact``) until a rescan finds them gone."""

from pathlib import Path


import pytest

from fedunlearn.data import source_erasure
from fedunlearn.dataset_specs import parse_spec
from fedunlearn.receipts import Receipt, read_receipt
from fedunlearn.requests.batch import PendingRequest
from fedunlearn.requests.inbox import InboxItem
from fedunlearn.requests.model import DeletionRequestModel
from tasks.erasure import capture_fingerprints, rescan_sources, verify_erasure
from tasks.requests import append_ledger, open_batch, reproduce_versions
from tasks.status import EXACT, INTERIM, PendingRequest as StatusRow
from tasks.validation import validate_requests
from stores.workspace import Workspace, reproduce
from user_data import CSV_PATH, csv_spec, declare, images_spec, write_csv, write_images

SCENARIO = "clinic-hfl"
FORGET = ["pat-00001", "pat-00007", "pat-00012"]


def test_a_csv_is_rewritten_without_the_rows_every_other_byte_kept(tmp_path):
    path = tmp_path / "t.csv"
    original = b'pid,note,f,label\r\np1,"a, b",1,x\r\np2,"two\r\nlines",2,y\r\np3,c,3,x\r\n'
    path.write_bytes(original)
    spec = parse_spec("t", {"source": "csv", "path": str(path), "id_column": "pid"})
    assert source_erasure.rows_in_source(spec, "t", {"p2", "p9"}).places == ["line 3"]
    inode = path.stat().st_ino
    assert source_erasure.remove_from_source(spec, {"p2"}) == 1
    assert path.read_bytes() == b'pid,note,f,label\r\np1,"a, b",1,x\r\np3,c,3,x\r\n'
    assert path.stat().st_ino != inode and list(tmp_path.iterdir()) == [path]  # renamed over, no temporary left
    assert source_erasure.remove_from_source(spec, {"p2"}) == 0  # a resumed batch: nothing left to remove


def test_an_image_folder_loses_the_deleted_files_and_a_table_without_ids_is_not_rewritten(tmp_path):
    folder = write_images(tmp_path, per_class=2, classes=2)
    spec = parse_spec("img", {"source": "image_folder", "path": str(folder)})
    assert source_erasure.rows_in_source(spec, "img", {"1/img000.png"}).ids == ["1/img000.png"]
    assert source_erasure.remove_from_source(spec, {"1/img000.png", "../escape.png"}) == 1
    assert not (folder / "1" / "img000.png").exists() and (folder / "1" / "img001.png").exists()
    positional = parse_spec("t", {"source": "csv", "path": str(tmp_path / "t.csv")})
    assert "declare id_column" in source_erasure.not_rewritable(positional)
    assert source_erasure.not_rewritable(spec) is None


def test_a_parquet_table_is_rewritten_without_the_rows(tmp_path):
    import pandas as pd

    path = tmp_path / "t.parquet"
    pd.DataFrame({"pid": ["a", "b", "c"], "f": [1.0, 2.0, 3.0], "label": [0, 1, 0]}).to_parquet(path)
    spec = parse_spec("t", {"source": "parquet", "path": str(path), "id_column": "pid"})
    assert source_erasure.remove_from_source(spec, {"b"}) == 1
    assert pd.read_parquet(path)["pid"].tolist() == ["a", "c"]


def apply_batch(workspace: Path, system_of_record: bool):
    """A CSV of the user's declared with a relative path, prepared, and one batch deleting ``FORGET``
    through the ingest steps (no Prefect: the tasks' functions)."""
    write_csv(workspace)
    declare(workspace, "clinic", csv_spec(system_of_record), SCENARIO)
    reproduce(workspace, SCENARIO)
    ws = Workspace.open(workspace)
    request = DeletionRequestModel(kind="sample", scenario=SCENARIO, sample_ids=FORGET)
    plan = validate_requests.fn(ws, SCENARIO,
                                [PendingRequest(request, [InboxItem("r.json", Path("r.json"), request=request)])])
    record = open_batch.fn(ws, plan, [], False)
    fingerprints = capture_fingerprints.fn(ws, record)
    record = reproduce_versions.fn(ws, append_ledger.fn(ws, record))
    return ws, verify_erasure.fn(ws, record, fingerprints)


def test_a_batch_rewrites_the_users_csv_and_the_scan_then_finds_nothing(workspace):
    _, record = apply_batch(workspace, system_of_record=False)
    report = record.erasure
    assert report.found == {} and report.verified, report.found
    assert report.source.action == "rewritten" and report.source.removed == 3 and not report.source_pending
    text = (workspace / CSV_PATH).read_text()
    assert not any(i in text for i in FORGET) and "pat-00002" in text
    from cli.requests import own_ids

    # A request may name a sample as earlier versions stored it, the dataset's name in front.
    assert own_ids(workspace, SCENARIO, ["clinic-pat-00002", "pat-00003", "clinic-nothing"]) == [
        "pat-00002", "pat-00003", "clinic-nothing"]


def test_a_system_of_record_is_left_alone_its_rows_named_pending_until_a_rescan_finds_them_gone(workspace):
    ws, record = apply_batch(workspace, system_of_record=True)
    report = record.erasure
    assert report.found == {} and not report.verified and report.source_pending  # pending, not a failed store
    assert report.source.pending_ids == FORGET and report.source.pending_places == ["line 3", "line 9", "line 14"]
    assert f"rescan --scenario {SCENARIO}" in report.source.line()
    path = workspace / CSV_PATH
    assert all(i in path.read_text() for i in FORGET)
    receipt = Receipt.model_validate({
        "batch_id": record.batch_id, "scenario": SCENARIO, "request_ids": ["r"], "deleted_samples": 3,
        "forgotten_per_client": {}, "data_version_before": "a", "data_version_after": "b", "models": {},
        "promoted": True, "metrics": {}, "costs": {}, "erasure": report.model_dump(mode="json"), "batch_record": "x"})
    from fedunlearn.receipts import write_receipt

    write_receipt(workspace, receipt)
    assert read_receipt(workspace, record.batch_id).erasure_pending
    assert list(rescan_sources(ws, SCENARIO).still) == [record.batch_id]  # nothing removed yet
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if not line.startswith(("pat-00001,", "pat-00007,"))))
    assert "IDs pat-00012; line 12" in rescan_sources(ws, SCENARIO).still[record.batch_id]
    # The same row under a new ID is still the row: the keyed fingerprints see it.
    row = next(line for line in lines if line.startswith("pat-00012,"))
    kept = [line for line in path.read_text().splitlines(keepends=True) if not line.startswith("pat-00012,")]
    path.write_text("".join(kept) + row.replace("pat-00012", "pat-99999"))
    assert rescan_sources(ws, SCENARIO).still[record.batch_id]
    path.write_text("".join(kept))
    assert rescan_sources(ws, SCENARIO).cleared == [record.batch_id]
    assert not read_receipt(workspace, record.batch_id).erasure_pending
    assert rescan_sources(ws, SCENARIO).cleared == []  # nothing pending any more


@pytest.mark.parametrize("state,shown", [(EXACT, "erasure pending"), (INTERIM, "interim, erasure pending")])
def test_status_never_says_exact_beside_a_pending_erasure(state, shown):
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    row = StatusRow("r", "sample", now, now + timedelta(days=1), "b", state, now, erasure_pending=True)
    assert row.shown_state() == shown and row.owed()
    assert row.overdue(now + timedelta(days=2))  # erased late is late, whenever the model forgot
    assert StatusRow("r", "sample", now, now + timedelta(days=1), "b", EXACT, now).shown_state() == EXACT


def test_the_status_counts_an_erasure_pending_request_apart_from_the_exact_ones_and_names_the_rows():
    from datetime import datetime, timedelta, timezone

    from tasks.status import DeletionStatus

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [StatusRow("req-a", "sample", now, now + timedelta(days=1), "b1", EXACT, now, erasure_pending=True),
            StatusRow("req-b", "sample", now, now + timedelta(days=1), "b2", EXACT, now)]
    status = DeletionStatus("s", now, [], None, "retrain debt: none", None, forgotten=rows,
                            source_erasure=["b1: erasure PENDING at the source data/user/x.csv: ..."])
    text = status.markdown()
    assert "**1 erasure pending**" in text and "**1 exact**" in text and "**ERASURE PENDING**: b1:" in text
    assert "| req-a | erasure pending |" in text and "| req-b | exact |" in text and status.erasure_pending
    assert not DeletionStatus("s", now, [], None, "-", None, forgotten=rows[1:]).erasure_pending
