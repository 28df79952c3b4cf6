"""Stage ``promote-and-receipt`` of ``process-deletions``: alias ``current`` to the attempt chosen,
the erasure scan of every store, the receipt (assembled by ``fedunlearn.batch_receipts.receipt_for``).
What the batch owes after its receipt — repaid receipts marked, the log's signed head, the debt —
is stage ``finish-batch`` (``flows.finish``)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from fedunlearn.batch_receipts import receipt_for, tier_fields
from fedunlearn.retrain_debt import racing_retrain
from fedunlearn.certify.certificate import EXACT_RETRAIN
from fedunlearn.faults import failpoint
from fedunlearn.receipts import ExactForgetting, ModelRef, read_receipt
from fedunlearn.requests.batch import BatchRecord, record_path
from fedunlearn.requests.model import utc_now
from flows.batch import Receipted, Unlearned
from stores.registry import version_ref
from stores.workspace import ScenarioScope, Workspace
from tasks.backup import sync_state
from tasks.debt import FORGETTING_TAG, safe_start
from tasks.erasure import capture_fingerprints, scan_stores
from tasks.models import move_alias, tag_version
from tasks.receipts import write_receipt
from tasks.shards import exact_statement
from tasks.siblings import serving_siblings


def exact_retrain_on(ws: Workspace, record: BatchRecord) -> ModelRef | None:
    """``retrain_debt.racing_retrain`` among the retrained versions on the batch's data version."""
    found = {str(v.version): v for v in ws.registry.versions(record.scenario, role="retrained",
                                                             data_version=record.data_version_after)}
    racing = racing_retrain({k: v.tags.get("batch_id") for k, v in found.items()}, record.batch_id)
    return version_ref(found[racing]) if racing else None


@task(name="promote-and-receipt", task_run_name="promote-and-receipt", cache_policy=NO_CACHE)
def promote_and_receipt(scope: ScenarioScope, unlearned: Unlearned) -> Receipted:
    """Alias ``current`` to the attempt chosen (its version tagged with its tier, ``forgetting``), the
    erasure scan of every store (now that the batch registered its versions and logged its runs),
    the receipt. With a default DVC remote the data versions and the state are on it before the
    alias moves (and again once the receipt is logged: ``flows.finish``)."""
    batch, unlearning = unlearned.batch, unlearned.unlearning
    ws, record, forgetting = scope.ws, batch.record, batch.forgetting
    scenario, batch_id = record.scenario, record.batch_id
    chosen = unlearning.chosen
    # With a default DVC remote, the new data version and the ledger are there before `current` moves
    # (pushed after the ingest steps; again here if that push was not made): a failed push fails the batch.
    sync_state(ws.root, f"{batch_id}: before alias current moves")
    deadlines = record.deadlines(ws.params.requests.deadline_days)
    tier = tier_fields(deadlines, chosen.certificate, forgetting, lambda due: safe_start(ws, scenario, due))
    tag_version(ws, scenario, chosen.version.version, FORGETTING_TAG, tier.forgetting)
    exact = exact_retrain_on(ws, record) if tier.interim else None
    if exact is not None:
        tier = tier_fields(deadlines, EXACT_RETRAIN, forgetting, lambda due: safe_start(ws, scenario, due))
        tag_version(ws, scenario, exact.version, FORGETTING_TAG, tier.forgetting)
        get_run_logger().warning("%s v%s, an exact retrain on the batch's data version %s, was registered while the "
                                 "batch ran: it serves instead of the interim v%s", scenario, exact.version,
                                 record.data_version_after, chosen.version.version)
    move_alias(ws, scenario, "current", (exact or chosen.version).version)
    failpoint("after-alias-move")
    erasure = scan_stores(ws, record.purged, batch.fingerprints or capture_fingerprints(ws, record),
                          batch.found_clean, record)
    aliases = {"original": ws.registry.alias_ref(scenario, "original"),
               "current": ws.registry.alias_ref(scenario, "current")}
    receipt = receipt_for(record, unlearning, aliases, erasure.model_dump(mode="json"), tier,
                          ws.relative(record_path(ws.folders, batch_id)))
    if exact is not None:
        receipt.exactly_forgotten = ExactForgetting(at=utc_now(), version=exact.version, by="retrain-reference")
    receipt.exact_shards = exact_statement(ws, scenario, (exact or chosen.version).version)
    # Every model version that stops serving the data: the sibling scenarios' too (tasks.siblings).
    receipt.siblings, receipt.applied_by = serving_siblings(ws, batch_id), list(record.applied_by)
    earlier = read_receipt(ws.root, batch_id)
    if earlier is not None:  # a resumed batch (its record rebuilt) keeps the receipt's time the log signed
        receipt.created_at = earlier.created_at
    path = write_receipt(ws, receipt)
    # From here the batch is receipted; what it still owes (repaid receipts, log, debt, status) is the
    # next stage's, which a re-run after a crash here completes (flows.finish).
    failpoint("after-receipt")
    return Receipted(record, receipt, path, batch.device, batch.warnings)
