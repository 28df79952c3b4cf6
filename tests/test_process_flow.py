"""The ``process-deletions`` flow on digits-hfl through a temporary Prefect server, a real DVC
repository and a real sqlite MLflow registry, driven by the CLI: a clean no-op; a batch that fails
after its ledger append and is resumed from the DVC cache (unlearned and retrained versions, gates,
alias, receipt, comparison); a re-run that changes nothing. Then the gate policy and the batch
resolution, without a server."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

import flows.process as process
from fedunlearn.cli import main
from fedunlearn.data.store import LEDGER_PATH, load_horizontal
from fedunlearn.federation.local import Tensors
from fedunlearn.receipts import VERSION_METRICS, read_receipt
from fedunlearn.requests.ledger import Ledger, LedgerEntry
from tasks.pipeline import PromotionGates, apply_gates, deletion_batch
from tasks.tracking import tracking_uri
from tasks.workspace import data_version

SCENARIO = "digits-hfl"


def registry(workspace) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))


def versions_by_role(workspace) -> dict[str, list]:
    found: dict[str, list] = {}
    for version in registry(workspace).search_model_versions(f"name='{SCENARIO}'"):
        found.setdefault(version.tags["role"], []).append(version)
    return found


def crash(*args, **kwargs):
    raise RuntimeError("simulated crash")


def test_a_batch_through_the_cli_failing_after_its_ledger_append_resumes_then_reruns_change_nothing(
        workspace, prefect_server, monkeypatch, capsys, tmp_path):
    def cli(*args: str) -> str:
        assert main(["--root", str(workspace), *args]) == 0
        return capsys.readouterr().out

    # With nothing pending a run changes nothing: no data version, no registry, no receipt.
    assert cli("process", "--scenario", SCENARIO).strip().endswith("no pending requests")
    assert not (workspace / "data/receipts").exists() and not (workspace / "mlflow/mlflow.db").exists()
    assert not (workspace / "dvc.lock").exists()

    cli("train", "--scenario", SCENARIO, "--inline")
    before = data_version(workspace, SCENARIO)
    ids = cli("ids", "--scenario", SCENARIO, "--client", "1", "--limit", "12").split()
    request_id = cli("request", "samples", "--scenario", SCENARIO, "--ids", *ids).strip()

    monkeypatch.setattr(process, "unlearn", crash)
    assert main(["--root", str(workspace), "process", "--scenario", SCENARIO, "--retrain"]) == 1
    assert re.search(r"error: batch batch-\S+ \(digits-hfl\) failed at unlearn \(puf-special\): simulated crash; "
                     r"re-run `fedunlearn process --scenario digits-hfl` to resume", capsys.readouterr().err)
    # The deletion itself happened: the ledger holds it and the data moved on without the samples.
    assert [e.request_id for e in Ledger(workspace / LEDGER_PATH).entries()] == [request_id]
    assert data_version(workspace, SCENARIO) != before and sorted(versions_by_role(workspace)) == ["original"]
    assert not set(ids) & set(np.concatenate([c.sample_ids for c in load_horizontal(SCENARIO, workspace).clients]))

    monkeypatch.undo()  # the next run resumes the batch, reading the forget samples back from the DVC cache
    out = cli("process", "--scenario", SCENARIO, "--retrain")
    after = data_version(workspace, SCENARIO)
    roles = versions_by_role(workspace)
    assert sorted(roles) == ["original", "retrained", "unlearned"] and all(len(v) == 1 for v in roles.values())
    original, retrained, unlearned = roles["original"][0], roles["retrained"][0], roles["unlearned"][0]
    batch_id = unlearned.tags["batch_id"]
    assert unlearned.tags["method"] == "puf-special" and unlearned.tags["certificate"] == "empirical only"
    assert (original.tags["data_version"], unlearned.tags["data_version"], retrained.tags["data_version"]) == \
        (before, after, after) and retrained.tags["batch_id"] == batch_id

    receipt = read_receipt(workspace, batch_id)
    assert receipt.request_ids == [request_id] and receipt.forgotten_per_client == {"1": 12}
    assert (receipt.data_version_before, receipt.data_version_after) == (before, after)
    assert {k: int(v.version) for k, v in receipt.models.items() if v} == {
        "original": original.version, "source": original.version, "unlearned": unlearned.version,
        "retrained": retrained.version, **({"current": unlearned.version} if receipt.promoted else {})}
    assert receipt.gates.policy == "vs retrained reference" and receipt.promoted == receipt.gates.passed
    assert [c.name for c in receipt.gates.checks] == ["certificate", "abs_gap_test_acc", "abs_gap_forget_acc",
                                                      "abs_gap_mia_auc"]
    aliases = registry(workspace).get_registered_model(SCENARIO).aliases
    assert aliases["original"] == original.version and aliases["retrained"] == retrained.version
    assert aliases.get("current") == (unlearned.version if receipt.gates.passed else None)
    assert f"receipt: data/receipts/{batch_id}.json" in out and f"unlearned v{unlearned.version}" in out
    artifacts = [a.path for a in registry(workspace).list_artifacts(unlearned.run_id, "receipt")]
    assert artifacts == [f"receipt/{batch_id}.json"]
    certificate = registry(workspace).download_artifacts(unlearned.run_id, "certificate.json", str(tmp_path))
    assert json.loads(Path(certificate).read_text())["guarantee"] == "empirical only"
    # Every version's run carries the same metric keys; the reference's forget accuracy is the batch's.
    for version in (original, retrained, unlearned):
        assert set(VERSION_METRICS) <= set(registry(workspace).get_run(version.run_id).data.metrics)
    assert math.isnan(registry(workspace).get_run(original.run_id).data.metrics["forget_acc"])
    assert not math.isnan(registry(workspace).get_run(retrained.run_id).data.metrics["forget_acc"])

    ledger, lock = (workspace / LEDGER_PATH).read_bytes(), (workspace / "dvc.lock").read_bytes()
    assert "no pending requests" in cli("process", "--scenario", SCENARIO)
    assert (workspace / LEDGER_PATH).read_bytes() == ledger and (workspace / "dvc.lock").read_bytes() == lock
    assert sum(len(v) for v in versions_by_role(workspace).values()) == 3

    table = cli("compare", "--scenario", SCENARIO).splitlines()
    assert table[0].startswith("| version | aliases | role | method | data_version | test_acc | forget_acc |")
    assert [row.split("|")[3].strip() for row in table[2:]] == ["original", "unlearned", "retrained"]


def row(test_acc, forget_acc, mia_auc, certificate="empirical only") -> dict:
    return {"test_acc": test_acc, "forget_acc": forget_acc, "mia_auc": mia_auc, "bd_asr": None,
            "certificate": certificate}


def test_the_gates_compare_with_the_reference_or_else_with_the_source_and_chance():
    gates = PromotionGates()
    source = row(0.90, 0.99, 0.60)
    with_reference = apply_gates.fn(row(0.89, 0.80, 0.52), row(0.88, 0.78, 0.50), source, gates)
    assert with_reference.passed and with_reference.policy == "vs retrained reference"
    assert not apply_gates.fn(row(0.89, 0.80, 0.52), row(0.80, 0.78, 0.50), source, gates).passed

    alone = apply_gates.fn(row(0.89, 0.90, 0.53), None, source, gates)
    assert alone.policy == "without reference" and alone.passed
    assert [c.name for c in alone.checks] == ["certificate", "test_acc_drop_vs_source", "forget_acc_minus_test_acc",
                                              "mia_auc_minus_chance"]
    remembers = apply_gates.fn(row(0.89, 0.99, 0.53), None, source, gates)
    assert [c.name for c in remembers.checks if not c.passed] == ["forget_acc_minus_test_acc"]
    assert not apply_gates.fn(row(0.89, 0.90, math.nan), None, source, gates).passed  # unmeasured fails
    assert not apply_gates.fn(row(0.89, 0.90, 0.5, "not certified"), None, source, gates).passed
    relaxed = PromotionGates(max_forget_acc_excess=None)
    assert apply_gates.fn(row(0.89, 0.99, 0.53), None, source, relaxed).passed


def test_a_batch_resolves_to_training_samples_per_client_keeping_a_shared_kind():
    clients = [Tensors.from_arrays(np.zeros((3, 2)), np.array([0, 1, 1]), np.array([f"c{c}-{i}" for i in range(3)]),
                                   "cpu") for c in range(2)]
    entries = [LedgerEntry(request_id="a", kind="sample", sample_ids=["c0-1", "c1-2", "test-7"], held_out=["test-7"]),
               LedgerEntry(request_id="b", kind="class", subject={"label": 1}, sample_ids=["c0-2"])]
    batch = deletion_batch("batch-x", entries, clients)
    assert batch.kind == "sample" and batch.batch_id == "batch-x"
    assert {c: ids.tolist() for c, ids in batch.forget_ids.items()} == {0: ["c0-1", "c0-2"], 1: ["c1-2"]}
    classes = deletion_batch("batch-y", entries[1:], clients)
    assert classes.kind == "class" and classes.labels == [1]
    with pytest.raises(ValueError, match="only held-out test samples"):
        deletion_batch("batch-z", [LedgerEntry(request_id="c", kind="sample", sample_ids=["t"], held_out=["t"])],
                       clients)
