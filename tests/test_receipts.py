"""Receipts (pure): written atomically as JSON, read back equal, NaN metrics as null, and a
markdown summary that names the batch, its requests, the versions and every gate."""

import json
import math

from fedunlearn.certify.gates import GateCheck, GateOutcome
from fedunlearn.receipts import EscalationStep, ModelRef, Receipt, read_receipt, receipt_path, write_receipt


def make_receipt(promoted: bool) -> Receipt:
    checks = [GateCheck(name="certificate", value="empirical only", limit=["empirical only", "exact retrain"],
                        passed=True),
              GateCheck(name="abs_gap_test_acc", value=0.01, limit=0.02, passed=True, interval=[-0.004, 0.016], n=1000),
              GateCheck(name="abs_gap_mia_auc", value=math.nan, limit=0.05, passed=promoted,
                        verdict="pass" if promoted else "inconclusive")]
    original = ModelRef(version="1", role="original", data_version="v0", run_id="r1")
    unlearned = ModelRef(version="2", role="unlearned", data_version="v1", run_id="r2")
    return Receipt(batch_id="batch-1", scenario="digits-hfl", request_ids=["req-a", "req-b"], deleted_samples=12,
                   forgotten_per_client={"0": 10, "2": 2}, data_version_before="v0", data_version_after="v1",
                   method="puf-special",
                   models={"original": original, "source": original, "unlearned": unlearned,
                           "retrained": ModelRef(version="3", role="retrained", data_version="v1", run_id="r3"),
                           "current": unlearned if promoted else None},
                   certificate={"method": "puf-special", "guarantee": "empirical only"},
                   gates=GateOutcome.of("vs retrained reference", checks),
                   attempts=[EscalationStep(attempt=0, method="puf-special", version=unlearned,
                                           certificate="empirical only",
                                           gates=GateOutcome.of("vs retrained reference", checks))],
                   promoted=promoted,
                   metrics={"source": {"test_acc": 0.9, "forget_acc": 0.99, "mia_auc": math.nan},
                            "unlearned": {"test_acc": 0.89, "forget_acc": 0.7, "mia_auc": 0.52}},
                   costs={"unlearned": {"wall_seconds": 1.5}}, batch_record="data/deletion_requests/batches/b.json")


def test_a_receipt_round_trips_through_its_json_file(tmp_path):
    receipt = make_receipt(promoted=True)
    path = write_receipt(tmp_path, receipt)
    assert path == receipt_path(tmp_path, "batch-1") == tmp_path / "data/receipts/batch-1.json"
    stored = json.loads(path.read_text())  # strict JSON: NaN is written as null
    assert stored["metrics"]["source"]["mia_auc"] is None and stored["gates"]["checks"][2]["value"] is None
    back = read_receipt(tmp_path, "batch-1")
    assert back.models["unlearned"].version == "2" and back.request_ids == ["req-a", "req-b"]
    skip = {"metrics", "gates", "attempts"}  # NaN is written as null, so those differ in the NaNs only
    assert back.model_dump(exclude=skip) == receipt.model_dump(exclude=skip)
    assert back.attempts[0].version == receipt.attempts[0].version and back.attempts[0].gates.verdict == "pass"
    assert read_receipt(tmp_path, "batch-2") is None
    assert not list(path.parent.glob(".*.tmp"))


def test_the_markdown_names_batch_requests_versions_and_each_gate():
    passed = make_receipt(promoted=True).markdown()
    assert "batch-1" in passed and "req-a, req-b" in passed and "v0 → v1" in passed
    assert "alias `current` → v2" in passed
    assert "| abs_gap_test_acc | 0.01 | [-0.004, 0.016] | 1000 | 0.02 | pass |" in passed
    assert "| unlearned v2 | 0.89 |" in passed and "Attempts: 1. `puf-special` v2 (pass)" in passed
    held = make_receipt(promoted=False).markdown()
    assert "**inconclusive**" in held and "alias `current` NOT moved" in held and "| inconclusive |" in held


# The characters a gate table's columns may hold together (each column as wide as its widest cell): what
# headless Chromium shows whole between the Prefect UI's side panels at a 1400 px window (issue 37).
GATE_TABLE_CHARS = 92


def test_the_gate_table_fits_the_prefect_ui_at_1400_px():
    from fedunlearn.certify.certificate import BOUNDED_APPROXIMATION, GUARANTEES, NOT_CERTIFIED
    from fedunlearn.certify.gates import NO_OP_CHECK

    certified = [g for g in GUARANTEES if g != NOT_CERTIFIED]  # the default allowed_certificates
    checks = [GateCheck(name="certificate", value=BOUNDED_APPROXIMATION, limit=certified, passed=True),
              *(GateCheck(name=name, value=-0.0169, limit=0.05, passed=False, verdict="inconclusive",
                          interval=[-0.152, 0.121], n=1028)
                for name in ("test_acc_drop_vs_source", "forget_acc_minus_test_acc", "mia_auc_minus_chance")),
              GateCheck(name=NO_OP_CHECK, value="the source model (no unlearning) passes these checks too", limit=None,
                        passed=False, verdict="inconclusive")]
    receipt = make_receipt(promoted=False).model_copy(update={"gates": GateOutcome.of("without reference", checks)})
    table = receipt.markdown().split("\n\n")[-2].splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table if not line.startswith("|---")]
    assert cells[0] == ["gate", "value", "CI", "n", "limit", "result"]
    assert cells[1][4] == "any certified" and cells[-1][1] == "source passes too"
    assert sum(max(len(row[column]) for row in cells) for column in range(len(cells[0]))) <= GATE_TABLE_CHARS


def test_the_models_table_fits_the_prefect_ui_at_1400_px_with_every_column():
    full = {"test_acc": 0.9524, "retain_acc": 0.9657, "forget_acc": 0.975, "mia_auc": 0.4831, "wall_seconds": 10.6134,
            "flops": 1.44e12, "comm_bytes": 3.45e8}  # every column as wide as a real batch's
    receipt = make_receipt(promoted=True).model_copy(update={"metrics": {
        "source": full, "unlearned": full, "retrained": full}})
    table = next(block for block in receipt.markdown().split("\n\n") if block.startswith("| model |")).splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table if not line.startswith("|---")]
    assert cells[0] == ["model", "test_acc", "retain_acc", "forget_acc", "mia_auc", "seconds", "FLOPs", "bytes"]
    assert [row[0] for row in cells[1:]][:2] == ["source v1 (original)", "unlearned v2"]
    widest = {column: max(len(row[column]) for row in cells) for column in range(len(cells[0]))}
    assert sum(widest.values()) <= GATE_TABLE_CHARS
