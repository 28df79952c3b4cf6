"""Resume to the very end (issue 51, item 2): a batch is finished only when its receipt, its
transparency-log leaves and signed head (published to MLflow), the marking of the receipts it
repays and the retrain debt's settlement are all done. The run is stopped right after the receipt
is written (where the failpoint ``after-receipt`` SIGKILLs it in ``make reliability``; here, in
process, an exception nothing catches stands in for the kill), with ``max_retrain_debt: 1`` and a
batch of two requests forgotten on the interim tier, so the finished batch must leave the debt
repaid. The re-run completes what is missing, in order, as a run never stopped would have.

Arranged once for the module (``ended``): a frozen record of what each run printed and left."""

from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient

import flows.promote as promote_stage
from fedunlearn.receipts import Receipt, read_receipt
from fedunlearn.requests.batch import BatchRecord, load_records
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.transparency.log import TransparencyLog
from stores.registry import Registry, tracking_uri
from workspaces import Printed, call_cli, cli_training, copy_workspace

SCENARIO = "digits-hfl"


class Killed(BaseException):
    """What SIGKILL does to the run at the failpoint: nothing after it runs."""


def kill_at(name: str):
    def failpoint(reached: str) -> None:
        if reached == name:
            raise Killed(name)
    return failpoint


def ok(workspace: Path, *args: str) -> Printed:
    printed = call_cli(workspace, *args)
    assert printed.status == 0, printed.out + printed.err
    return printed


@dataclass(frozen=True)
class Ended:
    workspace: Path
    batch_id: str
    record_after_kill: BatchRecord
    receipt_after_kill: Receipt
    logged_after_kill: set[tuple[str, str]]   # (kind, key) of the log's leaves right after the kill
    resumed: Printed                          # the next `process`
    record: BatchRecord                       # the batch's record after it
    receipt: Receipt
    logged: set[tuple[str, str]]
    head_size: int                            # the signed head's size after it
    published: list[str]                      # `current`'s run's artifacts under transparency/
    current: object                           # alias `current` after it (an MLflow ModelVersion)
    again: Printed                            # `process` once more


def leaves(workspace: Path) -> set[tuple[str, str]]:
    return {(r.kind, r.key) for r in TransparencyLog(workspace).records()}


@pytest.fixture(scope="module")
def ended(trained_workspaces, prefect_server, tmp_path_factory) -> Ended:
    template, _ = trained_workspaces.get(SCENARIO, cli_training(SCENARIO))
    workspace = copy_workspace(template, tmp_path_factory.mktemp("batch-end") / "workspace")
    params = workspace / "params.yaml"
    params.write_text(params.read_text().replace("max_retrain_debt: 50", "max_retrain_debt: 1", 1))
    for client in ("0", "1"):
        ids = ok(workspace, "ids", "--scenario", SCENARIO, "--client", client, "--limit", "8").out.split()
        ok(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(Killed):
        patch.setattr(promote_stage, "failpoint", kill_at("after-receipt"))
        call_cli(workspace, "process", "--scenario", SCENARIO)
    [record] = load_records(RequestFolders.create(workspace))
    killed = dict(record_after_kill=record, receipt_after_kill=read_receipt(workspace, record.batch_id),
                  logged_after_kill=leaves(workspace))

    resumed = call_cli(workspace, "process", "--scenario", SCENARIO)
    [record] = load_records(RequestFolders.create(workspace))
    receipt = read_receipt(workspace, record.batch_id)
    head = TransparencyLog(workspace).head()
    client = MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))
    current = Registry(workspace).by_alias(SCENARIO, "current")  # the retrain that repaid the debt
    published = [a.path for a in client.list_artifacts(current.run_id, "transparency")]
    return Ended(workspace, record.batch_id, **killed, resumed=resumed, record=record, receipt=receipt,
                 logged=leaves(workspace), head_size=int(head.split("\n")[1]), published=published, current=current,
                 again=call_cli(workspace, "process", "--scenario", SCENARIO))


def test_the_kill_leaves_a_receipted_batch_neither_logged_nor_finished(ended):
    assert ended.receipt_after_kill is not None and ended.receipt_after_kill.forgetting == "interim"
    assert ended.record_after_kill.finished_at is None
    assert ("batch", ended.batch_id) not in ended.logged_after_kill


def test_the_rerun_says_it_finished_the_batch(ended):
    assert ended.resumed.status == 0, ended.resumed.err
    assert f"finished {ended.batch_id}, which had been interrupted" in ended.resumed.out
    assert "exact retrain repaid in this run" in ended.resumed.out


def test_the_rerun_logs_the_batch_and_publishes_the_signed_head(ended):
    assert {("batch", ended.batch_id), ("exact", ended.batch_id)} <= ended.logged
    assert ended.head_size == len(TransparencyLog(ended.workspace).records())
    assert f"transparency/head-{ended.head_size}.checkpoint" in ended.published  # the latest head, in MLflow


def test_the_debt_over_its_limit_is_repaid_and_the_receipt_marked(ended):
    assert ended.receipt.exactly_forgotten is not None
    assert ended.receipt.exactly_forgotten.version == str(ended.current.version)
    assert ended.current.tags["role"] == "retrained" and ended.current.tags["forgetting"] == "exact"


def test_the_batch_is_recorded_finished_and_a_further_run_changes_nothing(ended):
    assert ended.record.finished_at is not None
    assert ended.again.status == 0 and ended.again.out.strip().endswith("no pending requests"), ended.again.out
    [record] = load_records(RequestFolders.create(ended.workspace))
    assert record == ended.record
