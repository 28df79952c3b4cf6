"""The flows' typed results serialise to the keys the flows returned as dicts (a served run's result,
read by users): fields that did not apply are left out, not written as null."""

from __future__ import annotations

import pytest

from fedunlearn.receipts import ModelRef
from flows.results import (AttemptLine, BenchmarkResult, IngestResult, ProcessResult, ReferenceResult, RepayResult,
                           Timings, TrainResult)

INTAKE = {"scenario": "digits-hfl", "resumed": [], "quarantined": [], "already_applied": [], "left_pending": [],
          "waiting": {}}
BATCH = {"batch_id": "b1", "applied": ["r1"], "deleted_ids": 3, "per_client": {1: 3}, "data_version_before": "v0",
         "data_version_after": "v1", "erasure": None, "record": "data/deletion_requests/batches/b1.json"}


def trained() -> TrainResult:
    return TrainResult(scenario="s", data_version="v1", test_acc=0.9, model_version="3", run_id="r", device="cpu",
                       wall_seconds=1.0, backdoor_samples=0)


@pytest.mark.parametrize("repayment, written", [({}, set()), ({"exact_run": "repaid in this run"}, {"exact_run"})],
                         ids=["nothing-repaid", "late-repayment"])
def test_with_no_batch_the_result_holds_what_intake_did_and_a_late_repayment_only_when_made(repayment, written):
    # arrange
    result = ProcessResult(**INTAKE, status="no pending requests", **repayment)

    # act
    dumped = result.model_dump(mode="json")

    # assert
    assert set(dumped) == set(INTAKE) | {"status"} | written


def test_an_ingest_batch_result_names_every_batch_field():
    # arrange
    ingest = IngestResult(**INTAKE, status="complete", **BATCH)

    # act
    dumped = ingest.model_dump(mode="json")

    # assert
    assert set(dumped) == set(INTAKE) | {"status"} | set(BATCH)


def test_a_process_batch_result_names_every_field_even_where_it_is_null():
    # arrange
    process = ProcessResult(**INTAKE, status="complete", **BATCH, method="ga", certificate="empirical only",
                            promoted=True, attempts=[AttemptLine(attempt=0, method="ga", verdict="pass")],
                            models={"unlearned": ModelRef(version="2", role="unlearned"), "retrained": None},
                            receipt="data/receipts/b1.json", forgetting="exact", retrain_debt="retrain debt: none",
                            timings=Timings(flow_seconds=2, core_seconds=1, orchestration_seconds=1,
                                            orchestration_share=0.5))

    # act
    dumped = process.model_dump(mode="json")

    # assert
    assert dumped["exact_due"] is None and dumped["exact_run"] is None and dumped["models"]["retrained"] is None
    assert dumped["warnings"] == []  # e.g. the fallbacks a Flower runner left out, when there are some
    assert dumped["attempts"] == [{"attempt": 0, "method": "ga", "note": None, "verdict": "pass", "interim": None}]


def test_a_reused_reference_result_is_three_fields_and_reused():
    # arrange
    reused = ReferenceResult(scenario="s", data_version="v1", model_version="3", reused=True)

    # act
    dumped = reused.model_dump()

    # assert
    assert dumped == {"scenario": "s", "data_version": "v1", "model_version": "3", "reused": True}


def test_a_reference_result_that_trained_is_the_training_result():
    # arrange
    training = trained()

    # act
    dumped = ReferenceResult.of_training(training).model_dump()

    # assert
    assert dumped == {**training.model_dump(), "reused": False}


def test_a_reference_result_names_the_batches_it_closed():
    # arrange
    closed = ReferenceResult.of_training(trained()).model_copy(update={"closed": ["b1"]})

    # act
    dumped = closed.model_dump()

    # assert
    assert dumped["closed"] == ["b1"]


def test_a_repay_result_is_its_scenario_and_what_it_repaid():
    # arrange
    repaid = RepayResult(scenario="s", repaid=[])

    # act
    dumped = repaid.model_dump()

    # assert
    assert dumped == {"scenario": "s", "repaid": []}


def test_a_benchmark_result_is_its_rows():
    # arrange
    rows = [{"method": "original", "test_acc": 0.9}, {"method": "retrain", "test_acc": 0.88}]

    # act
    result = BenchmarkResult(rows)

    # assert
    assert result.rows == rows and result.model_dump(mode="json") == rows
