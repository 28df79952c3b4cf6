"""The ``ingest-deletions`` flow on digits-hfl through a temporary Prefect server and a real DVC
repository: the acceptance scenario through the CLI, and crash-and-rerun at two points."""

import json
import os
import time

import pytest

import flows.ingest as ingest
import flows.intake as intake
from cli import main
from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
from fedunlearn.requests.batch import load_records
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import REASON_SUFFIX, submit_request
from fedunlearn.requests.model import DeletionRequestModel
from stores.workspace import data_version, reproduce

SCENARIO = "digits-hfl"


def names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_acceptance_twenty_ids_and_a_malformed_file_then_a_second_ingest_changes_nothing(workspace, prefect_server,
                                                                                          capsys):
    def cli(*args: str) -> str:
        assert main(["--root", str(workspace), *args]) == 0
        return capsys.readouterr().out

    cli("prepare", "--scenario", SCENARIO)
    before = data_version(workspace, SCENARIO)
    ids = cli("ids", "--scenario", SCENARIO, "--limit", "20").split()
    request_id = cli("request", "samples", "--scenario", SCENARIO, "--ids", *ids, "--reason", "user asked").strip()
    folders = RequestFolders.create(workspace)
    (folders.inbox / "broken.json").write_text('{"kind": "sample", "sample_ids": [')
    os.utime(folders.inbox / "broken.json", (time.time() - 3600, time.time() - 3600))  # written an hour ago

    out = cli("ingest", "--scenario", SCENARIO)
    assert names(folders.inbox) == []
    assert names(folders.processed) == [f"{request_id}.json"]
    assert names(folders.quarantine) == ["broken.json", f"broken.json{REASON_SUFFIX}"]
    assert "malformed JSON" in (folders.quarantine / f"broken.json{REASON_SUFFIX}").read_text()
    after = data_version(workspace, SCENARIO)
    assert after != before and f"data version {before} -> {after}" in out and "erasure verified" in out
    entries = Ledger(workspace / LEDGER_PATH).entries()
    assert [e.request_id for e in entries] == [request_id] and sorted(entries[0].sample_ids) == sorted(ids)
    record = json.loads((workspace / "data/deletion_requests/batches" / f"{entries[0].batch_id}.json").read_text())
    assert record["status"] == "complete" and record["erasure"]["verified"]
    assert (record["data_version_before"], record["data_version_after"]) == (before, after)

    ledger, lock = (workspace / LEDGER_PATH).read_bytes(), (workspace / "dvc.lock").read_bytes()
    assert cli("ingest", "--scenario", SCENARIO).strip().endswith("no pending requests")
    assert (workspace / LEDGER_PATH).read_bytes() == ledger and (workspace / "dvc.lock").read_bytes() == lock
    assert len(load_records(folders)) == 1 and names(folders.processed) == [f"{request_id}.json"]


def crash(*args, **kwargs):
    raise RuntimeError("simulated crash")


def test_a_batch_interrupted_after_the_ledger_or_after_the_new_version_finishes_exactly_once(workspace,
                                                                                           prefect_server,
                                                                                           monkeypatch):
    before = reproduce(workspace, SCENARIO)
    clients = [c.sample_ids.tolist() for c in load_horizontal(SCENARIO, workspace).clients]
    folders = RequestFolders.create(workspace)
    ledger = Ledger(workspace / LEDGER_PATH)
    # Flow parameters (the Prefect UI form) enter through the inbox like files.
    first = [DeletionRequestModel(kind="sample", sample_ids=clients[0][:5]),
             DeletionRequestModel(kind="sample", sample_ids=clients[0][3:8])]

    monkeypatch.setattr(intake, "reproduce_versions", crash)  # dies after the ledger append
    with pytest.raises(RuntimeError, match="simulated crash"):
        ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace), requests=first)
    assert [e.request_id for e in ledger.entries()] == [r.request_id for r in first]
    assert len(names(folders.inbox)) == 2 and [r.status.value for r in load_records(folders)] == ["ledger_appended"]
    monkeypatch.undo()
    result = ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))
    assert result["status"] == "no pending requests" and len(result["resumed"]) == 1
    assert names(folders.inbox) == [] and len(names(folders.processed)) == 2
    middle = data_version(workspace, SCENARIO)
    assert middle != before

    submit_request(folders, DeletionRequestModel(kind="client", scenario=SCENARIO, client=2))
    submit_request(folders, DeletionRequestModel(kind="class", scenario=SCENARIO, label=99))
    monkeypatch.setattr(intake, "verify_erasure", crash)  # dies after the new data version
    with pytest.raises(RuntimeError, match="simulated crash"):
        ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))
    assert data_version(workspace, SCENARIO) != middle and len(names(folders.inbox)) == 1
    monkeypatch.undo()
    result = ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))
    assert len(result["resumed"]) == 1 and result["status"] == "no pending requests"
    record = load_records(folders)[-1]
    assert record.status.value == "complete" and record.erasure.verified
    assert record.erasure.checked_samples == len(clients[2])  # rows re-read from the DVC cache after the crash

    entries = ledger.entries()
    assert len(entries) == 3 and len({e.request_id for e in entries}) == 3
    deleted = [i for e in entries for i in e.sample_ids]
    assert len(deleted) == len(set(deleted)) and set(deleted) == set(clients[0][:8]) | set(clients[2])
    assert names(folders.inbox) == [] and len(names(folders.processed)) == 3
    assert len([n for n in names(folders.quarantine) if not n.endswith(REASON_SUFFIX)]) == 1
