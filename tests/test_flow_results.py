"""The flows' typed results serialise to the keys the flows returned as dicts (a served run's result,
read by users): fields that did not apply are left out, not written as null."""

from __future__ import annotations

from fedunlearn.receipts import ModelRef
from flows.results import AttemptLine, IngestResult, ProcessResult, ReferenceResult, RepayResult, Timings, TrainResult

INTAKE = {"scenario": "digits-hfl", "resumed": [], "quarantined": [], "already_applied": [], "left_pending": [],
          "waiting": {}}
BATCH = {"batch_id": "b1", "applied": ["r1"], "deleted_ids": 3, "per_client": {1: 3}, "data_version_before": "v0",
         "data_version_after": "v1", "erasure": None, "record": "data/deletion_requests/batches/b1.json"}


def test_with_no_batch_the_result_holds_what_intake_did_and_a_late_repayment_only_when_made():
    nothing = ProcessResult(**INTAKE, status="no pending requests")
    repaid = ProcessResult(**INTAKE, status="no pending requests", exact_run="repaid in this run")

    assert set(nothing.model_dump(mode="json")) == set(INTAKE) | {"status"}
    assert set(repaid.model_dump(mode="json")) == set(INTAKE) | {"status", "exact_run"}


def test_a_batch_result_names_every_field_even_where_it_is_null():
    ingest = IngestResult(**INTAKE, status="complete", **BATCH)
    process = ProcessResult(**INTAKE, status="complete", **BATCH, method="ga", certificate="empirical only",
                            promoted=True, attempts=[AttemptLine(attempt=0, method="ga", verdict="pass")],
                            models={"unlearned": ModelRef(version="2", role="unlearned"), "retrained": None},
                            receipt="data/receipts/b1.json", forgetting="exact", retrain_debt="retrain debt: none",
                            timings=Timings(flow_seconds=2, core_seconds=1, orchestration_seconds=1,
                                            orchestration_share=0.5))

    assert set(ingest.model_dump(mode="json")) == set(INTAKE) | {"status"} | set(BATCH)
    dumped = process.model_dump(mode="json")
    assert dumped["exact_due"] is None and dumped["exact_run"] is None and dumped["models"]["retrained"] is None
    assert dumped["warnings"] == []  # e.g. the fallbacks a Flower runner left out, when there are some
    assert dumped["attempts"] == [{"attempt": 0, "method": "ga", "note": None, "verdict": "pass", "interim": None}]


def test_a_reference_result_is_the_training_result_when_it_trained_and_three_fields_when_reused():
    trained = TrainResult(scenario="s", data_version="v1", test_acc=0.9, model_version="3", run_id="r", device="cpu",
                          wall_seconds=1.0, backdoor_samples=0)

    assert ReferenceResult(scenario="s", data_version="v1", model_version="3", reused=True).model_dump() == {
        "scenario": "s", "data_version": "v1", "model_version": "3", "reused": True}
    assert ReferenceResult.of_training(trained).model_dump() == {**trained.model_dump(), "reused": False}
    closed = ReferenceResult.of_training(trained).model_copy(update={"closed": ["b1"]})
    assert closed.model_dump()["closed"] == ["b1"]
    assert RepayResult(scenario="s", repaid=[]).model_dump() == {"scenario": "s", "repaid": []}


def test_a_benchmark_result_is_its_rows():
    from flows.results import BenchmarkResult

    rows = [{"method": "original", "test_acc": 0.9}, {"method": "retrain", "test_acc": 0.88}]

    assert BenchmarkResult(rows).rows == rows and BenchmarkResult(rows).model_dump(mode="json") == rows
