"""Issue 51 in the reliability suite (``make reliability`` only: each case trains or retrains, and
runs the CLI as separate processes): a batch SIGKILLed after its receipt (the failpoints
``after-receipt`` and ``after-tree-head``) is completed to the very end by the next run — the log
covers the batch, its signed head is in MLflow, the receipts its exact retrain repays are marked,
the debt over ``max_retrain_debt`` is repaid — as in a run never killed; so is an exact-retrain batch
(`process --retrain`) killed after its receipt, the interim receipts it repays marked; and a request processed
under one scenario is forgotten by its sibling on the same dataset (digits-hfl and
digits-canary-hfl, as params.yaml defines them), whose status names the request until it is.
``make test`` checks the same in process: tests/test_batch_end.py, tests/test_sibling_scenarios.py."""

from __future__ import annotations

import os
import signal

import pytest

from batch_harness import SCENARIO, Stores, prefect_server, registry, submit, tally, workspace_copy
from fedunlearn.receipts import owes_retrain, read_receipt, read_receipts
from fedunlearn.transparency.log import TransparencyLog

FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = pytest.mark.skipif(not FULL, reason="make reliability only: make test covers the same in process "
                                                 "(tests/test_batch_end.py, tests/test_sibling_scenarios.py)")
SIBLING = "digits-canary-hfl"


@pytest.fixture(scope="module")
def api_url(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("batch-end")) as url:
        yield url


@pytest.fixture
def bench(tmp_path, digits_hfl_template, api_url):
    with workspace_copy(tmp_path, digits_hfl_template, api_url) as bench:
        yield bench


@pytest.mark.parametrize("stage", ["after-receipt", "after-tree-head"])
def test_a_batch_killed_after_its_receipt_is_finished_to_the_end(bench, stage, reliability_report):
    cli, sample_ids = bench
    params = cli.workspace / "params.yaml"
    params.write_text(params.read_text().replace("max_retrain_debt: 50", "max_retrain_debt: 1", 1))
    requests = [submit(cli.workspace, sample_ids.take(8)) for _ in range(2)]

    killed = cli.process(failpoint=stage)
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    reliability_report.count("faults injected (SIGKILL)")
    [record] = Stores.read(cli.workspace).records
    assert read_receipt(cli.workspace, record.batch_id) is not None and record.finished_at is None

    resumed = cli.process()
    assert resumed.returncode == 0, resumed.describe()
    assert f"finished {record.batch_id}, which had been interrupted" in resumed.stdout, resumed.describe()
    receipt = read_receipt(cli.workspace, record.batch_id)
    log = TransparencyLog(cli.workspace)
    logged = {(r.kind, r.key) for r in log.records()}
    assert {("batch", record.batch_id), ("exact", record.batch_id)} <= logged  # the batch, then its repayment
    size = int(log.head().split("\n")[1])
    assert size == len(log.records())
    current = registry(cli.workspace).get_model_version_by_alias(SCENARIO, "current")
    published = [a.path for a in registry(cli.workspace).list_artifacts(current.run_id, "transparency")]
    assert f"transparency/head-{size}.checkpoint" in published
    assert receipt.exactly_forgotten is not None and receipt.exactly_forgotten.version == str(current.version)
    [record] = Stores.read(cli.workspace).records
    assert record.finished_at is not None

    again = cli.process()
    assert again.returncode == 0 and again.stdout.strip().endswith("no pending requests"), again.describe()
    # Exactly once, as the ledger and the inbox show it (`current` is the repaying retrain, not the batch's
    # version, so check_exactly_once's alias check does not apply here).
    found = tally(Stores.read(cli.workspace), requests)
    assert found.lost == [] and found.applied_twice == [], found
    reliability_report.count("batches finished to the end after a kill past the receipt")


def test_an_exact_retrain_batch_killed_after_its_receipt_marks_the_receipts_it_repays(bench, reliability_report):
    """An interim batch owes an exact retrain; the next batch is one (`process --retrain`) and is
    SIGKILLed right after its receipt: the re-run marks the earlier receipt exactly forgotten by the
    retrain now serving, and nothing is owed — as in a run never killed."""
    cli, sample_ids = bench
    first = submit(cli.workspace, sample_ids.take(8))
    assert cli.process().returncode == 0
    [interim] = read_receipts(cli.workspace, SCENARIO)
    assert first in interim.request_ids and owes_retrain(interim), interim  # else nothing is there to repay
    second = submit(cli.workspace, sample_ids.take(8))

    killed = cli.run("process", "--scenario", SCENARIO, "--retrain", failpoint="after-receipt")
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    reliability_report.count("faults injected (SIGKILL)")
    resumed = cli.process()
    assert resumed.returncode == 0 and "which had been interrupted" in resumed.stdout, resumed.describe()

    current = registry(cli.workspace).get_model_version_by_alias(SCENARIO, "current")
    assert current.tags["forgetting"] == "exact", current.tags
    receipts = read_receipts(cli.workspace, SCENARIO)
    assert [r for r in receipts if owes_retrain(r)] == [], receipts
    repaid = read_receipt(cli.workspace, interim.batch_id)
    assert repaid.exactly_forgotten is not None and repaid.exactly_forgotten.version == str(current.version)
    assert second in receipts[-1].request_ids
    found = tally(Stores.read(cli.workspace), [first, second])
    assert found.lost == [] and found.applied_twice == [], found
    reliability_report.count("exact retrain batches finished to the end after a kill past the receipt")


def test_a_request_processed_under_one_scenario_is_forgotten_by_its_sibling(bench, reliability_report):
    cli, sample_ids = bench
    trained = cli.run("train", "--scenario", SIBLING, "--inline")
    assert trained.returncode == 0, trained.describe()
    [request] = [submit(cli.workspace, sample_ids.take(10))]
    assert cli.process().returncode == 0

    owed = cli.run("status", "--scenario", SIBLING)
    here = cli.run("status", "--scenario", SCENARIO)
    assert owed.returncode == 0 and request in owed.stdout and "forgetting owed for" in owed.stdout, owed.describe()
    assert f"{SIBLING} still serves" in here.stdout, here.describe()

    forgotten = cli.run("process", "--scenario", SIBLING)
    assert forgotten.returncode == 0, forgotten.describe()
    current = registry(cli.workspace).get_model_version_by_alias(SIBLING, "current")
    from stores.workspace import data_version

    assert current.tags["data_version"] == data_version(cli.workspace, SIBLING)
    [receipt] = read_receipts(cli.workspace, SIBLING)
    assert receipt.request_ids == [request]
    for scenario in (SCENARIO, SIBLING):
        status = cli.run("status", "--scenario", scenario)
        assert status.returncode == 0 and "no pending requests" in status.stdout, status.describe()
        assert "still serves" not in status.stdout and "forgetting owed for" not in status.stdout
    reliability_report.count("requests forgotten by a sibling scenario")
