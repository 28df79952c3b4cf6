"""The ``ingest-deletions`` flow on digits-hfl through a temporary Prefect server (one for the
module) and a real DVC repository: the acceptance scenario through the CLI, and crash-and-rerun at
two points. Each scenario is arranged and run once (module fixtures: ``ingested``, ``interrupted``,
each a frozen record of what its runs left); a test of it only asserts, and a test that acts again
takes a copy of its workspace."""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import flows.ingest as ingest
import flows.intake as intake
from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.batch import load_records
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import REASON_SUFFIX, submit_request
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
from fedunlearn.requests.model import DeletionRequestModel
from stores.workspace import data_version, init_workspace, reproduce
from workspaces import PROJECT_ROOT, Printed, call_cli, copy_workspace

SCENARIO = "digits-hfl"


def names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@dataclass(frozen=True)
class Ingested:
    workspace: Path
    ids: list[str]       # 20 sample IDs requested
    request_id: str
    before: str          # the data version before the ingest
    ingest: Printed


@pytest.fixture(scope="module")
def ingested(prefect_server, tmp_path_factory) -> Ingested:
    """The acceptance scenario: 20 IDs requested through the CLI and a malformed file written to the
    inbox an hour ago, then `fedunlearn ingest`. Tests read it; a test that acts takes a copy."""
    # arrange
    workspace = init_workspace(tmp_path_factory.mktemp("ingest") / "workspace", template=PROJECT_ROOT)

    def cli(*args: str) -> Printed:
        printed = call_cli(workspace, *args)
        assert printed.status == 0, printed.err
        return printed

    cli("prepare", "--scenario", SCENARIO)
    before = data_version(workspace, SCENARIO)
    ids = cli("ids", "--scenario", SCENARIO, "--limit", "20").out.split()
    request_id = cli("request", "samples", "--scenario", SCENARIO, "--ids", *ids, "--reason", "user asked").out.strip()
    folders = RequestFolders.create(workspace)
    (folders.inbox / "broken.json").write_text('{"kind": "sample", "sample_ids": [')
    os.utime(folders.inbox / "broken.json", (time.time() - 3600, time.time() - 3600))  # written an hour ago

    # act
    ingest = cli("ingest", "--scenario", SCENARIO)
    return Ingested(workspace, ids, request_id, before, ingest)


def test_acceptance_the_valid_request_is_processed_and_the_malformed_file_quarantined_with_its_reason(ingested):
    # assert
    folders = RequestFolders.create(ingested.workspace)
    assert names(folders.inbox) == []
    assert names(folders.processed) == [f"{ingested.request_id}.json"]
    assert names(folders.quarantine) == ["broken.json", f"broken.json{REASON_SUFFIX}"]
    assert "malformed JSON" in (folders.quarantine / f"broken.json{REASON_SUFFIX}").read_text()


def test_acceptance_the_twenty_ids_leave_in_a_new_data_version_recorded_in_the_ledger_and_the_batch(ingested):
    # assert
    workspace, before = ingested.workspace, ingested.before
    after = data_version(workspace, SCENARIO)
    assert after != before and f"data version {before} -> {after}" in ingested.ingest.out
    assert "erasure verified" in ingested.ingest.out
    entries = Ledger(workspace / LEDGER_PATH).entries()
    assert [e.request_id for e in entries] == [ingested.request_id]
    assert sorted(entries[0].sample_ids) == sorted(ingested.ids)
    record = json.loads((workspace / "data/deletion_requests/batches" / f"{entries[0].batch_id}.json").read_text())
    assert record["status"] == "complete" and record["erasure"]["verified"]
    assert (record["data_version_before"], record["data_version_after"]) == (before, after)


def test_acceptance_a_second_ingest_changes_nothing(ingested, tmp_path):
    # arrange
    workspace = copy_workspace(ingested.workspace, tmp_path / "workspace")
    folders = RequestFolders.create(workspace)
    ledger, lock = (workspace / LEDGER_PATH).read_bytes(), (workspace / "dvc.lock").read_bytes()

    # act
    again = call_cli(workspace, "ingest", "--scenario", SCENARIO)

    # assert
    assert again.status == 0 and again.out.strip().endswith("no pending requests")
    assert (workspace / LEDGER_PATH).read_bytes() == ledger and (workspace / "dvc.lock").read_bytes() == lock
    assert len(load_records(folders)) == 1 and names(folders.processed) == [f"{ingested.request_id}.json"]


def crash(*args, **kwargs):
    raise RuntimeError("simulated crash")


@dataclass(frozen=True)
class Interrupted:
    """Two batches in one workspace, each crashed once and re-run: what the stores held at each step."""

    workspace: Path
    clients: list[list[str]]           # the training sample IDs per client before any deletion
    before: str                        # data versions: before the first batch, after it, after the crash
    middle: str
    after_crash: str
    first: list[str]                   # the first batch's request IDs (flow parameters)
    ledger_after_crash: list[str]
    inbox_after_crash: int
    records_after_crash: list[str]
    first_rerun: dict
    folders_after_rerun: tuple[list[str], list[str]]  # inbox, processed
    inbox_after_second_crash: int
    second_rerun: dict


@pytest.fixture(scope="module")
def interrupted(prefect_server, tmp_path_factory) -> Interrupted:
    """A batch (two requests, given as flow parameters) that dies after its ledger append, re-run;
    then a batch (a client request and a malformed class request through the inbox) that dies after
    its new data version, re-run."""
    # arrange
    workspace = init_workspace(tmp_path_factory.mktemp("interrupted") / "workspace", template=PROJECT_ROOT)
    before = reproduce(workspace, SCENARIO)
    clients = [c.sample_ids.tolist() for c in load_horizontal(SCENARIO, workspace).clients]
    folders = RequestFolders.create(workspace)
    ledger = Ledger(workspace / LEDGER_PATH)
    # Flow parameters (the Prefect UI form) enter through the inbox like files.
    first = [DeletionRequestModel(kind="sample", sample_ids=clients[0][:5]),
             DeletionRequestModel(kind="sample", sample_ids=clients[0][3:8])]

    # act: each batch crashes once, then runs again; what the stores held is recorded after each run
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(intake, "reproduce_versions", crash)  # dies after the ledger append
        with pytest.raises(RuntimeError, match="simulated crash"):
            ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace), requests=first)
    left = dict(ledger_after_crash=[e.request_id for e in ledger.entries()], inbox_after_crash=len(names(folders.inbox)),
                records_after_crash=[r.status.value for r in load_records(folders)])
    first_rerun = ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))
    folders_after_rerun = (names(folders.inbox), names(folders.processed))
    middle = data_version(workspace, SCENARIO)

    submit_request(folders, DeletionRequestModel(kind="client", scenario=SCENARIO, client=2))
    submit_request(folders, DeletionRequestModel(kind="class", scenario=SCENARIO, label=99))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(intake, "verify_erasure", crash)  # dies after the new data version
        with pytest.raises(RuntimeError, match="simulated crash"):
            ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))
    after_crash, inbox_after_second_crash = data_version(workspace, SCENARIO), len(names(folders.inbox))
    second_rerun = ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))
    return Interrupted(workspace, clients, before, middle, after_crash, [r.request_id for r in first],
                       first_rerun=first_rerun, folders_after_rerun=folders_after_rerun,
                       inbox_after_second_crash=inbox_after_second_crash, second_rerun=second_rerun, **left)


def test_a_batch_interrupted_after_its_ledger_append_is_finished_by_the_next_run(interrupted):
    # assert
    assert interrupted.ledger_after_crash == interrupted.first
    assert interrupted.inbox_after_crash == 2 and interrupted.records_after_crash == ["ledger_appended"]
    result = interrupted.first_rerun
    assert result.status == "no pending requests" and len(result.resumed) == 1
    inbox, processed = interrupted.folders_after_rerun
    assert inbox == [] and len(processed) == 2
    assert interrupted.middle != interrupted.before


def test_a_batch_interrupted_after_its_new_data_version_is_finished_by_the_next_run(interrupted):
    # assert
    assert interrupted.after_crash != interrupted.middle and interrupted.inbox_after_second_crash == 1
    result = interrupted.second_rerun
    assert len(result.resumed) == 1 and result.status == "no pending requests"
    record = load_records(RequestFolders.create(interrupted.workspace))[-1]
    assert record.status.value == "complete" and record.erasure.verified
    # rows re-read from the DVC cache after the crash
    assert record.erasure.checked_samples == len(interrupted.clients[2])


def test_across_both_interruptions_every_request_is_applied_exactly_once(interrupted):
    # assert
    folders = RequestFolders.create(interrupted.workspace)
    entries = Ledger(interrupted.workspace / LEDGER_PATH).entries()
    assert len(entries) == 3 and len({e.request_id for e in entries}) == 3
    deleted = [i for e in entries for i in e.sample_ids]
    clients = interrupted.clients
    assert len(deleted) == len(set(deleted)) and set(deleted) == set(clients[0][:8]) | set(clients[2])
    assert names(folders.inbox) == [] and len(names(folders.processed)) == 3
    assert len([n for n in names(folders.quarantine) if not n.endswith(REASON_SUFFIX)]) == 1
