"""Retrain debt: requests forgotten only on the interim tier (a certificate other than ``exact
retrain`` or ``formal (ε,δ)``) are a stop-gap until an exact retrain on a data version without
them serves, before their deadlines (``certify.tiers``). The receipts are the ledger of the debt;
repaying it marks them (``exactly_forgotten``). ``schedule_repayment`` asks Prefect to start the
``repay-retrain-debt`` deployment at the latest safe time: a scheduled flow run, no loop of ours."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.states import Scheduled

from fedunlearn.batch_receipts import receipt_closed_by_retrain
from fedunlearn.retrain_debt import late_start
from fedunlearn.certify.tiers import exact_due, latest_safe_time
from fedunlearn.receipts import (ExactForgetting, ModelRef, Receipt, owes_retrain, read_receipt, read_receipts,
                                 write_receipt)
from fedunlearn.requests.batch import BatchRecord, BatchStatus, load_records, record_path
from fedunlearn.requests.model import utc_now
from fedunlearn.shard_debt import ShardOwed, repaid_statement, touched_shards
from fedunlearn.sharded_federation import assign_shards
from stores.transparency import publish_tree_head
from tasks.progress import mark_finished
from tasks.siblings import note_forgotten
from tasks.shards import exact_shards_of, exact_statement
from stores.workspace import Workspace
from tasks.erasure import capture_fingerprints, scan_stores

REPAY_DEPLOYMENT = "repay-retrain-debt/weekly"
FORGETTING_TAG = "forgetting"  # MLflow version tag: interim | exact | formal


@dataclass
class Debt:
    receipts: list[Receipt]

    @property
    def requests(self) -> int:
        return sum(len(r.request_ids) for r in self.receipts)

    @property
    def samples(self) -> int:
        return sum(r.deleted_samples for r in self.receipts)

    @property
    def due(self) -> datetime | None:
        """When exact forgetting is due: the earliest deadline of an owed request."""
        return exact_due(d for r in self.receipts for d in ([r.exact_due] if r.exact_due else r.deadlines.values()))

    def line(self, threshold: int) -> str:
        if not self.receipts:
            return "retrain debt: none (every request so far forgotten exactly or with a formal guarantee)"
        due = f"exact forgetting due by {self.due:%Y-%m-%d %H:%M}Z; " if self.due else ""
        return (f"retrain debt: {self.requests} request(s), {self.samples} sample(s) in {len(self.receipts)} batch(es) "
                f"forgotten only approximately since {self.receipts[0].created_at:%Y-%m-%d %H:%M}Z ({due}an exact "
                f"retrain repays it: before that deadline, weekly, or past {threshold} requests)")


def retrain_debt(ws: Workspace, scenario: str) -> Debt:
    return Debt([r for r in read_receipts(ws.root, scenario) if owes_retrain(r)])


def last_exact_seconds(ws: Workspace, scenario: str) -> float:
    """The measured duration of the scenario's last training from scratch (an exact retrain, or the
    original when none has run yet); 0 when none logged one. A federation in shards whose last retrain
    trained only some shards counts that duration per shard retrained, times every shard: the next
    retrain may owe them all, and a safe start must not come too late."""
    trained = [v for role in ("retrained", "repaid", "original") for v in ws.registry.versions(scenario, role=role)]
    for version in sorted(trained, key=lambda v: int(v.version), reverse=True):
        seconds = ws.registry.metrics(version.run_id).get("wall_seconds")
        if seconds is not None and math.isfinite(seconds):
            retrained = [s for s in version.tags.get("shards_retrained", "").split(",") if s.isdigit()]
            shards = int(version.tags.get("shards", "1"))
            return float(seconds) * (shards / len(retrained) if retrained else 1.0)
    return 0.0


def safe_start(ws: Workspace, scenario: str, due: datetime) -> datetime:
    """The latest safe time to start an exact retrain that must serve by ``due`` (``tiers.latest_safe_time``
    with params.yaml's safety factor and margin)."""
    requests = ws.params.requests
    return latest_safe_time(due, last_exact_seconds(ws, scenario), requests.exact_safety_factor,
                            timedelta(hours=requests.exact_margin_hours))


def repayment_time(ws: Workspace, scenario: str, debt: Debt) -> datetime | None:
    """When the exact retrain that repays ``debt`` must start (``safe_start``); None when nothing is owed."""
    return None if debt.due is None else safe_start(ws, scenario, debt.due)


def late_repayment(ws: Workspace, scenario: str, now: datetime | None = None) -> datetime | None:
    """``retrain_debt.late_start`` of ``scenario``'s retrain debt as the receipts record it."""
    return late_start(repayment_time(ws, scenario, retrain_debt(ws, scenario)), now or utc_now())


@task(name="schedule-exact-retrain", cache_policy=NO_CACHE)
def schedule_repayment(ws: Workspace, scenario: str, start_at: datetime) -> str | None:
    """A scheduled flow run of the ``repay-retrain-debt`` deployment at ``start_at`` (one per time:
    the idempotency key) that repays what is due then (``only_due``: a federation in shards retrains
    the shards due, the others wait); None when that deployment is not served (a command's own
    Prefect server). A run that finds the debt already repaid does nothing."""
    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(REPAY_DEPLOYMENT)
        except ObjectNotFound:
            return None
        run = client.create_flow_run_from_deployment(
            deployment.id, parameters={"scenario": scenario, "root": str(ws.root), "only_due": True},
            state=Scheduled(scheduled_time=start_at), tags=["exact-due"],
            idempotency_key=f"exact-due:{ws.root}:{scenario}:{start_at.isoformat()}")
    return str(run.id)


@task(name="repay-debt-receipts", cache_policy=NO_CACHE)
def mark_repaid(ws: Workspace, scenario: str, version: str, by: str) -> list[Receipt]:
    """The receipts the exact retrain ``version`` (now ``current``) repays say so; returns them as written."""
    repaid = []
    ws.registry.set_version_tag(scenario, version, FORGETTING_TAG, "exact")
    for receipt in retrain_debt(ws, scenario).receipts:
        receipt.exactly_forgotten = ExactForgetting(at=utc_now(), version=version, by=by)
        receipt.exact_shards = exact_statement(ws, scenario, version)
        write_receipt(ws.root, receipt)
        repaid.append(receipt)
    if repaid:  # the exact-forgetting statements go into the Merkle log under a newly signed head
        publish_tree_head(ws.root, ws.registry.version(scenario, version).run_id)
    return repaid


def shard_assignment(ws: Workspace, scenario: str) -> tuple[int, ...] | None:
    """Client → shard of a federation in shards (``sharded_federation.assign_shards``); None for one federation."""
    cfg = ws.scenario(scenario)
    return assign_shards(cfg.partition.num_clients, cfg.shards, ws.params.seed) if cfg.shards > 1 else None


def shard_debt(debt: Debt, shard_of: tuple[int, ...]) -> list[ShardOwed]:
    """Each owed batch's shards that still hold its samples approximately, and its latest safe start."""
    return [ShardOwed(r.batch_id, touched_shards(r.forgotten_per_client, shard_of) - {int(k) for k in r.shards_repaid},
                      r.exact_start_by) for r in debt.receipts]


@task(name="repay-shard-receipts", cache_policy=NO_CACHE)
def mark_shards_repaid(ws: Workspace, scenario: str, version: str, by: str, debt: Debt,
                       shard_of: tuple[int, ...]) -> list[Receipt]:
    """A partial repayment ``version`` (exact on the shards it retrained, the others kept) serves:
    alias ``current`` moves to it, and each receipt of ``debt`` records the touched shards it
    retrained — forgotten exactly once every touched shard is. Returns the receipts rewritten."""
    ws.registry.set_alias(scenario, "current", version)
    registered = ws.registry.version(scenario, version)
    exact, written, now = exact_shards_of(registered.tags), [], utc_now()
    for receipt in debt.receipts:
        touched = touched_shards(receipt.forgotten_per_client, shard_of)
        newly = (touched & exact) - {int(k) for k in receipt.shards_repaid}
        if not newly:
            continue
        receipt.shards_repaid = {**receipt.shards_repaid, **{str(k): version for k in sorted(newly)}}
        if touched <= {int(k) for k in receipt.shards_repaid}:
            receipt.exactly_forgotten = ExactForgetting(at=now, version=version, by=by)
        receipt.exact_shards = repaid_statement(receipt.shards_repaid, touched, max(shard_of) + 1)
        write_receipt(ws.root, receipt)
        written.append(receipt)
    if any(r.exactly_forgotten for r in written):
        publish_tree_head(ws.root, registered.run_id)
    return written


def open_batches(ws: Workspace, scenario: str, records: list[BatchRecord] | None = None) -> list[BatchRecord]:
    """Batches applied to the data (``fedunlearn ingest``) that no receipt closes yet: the model
    serving may still hold their samples. ``records``: the workspace's batch records where the
    caller already read them."""
    records = load_records(ws.folders) if records is None else records
    return [r for r in records if r.scenario == scenario and r.status is BatchStatus.COMPLETE
            and read_receipt(ws.root, r.batch_id) is None]


@task(name="close-batches-by-retrain", cache_policy=NO_CACHE)
def close_by_retrain(ws: Workspace, scenario: str, version: ModelRef, by: str,
                     open_records: list[BatchRecord]) -> list[Receipt]:
    """The exact retrain ``version`` (trained on the current data version, which every applied batch
    is out of) serves: alias ``current`` moves to it, tagged exact, and each open batch gets its
    receipt — forgotten exactly, erasure scanned; returns those receipts. For a caller that holds the
    batch lock; ``open_records``: ``open_batches`` as the caller read them under that lock."""
    closed = []
    ws.registry.set_version_tag(scenario, version.version, FORGETTING_TAG, "exact")
    ws.registry.set_alias(scenario, "current", version.version)
    for record in open_records:
        erasure = scan_stores(ws, record.purged, capture_fingerprints(ws, record), record=record)
        receipt = receipt_closed_by_retrain(
            record, version, ws.registry.alias_ref(scenario, "original"), erasure.model_dump(mode="json"), by,
            utc_now(), record.deadlines(ws.params.requests.deadline_days),
            ws.relative(record_path(ws.folders, record.batch_id)))
        receipt.applied_by = list(record.applied_by)
        receipt.exact_shards = exact_statement(ws, scenario, version.version)
        write_receipt(ws.root, receipt)
        note_forgotten(ws, receipt)
        closed.append(receipt)
    if closed:
        publish_tree_head(ws.root, version.run_id)
    for receipt in closed:  # their end steps are done (the caller settles the debt that is left)
        mark_finished(ws, receipt.batch_id)
    return closed
