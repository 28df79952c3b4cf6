"""Every class of bad input gets a clear reason and ends in quarantine/, while the valid
requests of the same batch proceed: file-level problems (format, schema, names that try to
leave the inbox) and the Great Expectations checks against the current data version of
digits-hfl (unknown ID, already deleted, unknown client, class out of range)."""

import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.ledger import LEDGER_PATH
from fedunlearn.requests.batch import PendingRequest, triage
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import REASON_SUFFIX, InboxItem, quarantine, scan_inbox, submit_request
from fedunlearn.requests.model import (MAX_IDS_PER_REQUEST, MAX_REQUEST_BYTES, DeletionRequestModel, RequestError,
                                       build_request, parse_request)
from tasks.validation import validate_requests
from stores.workspace import Workspace, init_workspace, reproduce

SCENARIO = "digits-hfl"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """One prepared digits-hfl workspace (like the ``workspace`` fixture) for the whole module: the
    tests read its data and never reproduce it, so preparing it once saves time."""
    root = init_workspace(tmp_path_factory.mktemp("validation") / "workspace")
    reproduce(root, SCENARIO)
    return root


@pytest.fixture
def folders(prepared):
    """Empty request folders and ledger for each test."""
    folders = RequestFolders.create(prepared)
    for directory in (folders.inbox, folders.processed, folders.quarantine):
        for entry in directory.iterdir():
            entry.unlink() if not entry.is_dir() or entry.is_symlink() else entry.rmdir()
    (prepared / LEDGER_PATH).write_text("")
    return folders


@pytest.fixture(scope="module")
def partition(prepared):
    return load_horizontal(SCENARIO, prepared)


@pytest.fixture(scope="module")
def client_ids(partition):
    return [c.sample_ids.tolist() for c in partition.clients]


def record_deleted(root: Path, ids: list[str]) -> None:
    """A ledger line as another tool might write it (only the keys the prepare stage reads)."""
    with open(root / LEDGER_PATH, "a") as ledger:
        ledger.write(json.dumps({"request_id": "earlier", "batch_id": "b0", "sample_ids": ids}) + "\n")


FILE_PROBLEMS = {
    "malformed.json": (b'{"kind": "sample", "sample_ids": [', "malformed JSON: Expecting value at line 1 column 35"),
    "unknown-kind.json": (b'{"kind": "delete", "sample_ids": ["digits-00001"]}',
                          "kind: Input should be 'sample', 'class' or 'client' (got 'delete')"),
    "empty-subject.json": (b'{"kind": "sample", "sample_ids": []}', "empty subject: 'sample_ids' lists no IDs"),
    "blank-id.json": (b'{"kind": "sample", "sample_ids": ["  "]}', "are empty"),
    "no-subject.json": (b'{"kind": "class"}', "a class request needs 'label'"),
    "two-subjects.json": (b'{"kind": "client", "client": 1, "label": 2}', "sets only 'client'; remove label"),
    "not-an-object.json": (b'["digits-00001"]', "a request must be a JSON object"),
    "not-utf8.json": (b'{"kind": "\xff"}', "not UTF-8 text"),
    "escaping-id.json": (b'{"kind": "client", "client": 1, "request_id": "../../outside"}',
                         "request_id '../../outside' is not allowed"),
    "too-many-ids.json": (json.dumps({"kind": "sample", "sample_ids": [f"x{i}" for i in range(MAX_IDS_PER_REQUEST + 1)]
                                      }).encode(), f"the limit is {MAX_IDS_PER_REQUEST}"),
    "too-large.json": (b" " * (MAX_REQUEST_BYTES + 1), "larger than 10 MiB"),
}


def test_each_bad_file_gets_a_clear_reason_and_lands_in_quarantine(folders):
    for name, (content, _) in FILE_PROBLEMS.items():
        (folders.inbox / name).write_bytes(content)
    items = scan_inbox(folders, SCENARIO)
    problems = {item.name: item.problem for item in items}
    for name, (_, expected) in FILE_PROBLEMS.items():
        assert expected in problems[name], name
    for item in items:
        quarantine(folders, item, item.problem)
    assert not list(folders.inbox.iterdir())
    for name, (_, expected) in FILE_PROBLEMS.items():
        assert expected in (folders.quarantine / f"{name}{REASON_SUFFIX}").read_text()
        assert (folders.quarantine / name).is_file()


def test_a_file_still_being_written_waits_and_an_old_unreadable_one_is_quarantined(folders):
    half = b'{"kind": "sample", "sample_ids": ["digits-000'
    (folders.inbox / "slow.json").write_bytes(half)  # a writer pausing half-way
    (folders.inbox / "empty.json").write_bytes(b"")
    (folders.inbox / "stale.json").write_bytes(half)
    os.utime(folders.inbox / "stale.json", (time.time() - 3600, time.time() - 3600))
    items = {item.name: item for item in scan_inbox(folders, SCENARIO, grace_seconds=300)}
    assert items["slow.json"].waiting.startswith("malformed JSON") and items["slow.json"].problem is None
    assert "still being written" in items["empty.json"].waiting
    assert items["stale.json"].problem.startswith("malformed JSON") and items["stale.json"].waiting is None
    triaged = triage(list(items.values()), {}, SCENARIO, [SCENARIO])
    assert sorted(i.name for i in triaged.waiting) == ["empty.json", "slow.json"]
    assert [r.items[0].name for r in triaged.rejected] == ["stale.json"]
    (folders.inbox / "slow.json").write_bytes(half + b'01"]}')  # the writer finishes: the next run applies it
    finished = {item.name: item for item in scan_inbox(folders, SCENARIO, grace_seconds=300)}["slow.json"]
    assert finished.request.sample_ids == ["digits-00001"] and finished.waiting is None


def test_a_request_dated_more_than_a_day_ahead_is_refused():
    with pytest.raises(RequestError, match="submitted_at: .*more than a day in the future"):
        parse_request(b'{"kind": "client", "client": 0, "submitted_at": "2099-01-01T00:00:00Z"}',
                      {"request_id": "r", "scenario": SCENARIO})
    soon = (datetime.now(timezone.utc) + timedelta(hours=2)).isoformat()  # clock skew between machines
    assert parse_request(json.dumps({"kind": "client", "client": 0, "submitted_at": soon}).encode(),
                         {"request_id": "r", "scenario": SCENARIO}).client == 0


HOSTILE_DEADLINES = {
    "9999-12-31T23:59:59-23:59": "out of range once converted to UTC",  # year 10000 in UTC
    "0001-01-01T00:00:00+01:00": "out of range once converted to UTC",  # year 0 in UTC
    "0001-01-01T00:00:00Z": "is not after the request was submitted",  # comparable, but never met
    "2020-01-01T00:00:00Z": "is not after the request was submitted",
    0: "is a number, not a date",  # read by pydantic as 1970
    "12345": "is a number, not a date",  # `--deadline 12345`
}


@pytest.mark.parametrize("deadline", list(HOSTILE_DEADLINES), ids=str)
def test_a_deadline_that_cannot_be_compared_or_met_is_refused_with_its_reason(deadline):
    with pytest.raises(RequestError, match=HOSTILE_DEADLINES[deadline]):
        build_request({"kind": "client", "client": 0, "scenario": SCENARIO, "deadline": deadline})


def test_an_inbox_file_with_an_overflowing_deadline_is_quarantined_and_the_others_proceed(folders):
    (folders.inbox / "req-overflow.json").write_text(json.dumps(
        {"kind": "client", "client": 0, "deadline": "9999-12-31T23:59:59-23:59"}))
    (folders.inbox / "req-ancient.json").write_text(json.dumps({"kind": "client", "client": 1, "deadline": 0}))
    (folders.inbox / "req-fine.json").write_text(json.dumps({"kind": "client", "client": 2}))
    triaged = triage(scan_inbox(folders, SCENARIO), {}, SCENARIO, [SCENARIO])
    assert [p.request.request_id for p in triaged.pending] == ["req-fine"]
    reasons = {r.items[0].name: r.reason for r in triaged.rejected}
    assert "deadline: 9999-12-31T23:59:59-23:59 is out of range once converted to UTC" in reasons["req-overflow.json"]
    assert "deadline: 0 is a number, not a date" in reasons["req-ancient.json"]


def test_names_that_try_to_leave_the_inbox_are_never_followed(folders, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"kind": "client", "client": 0}')
    (folders.inbox / "link.json").symlink_to(outside)
    (folders.inbox / ".hidden.json").write_text('{"kind": "client", "client": 0}')
    (folders.inbox / "up..json").write_text('{"kind": "client", "client": 0}')
    (folders.inbox / "notes.txt").write_text("delete me please")
    (folders.inbox / "with space.json").write_text('{"kind": "client", "client": 0}')
    (folders.inbox / "folder.json").mkdir()
    problems = {item.name: item.problem for item in scan_inbox(folders, SCENARIO)}
    assert problems == {
        "link.json": "symbolic link: not followed; put the request file itself into the inbox",
        ".hidden.json": "hidden file (name starts with '.'): not read",
        "up..json": "file name contains '..': not read",
        "notes.txt": "not a .json file: request files are named <request_id>.json",
        "with space.json": problems["with space.json"],
        "folder.json": "not a regular file (a directory or a device): only request files are read",
    }
    assert "characters from A-Z a-z 0-9 . _ -" in problems["with space.json"]
    for item in scan_inbox(folders, SCENARIO):
        moved = quarantine(folders, item, item.problem)
        assert moved.parent == folders.quarantine and moved.name.isprintable() and not moved.name.startswith(".")
    assert (folders.quarantine / "link.json").is_symlink() and outside.read_text() == '{"kind": "client", "client": 0}'
    assert sorted(p.name for p in folders.quarantine.iterdir() if not p.name.endswith(REASON_SUFFIX)) == [
        "folder.json", "hidden.json", "link.json", "notes.txt", "up_json", "with_space.json"]
    assert not list(folders.inbox.iterdir())


def test_request_ids_are_checked_before_they_become_file_names(folders):
    with pytest.raises(RequestError, match=r"request_id '\.\./x' is not allowed"):
        build_request({"kind": "client", "client": 0, "request_id": "../x"})
    request = DeletionRequestModel(kind="client", client=0, scenario=SCENARIO)
    assert request.request_id.startswith("req-")
    assert submit_request(folders, request) == folders.inbox / f"{request.request_id}.json"
    # The same request submitted twice keeps both files; the batch merges them.
    assert submit_request(folders, request).name == f"{request.request_id}-1.json"
    inbox = triage(scan_inbox(folders, SCENARIO), {}, SCENARIO, [SCENARIO])
    assert [len(p.items) for p in inbox.pending] == [2]


def pending(*requests: DeletionRequestModel) -> list[PendingRequest]:
    return [PendingRequest(r, [InboxItem(f"{r.request_id}.json", Path(f"{r.request_id}.json"), request=r)])
            for r in requests]


def request(**fields) -> DeletionRequestModel:
    return DeletionRequestModel(scenario=SCENARIO, **fields)


def test_subject_checks_reject_bad_requests_and_let_the_valid_ones_proceed(folders, prepared, partition,
                                                                           client_ids):
    gone = client_ids[0][:3]
    record_deleted(prepared, gone)
    valid = request(kind="sample", sample_ids=client_ids[1][:4])
    overlapping = request(kind="sample", sample_ids=client_ids[1][2:6])
    unknown = request(kind="sample", sample_ids=[client_ids[1][10], "digits-99999"])
    deleted = request(kind="sample", sample_ids=[gone[0], client_ids[1][11]])
    bad_client = request(kind="client", client=7)
    bad_class = request(kind="class", label=12)
    negative_class = request(kind="class", label=-1)
    whole_class = request(kind="class", label=3)
    plan = validate_requests.fn(Workspace.open(prepared), SCENARIO, pending(valid, overlapping, unknown, deleted, bad_client,
                                                            bad_class, negative_class, whole_class))
    reasons = {r.request_id: r.reason for r in plan.rejected}
    assert set(reasons) == {unknown.request_id, deleted.request_id, bad_client.request_id, bad_class.request_id,
                            negative_class.request_id}
    assert reasons[unknown.request_id].startswith("unknown sample IDs, not in data version")
    assert reasons[unknown.request_id].endswith(": digits-99999")
    # Partly deleted: refused whole, and the reason says the live ID stays and what to do about it.
    assert reasons[deleted.request_id] == (f"already deleted (listed in {LEDGER_PATH}): {gone[0]}; its other 1 ID(s) "
                                           "are live and stay in the data, since a request is applied whole or not at "
                                           f"all: {client_ids[1][11]}. To delete them, submit a new request naming "
                                           "only those IDs")
    assert reasons[bad_client.request_id] == "unknown client 7: digits-hfl has clients 0..2"
    assert reasons[bad_class.request_id] == "class 12 is out of range: digits-hfl has classes 0..9"
    assert "class -1 is out of range" in reasons[negative_class.request_id]
    applied = {e.request_id: e for e in plan.entries}
    assert set(applied) == {valid.request_id, overlapping.request_id, whole_class.request_id}
    assert applied[overlapping.request_id].merged_ids == client_ids[1][2:4]
    class_3 = {c: [i for i, y in zip(client.sample_ids.tolist(), client.labels.tolist()) if y == 3 and i not in gone]
               for c, client in enumerate(partition.clients)}
    assert applied[whole_class.request_id].clients == {str(c): ids for c, ids in class_3.items() if ids}


def test_more_bad_ids_than_gx_lists_are_still_traced_to_each_request(folders, prepared):
    """GX reports 20 unexpected values per expectation; 3 × 15 unknown IDs need a second pass."""
    bad = [request(kind="sample", sample_ids=[f"digits-9{r}{i:03d}" for i in range(15)]) for r in range(3)]
    plan = validate_requests.fn(Workspace.open(prepared), SCENARIO, pending(*bad))
    assert sorted(r.request_id for r in plan.rejected) == sorted(r.request_id for r in bad)
    assert not plan.entries


def test_a_client_with_nothing_left_is_already_deleted(folders, prepared, client_ids):
    record_deleted(prepared, client_ids[2])
    plan = validate_requests.fn(Workspace.open(prepared), SCENARIO, pending(request(kind="client", client=2)))
    assert plan.rejected[0].reason.startswith("client 2 has no remaining training samples in digits-hfl: already "
                                              "deleted")


def test_request_refuses_sample_ids_the_data_never_held_and_submits_nothing(folders, client_ids, capsys):
    from cli import main

    root = folders.workspace
    refused = main(["--root", str(root), "request", "samples", "--scenario", SCENARIO,
                    "--ids", client_ids[0][0], "digits-99999", "does-not-exist"])
    error = capsys.readouterr().err
    assert refused == 2 and ("2 of 3 sample ID(s) are not in digits-hfl's current data version — never in the data: "
                             "digits-99999, does-not-exist;") in error
    assert "fedunlearn ids --scenario digits-hfl" in error and list(folders.inbox.iterdir()) == []
    accepted = main(["--root", str(root), "request", "samples", "--scenario", SCENARIO, "--ids", client_ids[0][0]])
    assert accepted == 0 and len(list(folders.inbox.iterdir())) == 1


def test_request_names_sample_ids_deleted_already_apart(folders, capsys):
    from cli import main

    root = folders.workspace
    record_deleted(root, ["digits-99998"])  # a deletion the data version no longer holds
    refused = main(["--root", str(root), "request", "samples", "--scenario", SCENARIO, "--ids", "digits-99998"])

    error = capsys.readouterr().err
    assert refused == 2 and "deleted already: digits-99998 (`fedunlearn status" in error and "never in" not in error
    assert list(folders.inbox.iterdir()) == []
