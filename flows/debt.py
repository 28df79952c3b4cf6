"""Flow ``repay-retrain-debt``: the exact retrain that repays approximate forgetting.

    read-repayment: the retrain debt (receipts forgotten only approximately), the batches applied
    without unlearning, the latest safe start ─▶ the shards due (``shards_due``) ─▶ none owed: nothing to do
    ─▶ a federation in shards, only what is due (``only_due``): the shards due retrained, the others
       kept as they serve ─▶ alias current ─▶ the receipts record their shards retrained ─▶ retire
    ─▶ otherwise retrain-reference on the current data version ─▶ alias current ─▶ the receipts it covers
    record when their requests were forgotten exactly ─▶ the versions that learnt them retire
    (``tasks.retirement``) ─▶ the status and the receipts published as Prefect artifacts, so that a
    monitor watching ``deletion-status-<scenario>`` sees the repayment ─▶ the retrain measured on each
    repaid batch's forget set (``measure_repaid``: beside each batch's source and unlearned version)

Deployed weekly by ``make serve`` (``repay-retrain-debt/weekly``); each interim batch schedules a
run of it at the latest safe time before its requests' deadlines (``tasks.debt.schedule_repayment``);
``process-deletions`` runs it when the debt passes ``requests.max_retrain_debt`` (params.yaml), or
that time has come (then only what is due: ``fedunlearn.shard_debt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import torch
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from fedunlearn.device import intra_op_threads
from fedunlearn.requests.batch import BatchRecord, load_records
from fedunlearn.requests.model import utc_now
from fedunlearn.shard_debt import ShardRepayment, shards_to_repay
from flows.forget_sets import measure_retrained, retrain_device
from flows.reference import reference_for
from flows.results import RepayResult
from flows.train import Training, train_model
from tasks.data import command_device, reproduce_data
from tasks.debt import (Debt, close_by_retrain, mark_repaid, mark_shards_repaid, open_batches, repayment_time,
                        retrain_debt, shard_assignment, shard_debt)
from tasks.receipts import publish_receipt
from tasks.retirement import retire_forgotten
from tasks.status import publish_status
from tasks.status_health import refuse_wrong_serving
from tasks.transparency import verify_before_writing
from stores.workspace import ScenarioScope, Workspace


# An exact retrain takes minutes; a batch running meanwhile is waited for, as batches wait for each other.
LOCK_TIMEOUT_S = 1800.0


@flow(name="repay-retrain-debt", log_prints=True)
def repay_retrain_debt(scenario: str = "mnist5k-hfl", root: str = ".", device: str | None = None,
                       only_due: bool = False) -> RepayResult:
    """Retrain ``scenario`` exactly on its current data version and serve it, if any request was
    forgotten only approximately since the last exact retrain. Holds the batch lock: no deletion
    batch moves the data or ``current`` meanwhile.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        root: the workspace (the directory holding params.yaml).
        device: auto, cpu, cuda or mps; empty: params.yaml's ``device``.
        only_due: a federation in shards retrains only the shards owed by a request whose latest safe
            start has come (the run a batch schedules); the others keep serving until theirs or the
            weekly run. Off: every shard that owes (one federation: always all of it).
    """
    ws = Workspace.open(root)
    scope, chosen = ScenarioScope(ws, scenario), command_device(ws, device)
    lock = ws.batch_lock(LOCK_TIMEOUT_S, f"fedunlearn repay-debt --scenario {scenario}")
    with lock, intra_op_threads(scope.config.threads):
        verify_before_writing(ws.root, f"`fedunlearn repay-debt --scenario {scenario}`")  # damage: nothing written
        return repay(scope, chosen, reproduce_data(ws, scenario), only_due)


@dataclass(frozen=True)
class Repayment:
    """What one repayment of a scenario's retrain debt owes, gathered once (``read_repayment``): the
    receipts forgotten only approximately (``debt``), the batches applied without unlearning
    (``open``), the latest safe start of the exact retrain (``start_by``), for a federation in shards
    each client's shard (``shard_of``; None for one federation), the batch records of everything owed
    (``records``: the debt's batches and the open ones) and whether it repays only what is due."""

    debt: Debt
    open: list[BatchRecord]
    start_by: datetime | None
    shard_of: tuple[int, ...] | None
    records: list[BatchRecord]
    only_due: bool = False

    @property
    def owed(self) -> bool:
        return bool(self.debt.receipts or self.open)

    def records_of(self, batch_ids: list[str]) -> list[BatchRecord]:
        return [r for r in self.records if r.batch_id in batch_ids]


@task(name="read-repayment", task_run_name="read-repayment-{scope.scenario}", cache_policy=NO_CACHE)
def read_repayment(scope: ScenarioScope, only_due: bool = False) -> Repayment:
    """What the scenario owes, read from its stores once, for the repayment's steps to share."""
    ws, scenario = scope.ws, scope.scenario
    debt, every = retrain_debt(ws, scenario), load_records(ws.folders)
    still_open, owed = open_batches(ws, scenario, every), {r.batch_id for r in debt.receipts}
    records = [*still_open, *(r for r in every if r.batch_id in owed)]
    return Repayment(debt, still_open, repayment_time(ws, scenario, debt), shard_assignment(ws, scenario), records,
                     only_due)


def shards_due(repayment: Repayment, now: datetime) -> ShardRepayment | None:
    """``shard_debt.shards_to_repay`` of a federation in shards with no batch applied without
    unlearning (those need every shard); None: one exact retrain of all that owes."""
    if repayment.shard_of is None or repayment.open:
        return None
    owed = shard_debt(repayment.debt, repayment.shard_of)
    return shards_to_repay(owed, repayment.only_due, now)


def repay(scope: ScenarioScope, device: torch.device, data_version: str, only_due: bool = False) -> RepayResult:
    """The repayment itself (``repay_debt``), for a caller that holds the batch lock, on the device
    the command chose and the current data version it holds."""
    repayment = read_repayment(scope, only_due)
    repaid = repay_debt(scope, device, data_version, repayment, shards_due(repayment, utc_now()))
    measure_repaid(scope, repayment, repaid, device)
    return repaid


def repay_debt(scope: ScenarioScope, device: torch.device, data_version: str, repayment: Repayment,
               shards: ShardRepayment | None) -> RepayResult:
    """The exact retrain on the current data version serves and repays the debt; batches applied
    without unlearning are closed by the same retrain (``close_by_retrain``). Nothing owed: only a
    retirement a killed run left unfinished is completed. ``device``: the command's; ``data_version``:
    the current one, which the retrain trains on; ``shards``: what ``shards_due`` says is due of a
    federation in shards (None: one exact retrain of all that owes)."""
    ws, scenario = scope.ws, scope.scenario
    if not repayment.owed:
        print("no retrain debt")
        retire_forgotten(ws, scenario)
        return RepayResult(scenario=scenario, repaid=[])
    if shards is not None and not shards.retrain:
        print(f"no shard of {scenario} is due yet: shard(s) {', '.join(map(str, sorted(shards.wait)))} owe(s) an "
              "exact retrain by a later latest safe start, or the weekly run")
        return RepayResult(scenario=scenario, repaid=[])
    if shards is not None and shards.partial:
        return repay_shards(scope, device, data_version, repayment, shards)
    reference = reference_for(scope, device, data_version)
    repaid = (close_by_retrain(ws, scenario, ws.registry.alias_ref(scenario, "retrained"), "repay-retrain-debt",
                               repayment.open)
              + mark_repaid(ws, scenario, reference.model_version, "repay-retrain-debt"))
    batch_ids = [r.batch_id for r in repaid]
    retired = retire_forgotten(ws, scenario)
    written = {**{r.batch_id: r for r in repaid}, **{b: r for b, r in retired.receipts.items() if b in batch_ids}}
    publish_status(scope)  # as a batch publishes its own: a monitor of the status sees the repayment
    for receipt in written.values():
        publish_receipt(receipt)
    print(f"{repayment.debt.line(ws.params.requests.max_retrain_debt)}: repaid by {scenario} "
          f"v{reference.model_version} (alias current)")
    trained_on = retrain_device(reference)
    return RepayResult(scenario=scenario, repaid=batch_ids, version=reference.model_version,
                       retired=list(retired.versions), receipts=list(written.values()),
                       device=None if trained_on is None else str(trained_on))


def measure_repaid(scope: ScenarioScope, repayment: Repayment, repaid: RepayResult, device: torch.device) -> None:
    """The exact retrain measured on the forget set of each batch it repaid (``measure_retrained``), so
    that ``compare`` puts it beside each batch's source and unlearned version; on the device it trained
    on, else the command's. A repayment of some shards only is not one exact retrain: not measured."""
    if repaid.version is None or not repaid.repaid or repaid.shards_retrained:
        return
    measure_retrained(scope, repaid.version, repayment.records_of(repaid.repaid),
                      torch.device(repaid.device) if repaid.device else device)


def repay_shards(scope: ScenarioScope, device: torch.device, data_version: str, repayment: Repayment,
                 shards: ShardRepayment) -> RepayResult:
    """Only the shards due retrained from scratch; every other owing shard keeps the model ``current``
    serves (approximately unlearned) until its own latest safe start or the weekly run. The version
    serves; each receipt records its shards retrained, and is forgotten exactly once all are."""
    ws, scenario = scope.ws, scope.scenario
    # The shards not due are kept from the version current serves: never from one that must not serve.
    refuse_wrong_serving(ws, scenario, f"`fedunlearn repay-debt --scenario {scenario}`",
                         "the shards not due would be kept from it")
    serving = ws.registry.alias_ref(scenario, "current")
    trained = train_model(scope, device, data_version,
                          Training(role="repaid", kept_from=serving.version, kept=shards.wait))
    receipts = mark_shards_repaid(ws, scenario, trained.model_version, "repay-retrain-debt", repayment.debt,
                                  repayment.shard_of)
    repaid = [r.batch_id for r in receipts if r.exactly_forgotten]
    retired = retire_forgotten(ws, scenario)
    written = {**{r.batch_id: r for r in receipts}, **{b: r for b, r in retired.receipts.items() if b in repaid}}
    publish_status(scope)
    for receipt in written.values():
        publish_receipt(receipt)
    print(f"shard(s) {', '.join(map(str, sorted(shards.retrain)))} of {scenario} retrained from scratch (their latest "
          f"safe start had come), shard(s) {', '.join(map(str, sorted(shards.wait)))} kept as v{serving.version} "
          f"serves them until theirs: v{trained.model_version} (alias current); {len(repaid)} batch(es) forgotten "
          "exactly: repaid")
    return RepayResult(scenario=scenario, repaid=repaid, version=trained.model_version, retired=list(retired.versions),
                       receipts=list(written.values()), shards_retrained=sorted(shards.retrain),
                       shards_waiting=sorted(shards.wait))
