"""A request forgets a person from every model that learnt them (issue 51, item 1): two scenarios
on one dataset (digits-hfl and digits-canary-hfl, both on `digits`, the second shortened to a few
rounds here), a request processed under digits-hfl, then `process` of digits-canary-hfl. The
unit of deletion is the dataset, the unit of forgetting the scenario (docs/DESIGN.md §2): the
sibling is owed the forgetting with the request's deadline, its status and digits-hfl's both say
so, its `process` forgets the samples, and the receipts name every version that stopped serving
them.

Arranged once for the module (``siblings``): a frozen record of what each command printed and left."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from fedunlearn.receipts import Receipt, read_receipts
from fedunlearn.requests.batch import BatchRecord, load_records
from fedunlearn.requests.folders import RequestFolders
from stores.registry import Registry
from stores.workspace import data_version
from workspaces import Printed, call_cli, copy_workspace

SCENARIO, SIBLING = "digits-hfl", "digits-canary-hfl"
# The sibling's training shortened (its params.yaml entry): what is checked is where its versions stand.
SHORT = "train: {rounds: 2, local_epochs: 2, lr: 0.05, momentum: 0.9, batch_size: 16}"


def ok(workspace: Path, *args: str) -> Printed:
    printed = call_cli(workspace, *args)
    assert printed.status == 0, printed.out + printed.err
    return printed


@dataclass(frozen=True)
class Siblings:
    workspace: Path
    request_id: str
    ids: list[str]
    sibling_before: str            # the sibling's data version before the request
    sibling_v1: str                # the sibling's model before (its original)
    processed: Printed             # `process --scenario digits-hfl`
    receipt: Receipt               # its receipt right after it
    owed: BatchRecord              # the sibling's record of what it owes
    status_here: Printed           # `status` of digits-hfl, then of the sibling, before the sibling's process
    status_sibling: Printed
    processed_sibling: Printed     # `process --scenario digits-canary-hfl`
    sibling_receipt: Receipt
    receipt_after: Receipt         # digits-hfl's receipt once the sibling forgot the samples
    sibling_current: object        # the sibling's `current` after its process (an MLflow ModelVersion)
    sibling_after: str             # the sibling's data version then
    status_here_after: Printed
    status_sibling_after: Printed
    again: Printed                 # `process --scenario digits-canary-hfl` once more


@pytest.fixture(scope="module")
def siblings(trained_workspaces, prefect_server, tmp_path_factory) -> Siblings:
    from workspaces import cli_training

    template, _ = trained_workspaces.get(SCENARIO, cli_training(SCENARIO))
    workspace = copy_workspace(template, tmp_path_factory.mktemp("siblings") / "workspace")
    params = workspace / "params.yaml"
    text = params.read_text()
    long = "train: {rounds: 20, local_epochs: 5, lr: 0.05, momentum: 0.9, batch_size: 16}"
    assert long in text
    params.write_text(text.replace(long, SHORT, 1))
    ok(workspace, "train", "--scenario", SIBLING, "--inline")
    sibling_before = data_version(workspace, SIBLING)
    sibling_v1 = Registry(workspace).by_alias(SIBLING, "original").version
    ids = ok(workspace, "ids", "--scenario", SCENARIO, "--client", "1", "--limit", "12").out.split()
    request_id = ok(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids).out.strip()

    processed = ok(workspace, "process", "--scenario", SCENARIO)
    [receipt] = read_receipts(workspace, SCENARIO)
    [owed] = [r for r in load_records(RequestFolders.create(workspace)) if r.scenario == SIBLING]
    status_here, status_sibling = call_cli(workspace, "status", "--scenario", SCENARIO), \
        call_cli(workspace, "status", "--scenario", SIBLING)

    processed_sibling = ok(workspace, "process", "--scenario", SIBLING)
    [sibling_receipt] = read_receipts(workspace, SIBLING)
    [receipt_after] = read_receipts(workspace, SCENARIO)
    left = dict(sibling_current=Registry(workspace).by_alias(SIBLING, "current"),
                sibling_after=data_version(workspace, SIBLING))
    return Siblings(workspace, request_id, ids, sibling_before, sibling_v1, processed, receipt, owed, status_here,
                    status_sibling, processed_sibling, sibling_receipt, receipt_after,
                    status_here_after=call_cli(workspace, "status", "--scenario", SCENARIO),
                    status_sibling_after=call_cli(workspace, "status", "--scenario", SIBLING),
                    again=call_cli(workspace, "process", "--scenario", SIBLING), **left)


def test_the_batch_records_the_forgetting_the_sibling_owes_with_the_requests_deadline(siblings):
    owed = siblings.owed
    assert owed.applied_by == [siblings.receipt.batch_id] and owed.ledger_appended == []
    assert [e.request_id for e in owed.requests] == [siblings.request_id]
    assert set(owed.requests[0].sample_ids) == set(siblings.ids)
    assert owed.data_version_before == siblings.sibling_before != owed.data_version_after
    assert owed.deadlines(30) == {siblings.request_id: siblings.receipt.deadlines[siblings.request_id]}
    assert f"{SIBLING} still serves the samples of 1 request(s) deleted here" in siblings.processed.out


def test_the_receipt_names_the_sibling_version_that_serves_the_deleted_samples(siblings):
    owed = siblings.receipt.siblings[SIBLING]
    assert owed["owed_by"] == siblings.owed.batch_id and owed["serving"]["version"] == str(siblings.sibling_v1)
    assert owed["forgotten_by"] is None


def test_the_status_of_both_scenarios_says_the_sibling_owes_the_request(siblings):
    here, there = siblings.status_here, siblings.status_sibling
    assert here.status == 0 and there.status == 0, here.err + there.err
    assert f"{SIBLING} still serves" in here.out and siblings.owed.batch_id in here.out
    assert "no pending requests" not in there.out and siblings.request_id in there.out
    assert "forgetting owed for" in there.out and f"v{siblings.sibling_v1} (original) was trained on" in there.out


def test_the_siblings_process_forgets_the_samples_its_current_now_on_data_without_them(siblings):
    current = siblings.sibling_current
    assert current.tags["data_version"] == siblings.sibling_after == siblings.owed.data_version_after
    assert siblings.sibling_after != siblings.sibling_before
    receipt = siblings.sibling_receipt
    assert receipt.request_ids == [siblings.request_id] and receipt.applied_by == [siblings.receipt.batch_id]
    assert receipt.models["source"].version == str(siblings.sibling_v1)
    assert receipt.models["current"].version == str(current.version)


def test_once_forgotten_the_first_receipt_names_the_version_that_forgot_and_both_statuses_agree(siblings):
    owed = siblings.receipt_after.siblings[SIBLING]
    assert owed["serving"]["version"] == str(siblings.sibling_v1)
    assert owed["forgotten_by"]["version"] == str(siblings.sibling_current.version)
    for status in (siblings.status_here_after, siblings.status_sibling_after):
        assert status.status == 0, status.err
        assert "still serves" not in status.out and "forgetting owed for" not in status.out
        assert "no pending requests" in status.out and siblings.request_id in status.out
    assert siblings.again.status == 0 and siblings.again.out.strip().endswith("no pending requests")
