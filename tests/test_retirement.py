"""Issue 46: a version that learnt deleted data loses its weights once every request it learnt is
exactly forgotten, keeps its record, and cannot be loaded, aliased or restored; a hold keeps it.

The plan is tested on facts alone; the registry's side on a copy of the session's trained digits-hfl
workspace (no training here), its batches written as the journal and receipts a batch leaves."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fedunlearn.retirement import BatchFacts, VersionFacts, plan_retirement

SCENARIO = "digits-hfl"
DUE = datetime(2026, 12, 1, tzinfo=timezone.utc)


def batch(batch_id: str, before: str, after: str, exact: bool, due: datetime = DUE) -> BatchFacts:
    return BatchFacts(batch_id, before, after, exact, due, (f"req-{batch_id}",))


# --- the plan ---------------------------------------------------------------------------------


def test_a_version_retires_exactly_when_its_last_owed_request_is_exactly_forgotten():
    versions = [VersionFacts("1", "original", "D0"),
                VersionFacts("2", "unlearned", "D1", source_version="1", batch_id="b1", forgetting="interim"),
                VersionFacts("3", "retrained", "D2")]
    first_only = plan_retirement(versions, [batch("b1", "D0", "D1", True), batch("b2", "D1", "D2", False)], "3")
    assert first_only.retire == {}
    assert first_only.pending == {"1": DUE, "2": DUE}
    both = plan_retirement(versions, [batch("b1", "D0", "D1", True), batch("b2", "D1", "D2", True)], "3")
    assert both.retire == {"1": "b2", "2": "b2"}  # the batch that completed the set names the tombstone
    assert "3" not in both.owed  # trained without either batch's samples: nothing to retire


def test_an_interim_version_owes_its_sources_batches_and_a_formal_one_not_its_own():
    versions = [VersionFacts("1", "original", "D0"),
                VersionFacts("2", "unlearned", "D1", source_version="1", batch_id="b1", forgetting="interim"),
                VersionFacts("3", "unlearned", "D1", source_version="1", batch_id="b1", forgetting="formal")]
    plan = plan_retirement(versions, [batch("b1", "D0", "D1", False)], "2")
    assert plan.owed == {"1": ["b1"], "2": ["b1"]}
    assert plan.pending == {"1": DUE, "2": DUE}
    serving = plan_retirement(versions, [batch("b1", "D0", "D1", True)], "2")
    assert serving.retire == {"1": "b1"}  # v2 serves: never retired while it does


def test_a_held_version_stays_and_names_the_requests_it_still_holds():
    versions = [VersionFacts("1", "original", "D0", held="litigation hold 2026-11"),
                VersionFacts("2", "retrained", "D1")]
    plan = plan_retirement(versions, [batch("b1", "D0", "D1", True)], "2")
    assert plan.retire == {} and plan.held == {"1": ["req-b1"]}


def test_pending_retirement_is_due_by_the_earliest_deadline_it_holds():
    versions = [VersionFacts("1", "original", "D0"), VersionFacts("2", "retrained", "D2")]
    later = DUE + timedelta(days=3)
    plan = plan_retirement(versions, [batch("b1", "D0", "D1", False, later), batch("b2", "D1", "D2", False, DUE)], "2")
    assert plan.pending == {"1": DUE}


# --- the registry -------------------------------------------------------------------------------


def owe_one_exact_batch(root: Path, batch_id: str = "batch-20261128T000000Z-test", forgetting: str = "exact") -> str:
    """The journal and receipt of a batch that deleted one sample from v1's data version and was
    forgotten exactly (a retrain serves): what ``process`` leaves, without its minutes of work.
    ``forgetting="interim"``: forgotten approximately, an exact retrain still owed."""
    from fedunlearn.receipts import ModelRef, Receipt, write_receipt
    from fedunlearn.requests.batch import BatchRecord, BatchStatus, VersionChange
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, LedgerEntry
    from stores.workspace import Workspace

    ws = Workspace.open(root)
    v1 = ws.registry.version(SCENARIO, "1")
    before = v1.tags["data_version"]
    entry = LedgerEntry(request_id="req-retire-1", batch_id=batch_id, scenario=SCENARIO, sample_ids=["digits-00002"],
                        submitted_at=datetime(2026, 11, 28, tzinfo=timezone.utc))
    BatchRecord(batch_id=batch_id, scenario=SCENARIO, dataset="digits", status=BatchStatus.COMPLETE, requests=[entry],
                data_versions={SCENARIO: VersionChange(before=before, after="after-" + before)}).save(ws.folders)
    Ledger(root / LEDGER_PATH).append([entry])  # the ledger holds what the receipt says was applied
    ref = ModelRef(version="1", role="original", data_version=before, run_id=v1.run_id)
    write_receipt(root, Receipt(batch_id=batch_id, scenario=SCENARIO, request_ids=["req-retire-1"], deleted_samples=1,
                                forgotten_per_client={"0": 1}, data_version_before=before,
                                data_version_after="after-" + before, method="retrain" if forgetting == "exact" else "fedora",
                                forgetting=forgetting,
                                # The version serving after it is one the registry holds: the log checks
                                # the batch statement's serving version against the registry before signing.
                                models={"original": ref, "source": ref, "current": None, "unlearned": ref},
                                promoted=True, metrics={},
                                costs={}, batch_record=f"data/deletion_requests/batches/{batch_id}.json"))
    return batch_id


def weights_files(root: Path) -> list[Path]:
    return [p for p in (root / "mlflow" / "artifacts").rglob("*") if p.is_file() and
            ("weights" in p.parts or p.name == "model.pt2")]


def test_a_retired_version_keeps_its_record_and_loses_its_weights_everywhere(trained_digits_hfl):
    from stores.registry import VersionRetired
    from stores.workspace import Workspace
    from tasks.receipts import comparison
    from tasks.retirement import retire_forgotten

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    ws = Workspace.open(root)
    metrics_before = ws.registry.metrics(ws.registry.version(SCENARIO, "1").run_id)
    [weights] = [p for p in weights_files(root) if p.name == "weights.pt"]
    (root / ".tmp").mkdir(exist_ok=True)
    shutil.copy(weights, root / ".tmp" / "copy.pt")  # a scratch copy: deleted with the version
    shutil.copy(weights, root / "data" / "kept-copy.pt")  # elsewhere: the check must say so, not vouch
    ws.registry.remove_alias(SCENARIO, "current")  # v1 no longer serves (a retrain would)

    done = retire_forgotten.fn(ws, SCENARIO)

    assert done.versions == {"1": batch_id}
    assert weights_files(root) == [] and not (root / ".tmp" / "copy.pt").exists()
    assert done.check.weights_found == {f"{SCENARIO} v1": ["data/kept-copy.pt"]}
    with pytest.raises(VersionRetired, match=batch_id):
        ws.registry.load(SCENARIO, "1")
    with pytest.raises(VersionRetired, match=batch_id):
        ws.registry.set_alias(SCENARIO, "current", "1")
    assert ws.registry.aliases(SCENARIO) == {}  # alias original left it too
    tags = ws.registry.version(SCENARIO, "1").tags
    assert tags["retirement"] == "retired" and len(tags["weights_sha256"]) == 64
    measured = {k: v for k, v in metrics_before.items() if v == v}  # NaN: measured by no one
    kept = ws.registry.metrics(ws.registry.version(SCENARIO, "1").run_id)
    assert {k: v for k, v in kept.items() if v == v} == measured
    [row] = comparison(ws, SCENARIO)[0]
    assert row["retired"] == f"retired by {batch_id}" and row["test_acc"] == metrics_before["test_acc"]
    from fedunlearn.receipts import read_receipt
    receipt = read_receipt(root, batch_id)
    assert receipt.retired == ["1"] and "versions retired: v1" in receipt.markdown()


def test_a_retired_version_says_so_first_wherever_a_user_meets_it(trained_digits_hfl):
    """Its page and its run's begin with the notice; the tag MLflow lists first says it; MLflow's own
    loader names the batch and what to load instead; so does the project's."""
    import mlflow
    import mlflow.pytorch
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

    from stores.registry import VersionRetired
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    ws = Workspace.open(root)
    before = ws.registry.version(SCENARIO, "1").description
    ws.registry.remove_alias(SCENARIO, "current")
    retire_forgotten.fn(ws, SCENARIO)
    retire_forgotten.fn(ws, SCENARIO)  # again: nothing is prefixed twice

    notice = f"RETIRED by {batch_id} (weights deleted; metrics kept)"
    found = ws.registry.version(SCENARIO, "1")
    assert found.description.startswith(notice) and found.description.count(notice) == 1
    assert found.description.endswith(before)  # what it was stays readable below
    run_tags = ws.registry.client.get_run(found.run_id).data.tags
    assert run_tags[MLFLOW_RUN_NOTE].startswith(notice) and run_tags[MLFLOW_RUN_NOTE].count(notice) == 1
    for tags in (found.tags, run_tags):
        first = sorted(k for k in tags if not k.startswith("mlflow."))[0]
        assert first == "_retired" and tags[first].startswith(notice), tags
        assert tags["retirement"].startswith("retired")  # the existing tags stay
    with pytest.raises(VersionRetired) as refused:
        ws.registry.load(SCENARIO, "1")
    assert str(refused.value).startswith(f"v1 of {SCENARIO} was retired by batch {batch_id}: weights deleted; "
                                         f"use models:/{SCENARIO}@current")
    mlflow.set_tracking_uri(ws.registry.uri)
    mlflow.set_registry_uri(ws.registry.uri)
    try:
        with pytest.raises(Exception) as by_mlflow:
            mlflow.pytorch.load_model(f"models:/{SCENARIO}/1")
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    assert notice in str(by_mlflow.value) and f"models:/{SCENARIO}@current" in str(by_mlflow.value)
    assert weights_files(root) == []


def test_a_crash_between_deleting_and_tagging_resumes_once(trained_digits_hfl):
    from fedunlearn.requests.erasure import RETIRED_WEIGHTS_PATH
    from stores.registry import VersionRetired
    from stores.workspace import Workspace

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    code = ("import sys; from stores.workspace import Workspace; "
            f"Workspace.open(sys.argv[1]).registry.retire({SCENARIO!r}, '1', {batch_id!r})")
    killed = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True,
                            env={**os.environ, "FEDUNLEARN_FAILPOINT": "during-retirement"})
    assert killed.returncode == -9, killed.stderr
    ws = Workspace.open(root)
    half = ws.registry.version(SCENARIO, "1")
    assert half.tags["retirement"] == "retiring" and weights_files(root) == []
    with pytest.raises(VersionRetired):  # half-retired: nothing loads or serves it
        ws.registry.load(SCENARIO, "1")
    assert ws.registry.retire(SCENARIO, "1", batch_id) is True  # the next run completes it
    done = ws.registry.version(SCENARIO, "1").tags
    assert done["retirement"] == "retired" and done["weights_sha256"] == half.tags["weights_sha256"]
    assert ws.registry.retire(SCENARIO, "1", batch_id) is False  # and does nothing a second time
    assert len((root / RETIRED_WEIGHTS_PATH).read_text().splitlines()) == 1


def test_hold_keeps_a_version_and_status_and_the_receipt_say_so(trained_digits_hfl):
    from fedunlearn.receipts import read_receipt
    from fedunlearn.transparency.log import TransparencyLog
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten
    from tasks.status import deletion_status
    from workspaces import call_cli

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    held = call_cli(root, "hold", "v1", "--scenario", SCENARIO, "--reason", "litigation hold LH-7")
    assert held.status == 0, held.err
    assert "req-retire-1" in held.out
    ws = Workspace.open(root)
    ws.registry.remove_alias(SCENARIO, "current")
    assert retire_forgotten.fn(ws, SCENARIO).versions == {}
    assert ws.registry.load(SCENARIO, "1").state  # its weights stay
    lines = deletion_status(ws, SCENARIO).markdown()
    assert "**HELD**: v1 (original) keeps its weights on purpose (litigation hold LH-7)" in lines
    assert "req-retire-1" in lines
    assert read_receipt(root, batch_id).held == {"1": "litigation hold LH-7"}
    assert [r.key for r in TransparencyLog(root).records() if r.kind == "hold"] == [f"{SCENARIO} v1"]


def test_status_prints_a_pending_retirement_with_its_due_date(trained_digits_hfl):
    """`fedunlearn status` as printed: v1 learnt a batch forgotten only approximately, so its weights
    stay until the exact retrain, due by the request's deadline (submitted 2026-11-28, 30 days)."""
    from workspaces import call_cli

    root = trained_digits_hfl
    owe_one_exact_batch(root, forgetting="interim")
    printed = call_cli(root, "status", "--scenario", SCENARIO)
    assert printed.status in (0, 9), printed.err  # 9: only if this machine's clock is past the deadline
    [line] = [line for line in printed.out.splitlines() if "pending retirement" in line]
    assert line.startswith("pending retirement: v1 (original) learnt 1 batch(es) not all exactly forgotten")
    assert line.endswith("due by 2026-12-28 00:00Z"), line
    assert "**" not in line  # rendered for a terminal, not markdown


def test_benchmark_originals_trained_on_the_deleted_data_retire_too(trained_digits_hfl):
    """artifacts/originals/: the original cached on the data the batch deleted from goes (its record
    stays, its windows are looked for), one on the data after it stays, one cached without provenance
    goes with the retirement."""
    import json

    import torch

    from fedunlearn.benchmark import cache
    from fedunlearn.federation.cost import Cost
    from fedunlearn.training import TrainedModel
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    ws = Workspace.open(root)
    before = ws.registry.version(SCENARIO, "1").tags["data_version"]
    torch.manual_seed(0)
    for key, data_version in (("learnt", before), ("after", "after-" + before), ("legacy", before)):
        cache.save_original(root, key, TrainedModel({"w": torch.randn(32, 32)}, Cost()), SCENARIO, data_version)
    legacy = root / cache.CACHE_DIR / "legacy.json"
    legacy.write_text(json.dumps({"cost": {}, "history": []}))  # as cached before provenance was recorded
    shutil.copy(root / cache.CACHE_DIR / "learnt.pt", root / "data" / "kept-original.pt")
    ws.registry.remove_alias(SCENARIO, "current")

    done = retire_forgotten.fn(ws, SCENARIO)

    assert sorted(p.name for p in (root / cache.CACHE_DIR).glob("*.pt")) == ["after.pt"]
    assert done.benchmark_originals == {"artifacts/originals/learnt.pt": batch_id,
                                        "artifacts/originals/legacy.pt": "a retirement (no provenance recorded)"}
    assert json.loads((root / cache.CACHE_DIR / "learnt.json").read_text())["retired_by"] == batch_id
    assert cache.load_original(root, "learnt", torch.device("cpu")) is None  # the next benchmark trains again
    assert done.check.weights_found[f"{SCENARIO} benchmark original learnt"] == ["data/kept-original.pt"]


def test_the_month_of_traffic_counts_retired_versions_and_names_one_missed(trained_digits_hfl, monkeypatch):
    """scripts/month_of_traffic.py's end-of-month check: a version owing only exactly forgotten requests
    that kept its weights is named as missed; once retired it is counted."""
    import importlib

    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "scripts"))
    month = importlib.import_module("month_of_traffic")
    root = trained_digits_hfl
    owe_one_exact_batch(root)
    ws = Workspace.open(root)
    ws.registry.remove_alias(SCENARIO, "current")
    assert month.retirement_counts(root, SCENARIO) == {"retired_versions": 0, "pending_retirement": 0,
                                                        "retirement_missed": ["1"]}
    retire_forgotten.fn(ws, SCENARIO)
    assert month.retirement_counts(root, SCENARIO) == {"retired_versions": 1, "pending_retirement": 0,
                                                        "retirement_missed": []}


def test_hold_refuses_a_version_that_does_not_exist(trained_digits_hfl):
    from workspaces import call_cli

    refused = call_cli(trained_digits_hfl, "hold", "7", "--scenario", SCENARIO, "--reason", "audit")
    assert refused.status == 2 and "has no version 7" in refused.err


def test_ids_into_a_closed_pipe_ends_quietly(trained_digits_hfl):
    """`fedunlearn ids | head -3`: the reader going away is no lost Prefect server."""
    reader, writer = os.pipe()
    os.close(reader)
    ran = subprocess.run([sys.executable, "-m", "cli", "--root", str(trained_digits_hfl), "ids", "--scenario",
                          SCENARIO], stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(writer)
    assert ran.returncode == 141 and ran.stderr == ""
