"""Lineage in MLflow (issue 18): a run's data version as a metadata-only dataset input (digest = the
DVC hash, source = the partition, context = why the run used it) and a version's description of
why it exists — the batch, method, certificate and gates, counts but never sample IDs. The flows
log them (asserted on a real batch in ``test_process_flow``); here the registry and the texts."""

from __future__ import annotations

import torch

from fedunlearn.certify.gates import GateCheck, GateOutcome
from fedunlearn.config import load_params
from fedunlearn.requests.batch import BatchRecord, VersionChange
from fedunlearn.requests.ledger import LedgerEntry
from tasks.models import batch_description, training_description
from stores.registry import ModelWeights, Registry
from stores.workspace import PROJECT_ROOT

SCENARIO = "digits-hfl"
BEFORE, AFTER = "0f" * 16, "a1" * 16  # DVC md5 hashes: 32 hex digits


def test_a_run_logs_its_data_version_as_a_dataset_input_and_a_version_its_description(workspace):
    registry = Registry(workspace)
    run_id = registry.start_run(SCENARIO, "train", {}, {"role": "original"})
    for _ in range(2):  # a resumed run logging it again adds nothing
        registry.log_data_version(run_id, SCENARIO, BEFORE, "training")
    assert registry.data_inputs(run_id) == [(BEFORE, f"data/partitions/{SCENARIO}", "training")]
    [entry] = registry.client.get_run(run_id).inputs.dataset_inputs
    dataset = entry.dataset
    assert (dataset.name, dataset.source_type) == (f"partition@{SCENARIO}", "local")
    assert dataset.schema is None and dataset.profile is None  # metadata only: nothing of the rows

    model = torch.nn.Linear(4, 2)
    ref = registry.register(run_id, SCENARIO, "hfl", ModelWeights(model.state_dict()), model, (4,),
                            {"role": "original", "scenario": SCENARIO, "data_version": BEFORE}, "original",
                            description="**Original**")
    assert registry.version(SCENARIO, ref.version).description == "**Original**"
    registry.describe(SCENARIO, ref.version, "**Original**, described again")
    assert registry.version(SCENARIO, ref.version).description == "**Original**, described again"
    # The run's page shows it too, beside the dataset input.
    assert registry.client.get_run(run_id).data.tags["mlflow.note.content"] == "**Original**, described again"


def batch(requests: int) -> BatchRecord:
    entries = [LedgerEntry(request_id=f"req-{n}", kind="sample", sample_ids=[f"digits-{n}-{k}" for k in range(3)],
                           held_out=[f"digits-{n}-2"]) for n in range(requests)]
    return BatchRecord(batch_id="batch-7", scenario=SCENARIO, dataset="digits", requests=entries,
                       data_versions={SCENARIO: VersionChange(before=BEFORE, after=AFTER)})


def test_a_batch_version_description_names_the_batch_method_certificate_and_each_gate_but_no_sample():
    record = batch(7)
    gate = GateOutcome(passed=False, policy="vs retrained reference", verdict="fail", checks=[
        GateCheck(name="test_acc_gap", value=0.01, limit=0.05, passed=True),
        GateCheck(name="mia_auc_gap", value=0.2, limit=0.05, passed=False, verdict="fail")])
    text = batch_description(record, 1, 4, "puf-special", {"eta_u": 4.0}, "empirical only", "3", gate)
    assert text.startswith("**Unlearned** for deletion batch `batch-7` by `puf-special`: gates **fail**, "
                           "certificate empirical only (escalation step 2 of 4).")
    for expected in ("requests: 7 (`req-0`, `req-1`, `req-2`, `req-3`, `req-4`, … (+2)), kind sample",
                     "deleted samples: 21 (7 held-out)", "method: `puf-special` (eta_u=4.0)",
                     "certificate: empirical only",
                     "gates: **fail** (vs retrained reference): test_acc_gap pass · mia_auc_gap fail",
                     "source version: v3", f"data version: `{BEFORE}` → `{AFTER}`"):
        assert expected in text
    assert "digits-" not in text  # sample IDs are counted, never listed

    pending = batch_description(batch(1), 0, 4, "puf-special", {}, "empirical only", "3")
    assert "gates: pending" in pending and "requests: 1 (`req-0`)" in pending
    exact = batch_description(batch(1), 3, 4, "retrain", {}, "exact retrain", None, note="none needed")
    assert exact.startswith("**Exact retrain** for deletion batch `batch-7` by `retrain`: gates none needed, "
                            "certificate exact retrain (escalation step 4 of 4).")
    assert "source version: none (trained from scratch)" in exact and "gates: none needed" in exact


def test_a_trained_version_description_says_how_and_on_which_data_version():
    cfg = load_params(PROJECT_ROOT / "params.yaml").scenario(SCENARIO)
    original = training_description(SCENARIO, cfg, BEFORE, "original")
    assert original.startswith("**Original**: trained from scratch") and f"data version `{BEFORE}`" in original
    assert f"{cfg.train.rounds} rounds" in original and f"{cfg.partition.num_clients} clients" in original
    retrained = training_description(SCENARIO, cfg, AFTER, "retrained", "batch-7")
    assert "deletion batch `batch-7`" in retrained and "certificate: exact retrain" in retrained
