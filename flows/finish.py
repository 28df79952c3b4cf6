"""Stage ``finish-batch`` of ``process-deletions``: what a batch still owes once its receipt is
written, in this order:

    receipts the batch's exact retrain repays marked ``exactly_forgotten``
    ─▶ the Merkle log's leaves (the batch, its exact-forgetting statements) and a signed head,
       published to the DVC remote and MLflow ─▶ the state snapshot pushed
    ─▶ ``processed`` events ─▶ retrain debt repaid now, scheduled, or nothing
    ─▶ the versions whose learnt requests are all exactly forgotten retired ─▶ status artifact
    ─▶ the batch recorded finished (``BatchRecord.finished_at``)

A batch is finished only when every step is done. Each step reads what it needs from the stores and
changes nothing when its work is already there (a receipt marked, a leaf logged, a run scheduled
under its idempotency key, a debt repaid), so a run killed anywhere after the receipt is completed
by the next one, which finds the batch unfinished (``tasks.progress.unfinished_end``) and runs the
same steps again, in the same order, before anything else.
"""

from __future__ import annotations


from dataclasses import replace
from datetime import datetime

from prefect import get_run_logger

from fedunlearn.retrain_debt import DebtAction, debt_action, repaying_version
from fedunlearn.faults import failpoint
from fedunlearn.receipts import Receipt
from fedunlearn.requests.model import utc_now
from flows.batch import Receipted, Settled
from flows.debt import measure_repaid, read_repayment, repay_debt, shards_due
from runtime.events import announce_owed, announce_processed
from stores.workspace import ScenarioScope
from tasks.backup import sync_state
from tasks.debt import REPAY_DEPLOYMENT, Debt, mark_repaid, retrain_debt, schedule_repayment
from tasks.progress import mark_finished
from tasks.retirement import retire_forgotten
from tasks.siblings import note_forgotten, open_siblings
from tasks.status import publish_status
from tasks.transparency import publish_tree_head_task


def finish_batch(scope: ScenarioScope, receipted: Receipted) -> Settled:
    """The end steps of the batch ``receipted`` closes (module docstring), for a caller that holds the
    batch lock: after its receipt in the same run, or in the next run after a crash. Settled with its
    receipt as the end steps left it (marked repaid, retirements noted)."""
    ws, scenario, receipt = scope.ws, scope.scenario, receipted.receipt
    batch_id = receipt.batch_id
    current = ws.registry.alias_ref(scenario, "current")
    repaying = repaying_version(receipt, current.version if current else None)
    if repaying is not None:  # an exact retrain serves: it repays every earlier batch's debt
        mark_repaid(ws, scenario, repaying, f"batch {batch_id}")
    note_forgotten(ws, receipt)  # a sibling's batch: the receipts that owed it name the version that forgot
    serving = receipt.models.get("current")
    # Signed before the state is pushed, so the snapshot on the remote carries the head that logs this batch.
    publish_tree_head_task(ws.root, serving.run_id if serving else None)
    sync_state(ws.root, f"{batch_id}: receipt")
    failpoint("after-tree-head")
    announce_processed(receipt.request_ids, scenario, "forgotten", batch_id)
    debt, exact_run, repaid = settle_debt(scope, receipted)
    retired = retire_forgotten(ws, scenario)  # after an exact forgetting, the versions that learnt it lose their weights
    owed = tell_siblings(scope, receipt)
    publish_status(scope)
    mark_finished(ws, batch_id)
    rewritten = [retired.receipts.get(batch_id), *(r for r in repaid if r.batch_id == batch_id)]
    latest = next((r for r in rewritten if r is not None), receipt)
    return Settled(replace(receipted, receipt=latest), debt, exact_run, tuple(owed))


def tell_siblings(scope: ScenarioScope, receipt: Receipt) -> list[str]:
    """The dataset's other scenarios that still serve samples this batch deleted: said (returned, and
    in the run's log), with the command that forgets them, and announced, so that their served
    deletion batches start."""
    ws, lines = scope.ws, []
    for record in open_siblings(ws, scope.config.dataset):
        if receipt.batch_id not in record.applied_by:
            continue
        due = min(record.deadlines(ws.params.requests.deadline_days).values())
        lines.append(f"{record.scenario} still serves the samples of {len(record.requests)} request(s) deleted here: "
                     f"its model learnt them, so it owes their forgetting ({record.batch_id}, due by "
                     f"{due:%Y-%m-%d %H:%M}Z); run `fedunlearn process --scenario {record.scenario}`")
        get_run_logger().warning("%s", lines[-1])
        announce_owed([e.request_id for e in record.requests], record.scenario, record.batch_id, due,
                      ws.params.requests.urgent_hours)
    return lines


def settle_debt(scope: ScenarioScope, receipted: Receipted) -> tuple[Debt, str | None, list[Receipt]]:
    """After a batch: repay the retrain debt now when it passed ``requests.max_retrain_debt`` or its
    latest safe time has come; otherwise have Prefect start the repaying run at that time (a
    scheduled run of ``repay-retrain-debt``, when that deployment is served). Returns the debt left,
    what was done about it, and the receipts a repayment rewrote."""
    ws, scenario = scope.ws, scope.scenario
    repayment = read_repayment(scope)
    debt, start_by = repayment.debt, repayment.start_by
    action = debt_action(debt.requests, ws.params.requests.max_retrain_debt, start_by, utc_now())
    if action in (DebtAction.repay, DebtAction.repay_due):
        repayment = replace(repayment, only_due=action is DebtAction.repay_due)
        repaid = repay_debt(scope, receipted.device, receipted.record.data_version_after, repayment,
                            shards_due(repayment, utc_now()))
        measure_repaid(scope, repayment, repaid, receipted.device)
        return retrain_debt(ws, scenario), "repaid in this run", repaid.receipts
    if action is DebtAction.nothing:
        return debt, None, []
    scheduled = schedule_repayment(ws, scenario, start_by)
    if scheduled is None:
        print(f"exact forgetting due by {debt.due:%Y-%m-%d %H:%M}Z: no repay-retrain-debt deployment is served, so "
              f"run `fedunlearn repay-debt --scenario {scenario}` before {start_by:%Y-%m-%d %H:%M}Z, the retrain debt's "
              "latest safe start (make serve schedules it)")
        return debt, unscheduled(scenario, start_by, debt.due), []
    return debt, f"scheduled: flow run {scheduled} of {REPAY_DEPLOYMENT} at {start_by:%Y-%m-%d %H:%M}Z", []


def unscheduled(scenario: str, start_by: datetime, due: datetime | None) -> str:
    """What to run when no served deployment repays the debt, its time named as the debt's: a batch's
    receipt names its own latest safe start, which may be later."""
    earliest = f"for its earliest deadline, {due:%Y-%m-%d %H:%M}Z, " if due else ""
    return (f"not scheduled (no repay-retrain-debt deployment is served): run `fedunlearn repay-debt --scenario "
            f"{scenario}` before {start_by:%Y-%m-%d %H:%M}Z (the retrain debt's latest safe start: {earliest}over "
            "every batch it owes)")


def resume_end(scope: ScenarioScope, receipted: Receipted) -> Settled:
    """The end steps of a batch an earlier run receipted and did not finish, said and done."""
    get_run_logger().warning("finishing %s, whose receipt an earlier run wrote before it stopped: its log, repaid "
                             "receipts, retrain debt and status", receipted.record.batch_id)
    return finish_batch(scope, receipted)
