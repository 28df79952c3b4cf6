"""Issue 58: the Merkle log signs only what its records back, every command that signs or tags
verifies first and writes nothing on damage, retirement's leaf survives a kill, and `status` is the
health check. The leaf checks on facts alone; the commands on a copy of the session's trained
digits-hfl workspace with a batch written as its journal and receipt (tests/test_retirement.py)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fedunlearn.receipts import ExactForgetting
from fedunlearn.transparency.backing import Backing, VersionView, unbacked_leaves
from fedunlearn.transparency.log import LOG_DIR, LeafRecord, TransparencyLog, batch_leaf, exact_leaf
from fedunlearn.transparency.statements import canonical
from test_receipts import make_receipt
from test_retirement import SCENARIO, owe_one_exact_batch, weights_files
from workspaces import call_cli

DONE = ExactForgetting(at=datetime(2026, 12, 1, tzinfo=timezone.utc), version="3", by="exact retrain")


def views(*versions: VersionView) -> dict[tuple[str, str], VersionView]:
    return {(v.scenario, v.version): v for v in versions}


# --- item 1: each leaf kind against its record ---------------------------------------------------------

def test_a_forged_exact_leaf_is_named_and_an_honest_one_passes():
    interim = make_receipt(promoted=True).model_copy(update={"forgetting": "interim"})
    repaid = interim.model_copy(update={"exactly_forgotten": DONE})
    forged = LeafRecord(5, "exact", interim.batch_id, exact_leaf(repaid, lambda s, v: "d" * 64))
    registry = views(VersionView("digits-hfl", "2", "unlearned", "interim"))
    backing = Backing({interim.batch_id: interim}, frozenset({interim.batch_id}), registry)
    [found] = unbacked_leaves([forged], backing)
    assert (found.index, found.kind) == (5, "exact") and "does not say it was forgotten exactly" in found.missing
    assert found.line().startswith("leaf 5 (exact batch-1) is backed by no record")

    honest = Backing({repaid.batch_id: repaid}, frozenset({repaid.batch_id}), registry)
    [absent] = unbacked_leaves([forged], honest)
    assert "digits-hfl v3, is not registered" in absent.missing  # the version the leaf names does not exist
    exact_v3 = views(*registry.values(), VersionView("digits-hfl", "3", "retrained", "exact"))
    assert unbacked_leaves([forged], Backing(honest.receipts, honest.batch_records, exact_v3,
                                             lambda s, v: "d" * 64)) == []
    [other] = unbacked_leaves([forged], Backing(honest.receipts, honest.batch_records, exact_v3,
                                                lambda s, v: "e" * 64))
    assert "have digest eeeeeeeeeeee" in other.missing
    interim_v3 = views(VersionView("digits-hfl", "3", "unlearned", "interim"))
    [not_exact] = unbacked_leaves([forged], Backing(honest.receipts, honest.batch_records, interim_v3))
    assert "is no exact retrain and not formal" in not_exact.missing


def test_a_batch_leaf_must_read_as_its_receipt_and_its_batch_record_must_exist():
    receipt = make_receipt(promoted=True).model_copy(update={"forgetting": "interim"})
    leaf = LeafRecord(3, "batch", receipt.batch_id, batch_leaf(receipt, None))
    registry = views(VersionView("digits-hfl", "2", "unlearned", "interim"))
    assert unbacked_leaves([leaf], Backing({receipt.batch_id: receipt}, frozenset({receipt.batch_id}), registry)) == []
    edited = receipt.model_copy(update={"forgetting": "exact"})  # "forgetting: exact" set inside the receipt
    [found] = unbacked_leaves([leaf], Backing({receipt.batch_id: edited}, frozenset({receipt.batch_id}), registry))
    assert "its receipt says otherwise (forgetting)" in found.missing
    [found] = unbacked_leaves([leaf], Backing({receipt.batch_id: receipt}, frozenset(), registry))
    assert "no batch record of batch-1" in found.missing
    [found] = unbacked_leaves([leaf], Backing({}, frozenset(), registry))
    assert "no receipt of batch batch-1" in found.missing


def test_retirement_and_hold_leaves_must_match_the_registrys_tags():
    retirement = LeafRecord(7, "retirement", "digits-hfl v1", canonical({
        "type": "fedunlearn.retirement@v1", "scenario": "digits-hfl", "version": "1", "retired_by": "b1",
        "weights_sha256": "a" * 64, "at": "2026-12-01T00:00:00+00:00"}))
    hold = LeafRecord(8, "hold", "digits-hfl v1", canonical({
        "type": "fedunlearn.hold@v1", "scenario": "digits-hfl", "version": "1", "reason": "audit", "at": None}))
    live = views(VersionView("digits-hfl", "1", "original"))
    found = unbacked_leaves([retirement, hold], Backing(versions=live))
    assert [(f.index, f.kind) for f in found] == [(7, "retirement"), (8, "hold")]
    assert "is not retired in the registry" in found[0].missing and "carries no hold tag" in found[1].missing
    retired = views(VersionView("digits-hfl", "1", "original", retirement="retired", retired_by="b1",
                                weights_sha256="a" * 64, hold="audit"))
    assert unbacked_leaves([retirement, hold], Backing(versions=retired)) == []
    unknown = LeafRecord(9, "pad", "x", b"{}")
    assert "is no statement fedunlearn writes" in unbacked_leaves([unknown], Backing())[0].missing


# --- items 1 and 2: the commands refuse and write nothing -------------------------------------------------

def snapshot(root: Path) -> tuple[dict[str, bytes], dict[str, dict[str, str]]]:
    """The log's files and every version's tags: what "nothing written" compares."""
    from stores.workspace import Workspace

    files = {p.name: p.read_bytes() for p in (root / LOG_DIR).iterdir() if p.is_file() and p.name != ".lock"}
    tags = {str(v.version): dict(v.tags) for v in Workspace.open(root).registry.versions(SCENARIO)}
    return files, tags


def logged_interim(root: Path) -> str:
    """The workspace's batch, forgotten only approximately, logged and signed as a batch leaves it."""
    from stores.transparency import publish_tree_head

    batch_id = owe_one_exact_batch(root, forgetting="interim")
    publish_tree_head(root)
    return batch_id


def append_leaf(root: Path, kind: str, key: str, leaf: bytes) -> int:
    log = TransparencyLog(root)
    index = len(log.records())
    with open(log.leaves_path, "a") as handle:
        handle.write(LeafRecord(index, kind, key, leaf).line() + "\n")
    return index


@pytest.mark.parametrize("forgery", ["exact", "retirement"])
def test_a_forged_leaf_is_refused_by_every_command_and_nothing_is_signed(trained_digits_hfl, tmp_path, forgery):
    from fedunlearn.receipts import read_receipt

    root = trained_digits_hfl
    batch_id = logged_interim(root)
    if forgery == "exact":  # another workspace's repaid batch, "by version 3"
        repaid = read_receipt(root, batch_id).model_copy(update={"exactly_forgotten": DONE})
        index = append_leaf(root, "exact", batch_id, exact_leaf(repaid, lambda s, v: "d" * 64))
    else:
        index = append_leaf(root, "retirement", f"{SCENARIO} v1", canonical({
            "type": "fedunlearn.retirement@v1", "scenario": SCENARIO, "version": "1", "retired_by": batch_id,
            "weights_sha256": "a" * 64, "at": "2026-12-01T00:00:00+00:00"}))
    before = snapshot(root)
    named = f"leaf {index} ({forgery} "

    verified = call_cli(root, "ledger", "verify")
    assert verified.status == 4 and named in verified.out and "intact" != verified.out.splitlines()[-1], verified.out
    out = tmp_path / "r.tlog-proof"
    for command in (["receipt", "req-retire-1", "--out", str(out)], ["hold", "1", "--reason", "audit",
                                                                    "--scenario", SCENARIO]):
        printed = call_cli(root, *command)
        assert printed.status == 4 and named in printed.err and printed.err.count("\n") == 1, printed
    assert "Nothing was written" in printed.err
    status = call_cli(root, "status", "--scenario", SCENARIO)
    assert status.status == 4 and named in status.out and "fix:" in status.out, status.out
    assert not out.exists() and snapshot(root) == before


@pytest.mark.parametrize("damaged", ["leaves.jsonl", "checkpoint"])
def test_hold_on_a_damaged_log_writes_nothing_and_keeps_the_evidence(trained_digits_hfl, damaged):
    root = trained_digits_hfl
    logged_interim(root)
    path = root / LOG_DIR / damaged
    data = bytearray(path.read_bytes())
    at = data.index(b'"leaf": "') + 30 if damaged == "leaves.jsonl" else len(data) - 10  # inside a leaf, a signature
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    path.write_bytes(bytes(data))
    before = snapshot(root)

    held = call_cli(root, "hold", "1", "--reason", "audit", "--scenario", SCENARIO)

    assert held.status == 4 and "Nothing was written: no tag, no leaf, no tree head" in held.err, held
    assert snapshot(root) == before  # no hold tag, no leaf, no new head: the damage is still there to see
    assert call_cli(root, "ledger", "verify").status == 4


def test_process_refuses_a_forged_leaf_before_it_takes_anything(trained_digits_hfl, prefect_server):
    """On the session's Prefect server (the flow's own would start one: most of a minute)."""
    root = trained_digits_hfl
    batch_id = logged_interim(root)
    from fedunlearn.receipts import read_receipt

    repaid = read_receipt(root, batch_id).model_copy(update={"exactly_forgotten": DONE})
    index = append_leaf(root, "exact", batch_id, exact_leaf(repaid, lambda s, v: "d" * 64))
    before = snapshot(root)
    printed = call_cli(root, "process", "--scenario", SCENARIO)
    assert printed.status == 4 and f"leaf {index} (exact " in printed.err, printed
    assert snapshot(root) == before


# --- item 3: retirement survives a kill, missing weights are recorded as gone -----------------------------

def test_a_retired_version_without_its_leaf_gets_it_from_the_next_run(trained_digits_hfl):
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    ws = Workspace.open(root)
    ws.registry.remove_alias(SCENARIO, "current")
    ws.registry.retire(SCENARIO, "1", batch_id)  # a run killed after `retired`, before its leaf
    assert retire_forgotten.fn(ws, SCENARIO).versions == {}  # nothing left to retire ...
    [leaf] = [r for r in TransparencyLog(root).records() if r.kind == "retirement"]  # ... and the leaf is there
    assert leaf.key == f"{SCENARIO} v1" and json.loads(leaf.leaf)["retired_by"] == batch_id
    assert json.loads(leaf.leaf)["weights_sha256"] == ws.registry.version(SCENARIO, "1").tags["weights_sha256"]
    assert call_cli(root, "ledger", "verify").status == 0


def test_missing_weights_of_a_version_due_to_retire_are_recorded_as_gone(trained_digits_hfl):
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root)
    ws = Workspace.open(root)
    ws.registry.remove_alias(SCENARIO, "current")
    for directory in {p.parent for p in weights_files(root) if "weights" in p.parts}:
        shutil.rmtree(directory, ignore_errors=True)  # `weights/` removed by hand
    status = call_cli(root, "status", "--scenario", SCENARIO)
    assert "due to retire now: v1 (original)" in status.out, status.out  # due, still listed as holding them

    assert retire_forgotten.fn(ws, SCENARIO).versions == {"1": batch_id}
    tags = ws.registry.version(SCENARIO, "1").tags
    assert tags["retirement"] == "retired" and tags.get("weights_missing") and "weights_sha256" not in tags
    assert retire_forgotten.fn(ws, SCENARIO).versions == {}  # done: no failure loop
    status = call_cli(root, "status", "--scenario", SCENARIO)
    assert "v1: its weights were already gone when it retired" in status.out, status.out
    assert "due to retire now" not in status.out


# --- item 4: status is the health check ------------------------------------------------------------------

def test_status_names_a_version_that_must_not_serve_with_its_fix(trained_digits_hfl):
    from mlflow import MlflowClient

    from stores.registry.runs import tracking_uri
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    root = trained_digits_hfl
    owe_one_exact_batch(root)  # its deletion forgotten exactly ...
    client = MlflowClient(tracking_uri(root), tracking_uri(root))  # the registry too: never the process-wide one
    client.set_registered_model_alias(SCENARIO, "current", "1")  # ... and current moved to the original by hand
    printed = call_cli(root, "status", "--scenario", SCENARIO)
    assert printed.status == 4, printed
    assert f"WRONG VERSION SERVING: alias current is on {SCENARIO} v1, which learnt the samples of" in printed.out
    assert "fix: point current at" in printed.out

    ws = Workspace.open(root)
    ws.registry.remove_alias(SCENARIO, "current")
    retire_forgotten.fn(ws, SCENARIO)
    client.set_registered_model_alias(SCENARIO, "current", "1")  # the retired version, by hand
    printed = call_cli(root, "status", "--scenario", SCENARIO)
    assert printed.status == 4 and "which was retired by" in printed.out, printed.out


def test_status_shows_an_unverified_erasure_and_a_damaged_receipt(trained_digits_hfl):
    from fedunlearn.receipts import receipt_path
    from fedunlearn.requests.batch import load_records
    from fedunlearn.requests.erasure import ErasureReport
    from stores.workspace import Workspace

    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root, forgetting="interim")
    ws = Workspace.open(root)
    [record] = [r for r in load_records(ws.folders) if r.batch_id == batch_id]
    record.model_copy(update={"erasure": ErasureReport(
        verified=False, deleted_samples=1, checked_samples=1, not_verifiable={},
        found={"digits-00002": ["data/users-copy.csv"]}, scanned=["data"], files_scanned=1, bytes_scanned=1,
        scope="test")}).save(ws.folders)
    printed = call_cli(root, "status", "--scenario", SCENARIO)
    assert printed.status == 4, printed
    assert f"ERASURE NOT VERIFIED for {batch_id}: 1 deleted sample(s) still in data/users-copy.csv" in printed.out
    assert "fix: delete those copies" in printed.out

    receipt_path(root, batch_id).write_text("{")
    printed = call_cli(root, "status", "--scenario", SCENARIO)
    assert printed.status == 4 and str(receipt_path(root, batch_id)) in printed.err, printed
    assert printed.err.count("\n") == 1


def current_moved_by_hand(root: Path, to: str) -> str:
    """The workspace's batch forgotten exactly, then alias current moved with MLflow's own client (no
    fedunlearn check in the way) to the original that learnt it (``to="original"``) or, once retired,
    to it all the same (``to="retired"``)."""
    from mlflow import MlflowClient

    from stores.registry.runs import tracking_uri
    from stores.workspace import Workspace
    from tasks.retirement import retire_forgotten

    batch_id = owe_one_exact_batch(root)
    if to == "retired":
        ws = Workspace.open(root)
        ws.registry.remove_alias(SCENARIO, "current")
        assert retire_forgotten.fn(ws, SCENARIO).versions == {"1": batch_id}
    MlflowClient(tracking_uri(root), tracking_uri(root)).set_registered_model_alias(SCENARIO, "current", "1")
    return batch_id


@pytest.mark.parametrize("to", ["original", "retired"])
def test_process_refuses_to_build_on_a_current_moved_by_hand_and_takes_nothing(trained_digits_hfl, prefect_server, to):
    """The batch's source is read from current first: a version that must not serve is refused before
    a request is taken (the retired one used to fail the batch after taking them, the original to be
    unlearned from)."""
    from fedunlearn.requests.batch import load_records
    from stores.workspace import Workspace

    root = trained_digits_hfl
    current_moved_by_hand(root, to)
    asked = call_cli(root, "request", "samples", "--scenario", SCENARIO, "--ids", "digits-00008")
    assert asked.status == 0, asked.err
    inbox = sorted(p.name for p in (root / "data" / "deletion_requests" / "inbox").iterdir())
    batches, before = len(load_records(Workspace.open(root).folders)), snapshot(root)

    printed = call_cli(root, "process", "--scenario", SCENARIO)

    assert printed.status == 4, printed
    assert f"alias current is on {SCENARIO} v1, which " in printed.err and "Nothing was written" in printed.err
    assert "Fix: point current at" in printed.err and printed.err.count("\n") == 1, printed.err
    assert sorted(p.name for p in (root / "data" / "deletion_requests" / "inbox").iterdir()) == inbox
    assert len(load_records(Workspace.open(root).folders)) == batches and snapshot(root) == before


def test_a_repayment_in_shards_keeps_nothing_from_a_current_moved_by_hand(trained_digits_hfl, monkeypatch):
    """The shards not due are kept from current: on a version that must not serve, nothing is trained."""
    import torch

    import flows.debt
    from fedunlearn.errors import StateDamaged
    from fedunlearn.shard_debt import ShardRepayment
    from stores.workspace import ScenarioScope, Workspace

    root = trained_digits_hfl
    current_moved_by_hand(root, "original")
    trained = []
    monkeypatch.setattr(flows.debt, "train_model", lambda *args, **kwargs: trained.append(args))
    scope = ScenarioScope(Workspace.open(root), SCENARIO)
    repayment = flows.debt.read_repayment.fn(scope, only_due=True)
    before = snapshot(root)
    with pytest.raises(StateDamaged, match=f"repay-debt --scenario {SCENARIO}` refused: alias current is on "
                                           f"{SCENARIO} v1, which learnt the samples of"):
        flows.debt.repay_shards(scope, torch.device("cpu"), "D", repayment,
                                ShardRepayment(frozenset({0}), frozenset({1})))
    assert trained == [] and snapshot(root) == before


def test_process_leaves_a_damaged_batch_record_to_its_intake_which_names_the_requests(trained_digits_hfl,
                                                                                     prefect_server):
    """The check of current reads the batch records: a truncated one is the intake's to report (the
    ledger's damage, the batch's requests, `ledger repair`), not a bare record error."""
    root = trained_digits_hfl
    batch_id = owe_one_exact_batch(root, forgetting="interim")
    ledger = root / "data" / "ledger" / "ledger.jsonl"
    ledger.write_bytes(ledger.read_bytes()[:-20])
    record = root / "data" / "deletion_requests" / "batches" / f"{batch_id}.json"
    record.write_text(record.read_text()[:100])
    printed = call_cli(root, "process", "--scenario", SCENARIO)
    assert printed.status == 4 and "req-retire-1" in printed.err and "fedunlearn ledger repair" in printed.err, printed
