"""Stage ``promote-and-receipt`` of ``process-deletions``: alias ``current`` to the attempt chosen,
the erasure scan of every store, the receipt (assembled by ``fedunlearn.batch_decisions.receipt_for``)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.batch_decisions import BatchOutcome, receipt_for, tier_fields
from fedunlearn.config import ForgettingPolicy
from fedunlearn.faults import failpoint
from fedunlearn.receipts import Receipt
from fedunlearn.requests.batch import load_records, record_path
from stores.workspace import Workspace
from tasks.backup import sync_state
from tasks.debt import FORGETTING_TAG, mark_repaid, safe_start
from tasks.receipts import write_receipt
from tasks.requests import capture_fingerprints, release_fingerprints, scan_stores


@task(name="promote-and-receipt", task_run_name="promote-and-receipt", cache_policy=NO_CACHE)
def promote_and_receipt(root: str, scenario: str, batch_id: str, outcome: BatchOutcome,
                        policy: ForgettingPolicy = ForgettingPolicy.interim) -> tuple[Receipt, Any]:
    """Alias ``current`` to the attempt chosen (its version tagged with its tier, ``forgetting``), the
    erasure scan of every store (now that the batch registered its versions and logged its runs),
    the receipt. With a default DVC remote the data versions and the state are on it before the
    alias moves, and again with the receipt."""
    ws = Workspace.open(root)
    [record] = [r for r in load_records(ws.folders) if r.batch_id == batch_id]
    chosen = outcome.chosen
    # With a default DVC remote, the new data version and the ledger are there before `current` moves
    # (pushed after the ingest steps; again here if that push was not made): a failed push fails the batch.
    sync_state(ws.root, f"batch {batch_id}: before alias current moves")
    tier = tier_fields(record.deadlines(ws.params.requests.deadline_days), chosen.certificate, policy,
                       lambda due: safe_start(ws, scenario, due))
    ws.registry.set_version_tag(scenario, chosen.version.version, FORGETTING_TAG, tier["forgetting"])
    ws.registry.set_alias(scenario, "current", chosen.version.version)
    failpoint("after-alias-move")
    erasure = scan_stores(ws, record.purged, capture_fingerprints(ws, record))
    release_fingerprints(ws, batch_id)
    aliases = {"original": ws.registry.alias_ref(scenario, "original"),
               "current": ws.registry.alias_ref(scenario, "current")}
    receipt = receipt_for(record, outcome, aliases, erasure.model_dump(mode="json"), tier,
                          ws.relative(record_path(ws.folders, batch_id)))
    path = write_receipt(ws, receipt)
    if chosen.method == "retrain":  # an exact retrain serves: it repays what earlier batches forgot approximately
        mark_repaid(ws, scenario, chosen.version.version, f"batch {batch_id}")
    sync_state(ws.root, f"batch {batch_id}: receipt")
    failpoint("after-receipt")
    return receipt, path
