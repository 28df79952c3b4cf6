"""Flow ``process-deletions``: pending deletion requests in; a new data version and a version of
it that is shown to have forgotten them out, promoted to ``current``; a receipt for the batch.

    intake-requests      lock ─▶ the batch owed by an earlier run, or the inbox validated (GX +
                         domain rules), invalid files quarantined, one batch journaled
    apply-deletions      ledger ─▶ DVC stages + commit (new data version) ─▶ erasure check
    unlearn-and-register the data before the batch (forget samples in memory) + the model trained on
                         it ─▶ [retrain-reference] ─▶ escalation: method ─▶ certificate ─▶ evaluate
                         + per-example audit ─▶ register ─▶ gates; until an attempt passes (the last
                         is exact retrain)
    promote-and-receipt  alias current ─▶ erasure scan of every store ─▶ receipt

Each stage is a task run with its steps' task runs (and ``unlearn-and-register``'s flows: training,
audit references) nested under it: as sub-flows, each stage's creation and state changes were
blocking calls to the Prefect server, ≈ 0.1 s per stage in a served batch; a task run's are events.

Every setting runs through it: HFL (PUF-Special by default), VFL (FedORA; a client request is
quarantined — VFL parties hold features of every sample, not samples), DFL (certified DFU, its
residual budget carried from version to version in the registry). One resume point
(``tasks.progress``): a run killed anywhere is finished by the next from what the stores record.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator

import torch
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from fedunlearn.benchmark import runner
from fedunlearn.certify.certificate import EXACT_RETRAIN, Certificate
from fedunlearn.certify.gates import GateOutcome, PromotionGates, judge_source
from fedunlearn.certify.tiers import Tier, exact_due, repay_now, serves, tier_of
from fedunlearn.config import ForgettingPolicy
from fedunlearn.data.store import read_manifest, refits_on_holdout_deletion
from fedunlearn.device import intra_op_threads, resolve_device
from fedunlearn.errors import (BatchCannotSucceed, BatchFailed, FedunlearnError, InputError, NoSpace, StateDamaged,
                               is_no_space, no_space_path)
from fedunlearn.federation.cost import CostRecord
from fedunlearn.evaluation.evaluator import evaluation_sets
from fedunlearn.evaluation.records import Evaluation, VersionMetrics
from fedunlearn.faults import failpoint
from fedunlearn.federation.protocol import Federation
from fedunlearn.receipts import NO_MODEL, AttemptRecord, ModelRef, Receipt
from fedunlearn.requests.batch import BatchRecord, BatchStatus, load_records, record_path
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.model import DeletionRequestModel, utc_now
from fedunlearn.unlearning import available_methods
from fedunlearn.unlearning.base import Outcome
from fedunlearn.unlearning.escalation import (EXACT_RETRAIN_METHOD, Attempt, checked_policy, default_method,
                                              default_policy)
from flows.ingest import summarize
from flows.intake import apply_deletions, intake_requests
from flows.audit import audit_references
from flows.debt import repay
from flows.heartbeat import parent_heartbeat
from flows.reference import retrain_reference as retrain_reference_flow
from flows.train import train_federated
from tasks.audit import audit, load_references, log_audit, log_source_audit
from tasks.data import load_data, read_federation
from tasks.debt import (FORGETTING_TAG, REPAY_DEPLOYMENT, Debt, mark_repaid, repayment_time, retrain_debt,
                        safe_start, schedule_repayment)
from tasks.backup import sync_state
from runtime.events import announce_processed
from tasks.evaluation import apply_gates, build_evaluator, evaluate
from tasks.models import (backdoor_ids, batch_description, describe_version, find_reference, load_source_model,
                          register_version, remove_alias, retrained_model)
from tasks.progress import attempts_registered
from tasks.receipts import publish_receipt, write_receipt
from stores.registry import ModelWeights, RegisteredModel
from tasks.requests import capture_fingerprints, release_fingerprints, scan_stores, submit_requests
from tasks.status import publish_status
from fedunlearn.timing import FlowClock
from tasks.unlearning import gpu_slot, unlearn_in_gpu_slot
from stores.workspace import Workspace

MethodChoice = Enum("MethodChoice", {"auto": "auto", **{name: name for name in available_methods()}}, type=str)
# A batch triggered while another runs waits for it (unlearning, evaluation and an optional retrain
# take minutes) instead of failing; past this it exits with BatchInProgress and its requests wait.
BATCH_LOCK_TIMEOUT_S = 1800.0
UNCHANGED = "unchanged"  # the method of a batch that deleted only held-out samples: nothing to unlearn


def choose_method(method: MethodChoice | str, setting: str) -> str:
    """``auto`` is the setting's default: PUF-Special (HFL), FedORA (VFL), certified DFU (DFL)."""
    name = MethodChoice(method).value
    return default_method(setting) if name == "auto" else name


@contextmanager
def stage(record: BatchRecord, step: str) -> Iterator[None]:
    """A failure once the batch is journaled names the batch and the step. One that a re-run can get
    past says to re-run (``BatchFailed``); one that it cannot (damaged state, a batch that can never
    succeed) keeps its meaning and its remedy; a full disk says so."""
    rerun = f"`fedunlearn process --scenario {record.scenario}`"
    where = f"batch {record.batch_id} ({record.scenario}) failed at {step}"
    try:
        yield
    except BatchFailed:
        raise
    except FedunlearnError as err:
        meaning = next(c for c in (StateDamaged, BatchCannotSucceed, NoSpace, InputError, FedunlearnError)
                       if isinstance(err, c))
        raise meaning(f"{where}: {err}{batch_state(record)}") from err
    except Exception as err:
        if is_no_space(err):
            path = no_space_path(err) or record.scenario
            raise NoSpace(f"{where}: no space left on device ({path}); free space on that filesystem and run {rerun} "
                          "again: the batch resumes where it stopped") from err
        raise BatchFailed(f"{where}: {err}; re-run {rerun} to resume — the ledger is exactly-once and the batch "
                          "continues from the data version before it") from err


def batch_state(record: BatchRecord) -> str:
    """What a failure after the ingest steps leaves behind, said plainly: the deletion is applied to
    the data (an error's "nothing was changed" would be untrue), the model step is not done."""
    if record.status is not BatchStatus.COMPLETE:
        return ""
    return (f". State of batch {record.batch_id}: its {len(record.requests)} request(s) ARE applied to the data "
            f"(ledger entries written, data version {record.data_version_before} -> {record.data_version_after}, "
            "request files in processed/); the model step did not finish and no receipt is written, so the batch "
            f"stays owed: once the cause is fixed, `fedunlearn process --scenario {record.scenario}` resumes it "
            "from the model step")


@flow(name="process-deletions", log_prints=True)
def process_deletions(scenario: str = "mnist5k-hfl", root: str = ".", method: MethodChoice = MethodChoice.auto,
                      requests: list[DeletionRequestModel] | None = None, retrain_reference: bool = False,
                      gates: PromotionGates | None = None, method_options: dict[str, Any] | None = None,
                      escalation: list[Attempt] | None = None, device: str | None = None,
                      forgetting_policy: ForgettingPolicy | None = None) -> dict:
    """Forget every pending deletion request of ``scenario`` as one batch. ``requests`` (a form in
    the Prefect UI) go to the inbox first. ``method`` ``auto`` is the setting's default; ``escalation``
    the attempts in order (default: the method, stronger, another method, exact retrain);
    ``retrain_reference`` retrains the gold standard on the new data version first, for the gates.
    ``forgetting_policy`` (default params.yaml's): ``interim`` serves the first attempt that fails no
    check and keeps utility and schedules the exact retrain before the deadlines; ``strict``
    escalates until an attempt passes every check. With nothing pending nothing changes."""
    clock = FlowClock()
    ws = Workspace.open(root)
    cfg = ws.scenario(scenario)
    tier_policy = ForgettingPolicy(forgetting_policy or ws.params.forgetting_policy)
    first = Attempt(method=choose_method(method, cfg.setting), options=method_options or {})
    gates = gates or PromotionGates()
    if requests:
        submit_requests(ws, scenario, requests)
    with ws.batch_lock(BATCH_LOCK_TIMEOUT_S, f"fedunlearn process --scenario {scenario}"), \
            intra_op_threads(cfg.threads), parent_heartbeat():
        taken = intake_requests(root=str(ws.root), scenario=scenario, take_owed=True)
        clock.stage("intake-requests")
        announce_processed([n.request_id or n.file for n in taken.quarantined], scenario, "quarantined",
                           taken.batch.batch_id if taken.batch else "none")
        if taken.batch is None:
            return summarize(ws.folders, scenario, None, taken.resumed, taken.inbox, taken.quarantined,
                             taken.already_applied)
        record = taken.batch
        if taken.owed:
            get_run_logger().warning("resuming batch %s, which an earlier run left unfinished; requests in the "
                                     "inbox wait for the next run", record.batch_id)
        # An unsupported method stops here, before the ledger moves on.
        policy = (checked_policy(cfg.setting, record.kind, escalation) if escalation
                  else default_policy(cfg.setting, record.kind, first))
        with stage(record, "ingest (ledger, new data version, erasure check)"):
            record = apply_deletions(root=str(ws.root), batch_id=record.batch_id).record
        clock.stage("apply-deletions")
        with stage(record, "unlearn and register"), gpu_slot(resolve_device(device or ws.params.device)):
            outcome = unlearn_and_register(root=str(ws.root), scenario=scenario, batch_id=record.batch_id,
                                           policy=policy, gates=gates, retrain_reference=retrain_reference,
                                           device=device, forgetting=tier_policy)
        clock.stage("unlearn-and-register")
        with stage(record, "alias and receipt"):
            receipt, path = promote_and_receipt(root=str(ws.root), scenario=scenario, batch_id=record.batch_id,
                                                outcome=outcome, policy=tier_policy)
            publish_receipt(receipt)
        clock.stage("promote-and-receipt")
        announce_processed(receipt.request_ids, scenario, "forgotten", record.batch_id)
        debt, exact_run = settle_debt(ws, scenario, device)
        publish_status(ws, scenario)
        clock.stage("debt-and-status")
    print(receipt.markdown())
    timings = clock.split()
    print_timings(timings)  # in the flow run's log too: a served run (no CLI to print it) shows where its time went
    return {**summarize(ws.folders, scenario, record, taken.resumed, taken.inbox, taken.quarantined,
                        taken.already_applied),
            **batch_result(ws, receipt, path), "retrain_debt": debt.line(ws.params.requests.max_retrain_debt),
            "exact_run": exact_run, "timings": timings}


def print_timings(timings: dict) -> None:
    print(f"flow {timings['flow_seconds']:.2f} s: compute {timings['core_seconds']:.2f} s, orchestration "
          f"{timings['orchestration_seconds']:.2f} s ({timings['orchestration_share']:.1%})"
          + "; orchestration by stage: " + ", ".join(f"{name} {seconds:.2f} s"
                                                   for name, seconds in timings["orchestration_by_stage"].items()))


def batch_result(ws: Workspace, receipt: Receipt, path) -> dict:
    """What the flow returns of its receipt: method, certificate, attempts, models, tier."""
    return {"method": receipt.method, "certificate": receipt.certificate["guarantee"], "promoted": receipt.promoted,
            "attempts": [a.model_dump(mode="json", include={"attempt", "method", "note"}) | {
                "verdict": a.gates.verdict if a.gates else None, "interim": a.gates.interim if a.gates else None}
                for a in receipt.attempts],
            "models": {key: ref.model_dump() if ref else None for key, ref in receipt.models.items()},
            "receipt": ws.relative(path), "forgetting": receipt.forgetting,
            "exact_due": receipt.exact_due.isoformat() if receipt.exact_due else None}


def settle_debt(ws: Workspace, scenario: str, device: str | None) -> tuple[Debt, str | None]:
    """After a batch: repay the retrain debt now when it passed ``requests.max_retrain_debt`` or its
    latest safe time has come; otherwise have Prefect start the repaying run at that time (a
    scheduled run of ``repay-retrain-debt``, when that deployment is served). Returns the debt left
    and what was done about it."""
    debt = retrain_debt(ws, scenario)
    start_by = repayment_time(ws, scenario, debt)
    if debt.requests > ws.params.requests.max_retrain_debt or repay_now(start_by, utc_now()):
        repay(ws, scenario, device)
        return retrain_debt(ws, scenario), "repaid in this run"
    if start_by is None:
        return debt, None
    scheduled = schedule_repayment(ws, scenario, start_by)
    if scheduled is None:
        print(f"exact forgetting due by {debt.due:%Y-%m-%d %H:%M}Z: no repay-retrain-debt deployment is served, so "
              f"run `fedunlearn repay-debt --scenario {scenario}` before {start_by:%Y-%m-%d %H:%M}Z (make serve "
              "schedules it)")
        return debt, (f"not scheduled (no repay-retrain-debt deployment is served): run `fedunlearn repay-debt "
                      f"--scenario {scenario}` before {start_by:%Y-%m-%d %H:%M}Z")
    return debt, f"scheduled: flow run {scheduled} of {REPAY_DEPLOYMENT} at {start_by:%Y-%m-%d %H:%M}Z"


# --- unlearn and register ------------------------------------------------------------------------

@dataclass
class BatchOutcome:
    """What unlearning a batch came to: the source, the reference, every attempt, the one chosen."""

    source: ModelRef
    source_metrics: VersionMetrics
    attempts: list[AttemptRecord]
    certificate: dict[str, Any]
    cost: CostRecord
    forgotten_per_client: dict[str, int]
    reference: ModelRef | None = None
    reference_metrics: VersionMetrics | None = None
    source_gates: GateOutcome | None = None
    evaluations: dict[str, Evaluation] = field(default_factory=dict, repr=False)

    @property
    def chosen(self) -> AttemptRecord:
        return self.attempts[-1]


def with_weights(federation: Federation, model: RegisteredModel) -> Federation:
    """The federation holding a registered version's weights (DFL: its nodes' models and budget)."""
    federation.state = model.state
    if model.weights.node_states is not None or model.weights.budget is not None:
        federation.node_states = model.weights.node_states
        federation.ledger = model.weights.budget
    return federation


@dataclass
class BatchContext:
    """What every attempt of a batch is judged with: the source, the data before the batch, the
    evaluator and audit references, the source's own evaluation and audit, the reference if any."""

    ws: Workspace
    record: BatchRecord
    source: RegisteredModel
    federation: Federation
    batch: Any
    sets: Any
    setup: Any
    evaluator: Any
    references: Any
    clean_forget_labels: Any
    source_eval: Evaluation
    source_audit: Any
    registered: dict
    gates: PromotionGates
    reference: RegisteredModel | None = None
    reference_eval: Evaluation | None = None

    @property
    def scenario(self) -> str:
        return self.record.scenario

    def audit(self, name: str, model) -> Any:
        return audit(name, model, self.sets.forget, self.references, self.ws.params.seed, self.clean_forget_labels)


@task(name="unlearn-and-register", task_run_name="unlearn-and-register", cache_policy=NO_CACHE)
def unlearn_and_register(root: str, scenario: str, batch_id: str, policy: list[Attempt], gates: PromotionGates,
                         retrain_reference: bool = False, device: str | None = None,
                         forgetting: ForgettingPolicy = ForgettingPolicy.interim) -> BatchOutcome:
    """The batch's attempts in order, each registered and gated, until one may serve under the
    ``forgetting`` policy (``tiers.serves``; the last, exact retrain, needs no gate). Attempts
    registered by an earlier run are read back, not redone."""
    ws = Workspace.open(root)
    [record] = [r for r in load_records(ws.folders) if r.batch_id == batch_id]
    registered = attempts_registered(ws, scenario, batch_id)
    recorded = next((v.tags.get("source_version") for v in registered.values() if "source_version" in v.tags), None)
    source = load_source_model(ws, scenario, record.data_version_before, recorded)
    poisoned = backdoor_ids(ws, scenario)
    dev = resolve_device(device or ws.params.device)
    federation = with_weights(load_data(ws, scenario, dev, record.data_version_before, backdoor_ids=poisoned), source)
    batch = record.forget_set(federation.clients)
    if refits_on_holdout_deletion(read_manifest(scenario, ws.root)) and any(e.held_out for e in record.requests):
        get_run_logger().warning("batch %s deletes held-out samples, on which %s's feature transform is fit: every "
                                 "sample's features moved, so the batch retrains exactly", batch_id, scenario)
        if batch is None:
            return retrain_for_new_features(ws, record, source, device)
        policy = [Attempt(method=EXACT_RETRAIN_METHOD)]
    if batch is None:
        return keep_source(ws, record, source, registered)
    if batch.num_forget >= sum(len(c) for c in federation.clients):
        close_without_model(ws, record, source)
    ctx = batch_context(ws, record, source, federation, batch, poisoned, registered, gates, device)
    if retrain_reference:
        retrain_reference_flow(scenario=scenario, root=str(ws.root), device=device, batch_id=batch_id)
    ctx.reference = find_reference(ws, scenario, record.data_version_after)
    if ctx.reference is not None:
        ctx.reference_eval = evaluate(ctx.evaluator, "retrained", federation.model_from(ctx.reference.state))
    source_gates = judge_source(ctx.source_eval, reference=ctx.reference_eval, gates=gates,
                                source_audit=ctx.source_audit.as_check())
    log_source_audit(ws, source.ref.run_id, batch_id, ctx.source_audit, source_gates)
    attempts, certificate, cost = escalate(ctx, policy, forgetting, device)
    return batch_outcome(ctx, attempts, certificate, cost, source_gates)


def batch_context(ws: Workspace, record: BatchRecord, source: RegisteredModel, federation: Federation, batch,
                  poisoned: list[str], registered: dict, gates: PromotionGates, device: str | None) -> BatchContext:
    """The evaluation sets, evaluator and audit references of the batch (references trained first if
    the scenario has none usable), and the source model evaluated and audited on them."""
    forget_ids = {i for ids in batch.forget_ids.values() for i in ids.tolist()}
    clean_forget_labels = None
    if poisoned and forget_ids <= set(poisoned):  # the forget set carries the trigger: so must its non-members
        clean = load_data(ws, record.scenario, federation.device, record.data_version_before)
        clean_forget_labels = clean.forget_data(batch).y.cpu().numpy()
    sets = evaluation_sets(federation, batch, clean_forget_labels=clean_forget_labels)
    setup = runner.BenchmarkSetup(record.scenario, f"batch {record.batch_id}", federation, batch, bool(poisoned), sets)
    evaluator = build_evaluator(ws, record.scenario, federation, batch, bool(poisoned), sets)
    source_model = federation.model_from(source.state)
    source_eval = evaluate(evaluator, f"source-v{source.ref.version}", source_model)
    references = load_references(ws, record.scenario, federation, record.deleted_ids())
    if references is None:  # none yet, or too many saw held-out rows deleted since: a new set
        audit_references(scenario=record.scenario, root=str(ws.root), device=device)
        references = load_references(ws, record.scenario, federation, record.deleted_ids())
    source_audit = audit(f"source-v{source.ref.version}", source_model, sets.forget, references, ws.params.seed,
                         clean_forget_labels)
    return BatchContext(ws, record, source, federation, batch, sets, setup, evaluator, references,
                        clean_forget_labels, source_eval, source_audit, registered, gates)


def escalate(ctx: BatchContext, policy: list[Attempt], forgetting: ForgettingPolicy,
             device: str | None) -> tuple[list[AttemptRecord], dict[str, Any], CostRecord]:
    """The attempts in order until one may serve (``tiers.serves``); the exact retrain ends the chain."""
    attempts, certificate, cost = [], {}, CostRecord()
    for number, attempt in enumerate(policy):
        if attempt.exact:
            record, certificate, cost = try_exact(ctx, attempt, number, len(policy), device)
            attempts.append(record)
            break
        record, certificate, cost = try_method(ctx, attempt, number, len(policy))
        attempts.append(record)
        gate = record.gates
        if serves(gate.passed, gate.interim, forgetting):
            break
        get_run_logger().warning("attempt %d (%s) did not pass its gates (%s%s): escalating", number + 1,
                                 attempt.method, gate.verdict, "; interim tier: " + "; ".join(gate.held_back)
                                 if forgetting is ForgettingPolicy.interim else "")
    return attempts, certificate, cost


def try_exact(ctx: BatchContext, attempt: Attempt, number: int, steps: int,
              device: str | None) -> tuple[AttemptRecord, dict[str, Any], CostRecord]:
    """The escalation's last step: the reference of the new data version, or an exact retrain now;
    audited, described, no gate needed. It becomes the batch's reference."""
    ws, scenario, batch_id = ctx.ws, ctx.scenario, ctx.record.batch_id
    exact = ctx.reference or exact_retrain(ws, scenario, batch_id, number, device)
    tag_attempt(ws, scenario, exact.ref.version, number)
    exact_model = ctx.federation.model_from(exact.state)
    exact_eval = ctx.reference_eval or evaluate(ctx.evaluator, "retrained", exact_model)
    verdict = ctx.audit("retrained", exact_model)
    log_audit(ws, exact.ref.run_id, verdict)
    describe_version(ws, scenario, exact.ref.version, batch_description(
        ctx.record, number, steps, attempt.method, attempt.options, EXACT_RETRAIN, None,
        note=f"none needed (exact retrain; audit {verdict.verdict})"))
    ctx.reference, ctx.reference_eval = exact, exact_eval
    record = AttemptRecord(attempt=number, method=attempt.method, version=exact.ref, certificate=EXACT_RETRAIN,
                           metrics=_metrics(exact_eval, None),
                           note=f"exact retrain: nothing of the deleted samples, no gate needed (audit: "
                                f"{verdict.verdict})")
    return record, exact_certificate(scenario, batch_id, "the escalation's last step"), registered_cost(exact)


def try_method(ctx: BatchContext, attempt: Attempt, number: int,
               steps: int) -> tuple[AttemptRecord, dict[str, Any], CostRecord]:
    """One unlearning attempt (or the one an earlier run registered, read back): evaluated, audited,
    registered, gated against the source or the reference, described."""
    ws, scenario, name = ctx.ws, ctx.scenario, f"{attempt.method}-{number}"
    if number in ctx.registered:
        ref, outcome, certificate = read_attempt(ws, scenario, ctx.registered[number])
    else:
        outcome, certificate = unlearn_in_gpu_slot(ctx.setup, ctx.source.state, attempt.method,
                                                   ctx.source_eval.test_acc, attempt.options)
    model = ctx.federation.model_from(outcome.state)
    evaluation = evaluate(ctx.evaluator, name, model)
    verdict = ctx.audit(name, model)
    if number not in ctx.registered:
        ref = register_attempt(ws, ctx.record, ctx.source, ctx.federation, attempt, number, outcome, certificate,
                               evaluation, steps)
        log_audit(ws, ref.run_id, verdict)
        failpoint("after-registration")
    gate = apply_gates(name, evaluation, certificate.guarantee, ctx.source_eval, ctx.reference_eval, ctx.gates,
                       verdict.as_check(), ctx.source_audit.as_check())
    describe_version(ws, scenario, ref.version, batch_description(
        ctx.record, number, steps, attempt.method, attempt.options, certificate.guarantee, ctx.source.ref.version,
        gate))
    record = AttemptRecord(attempt=number, method=attempt.method, options=attempt.options, version=ref,
                           certificate=certificate.guarantee, gates=gate, metrics=_metrics(evaluation, outcome.cost))
    return record, json.loads(certificate.to_json()), outcome.cost


def batch_outcome(ctx: BatchContext, attempts: list[AttemptRecord], certificate: dict[str, Any], cost: CostRecord,
                  source_gates: GateOutcome) -> BatchOutcome:
    reference, reference_metrics = ctx.reference, None
    if reference is not None:
        # Its training run could not know the forget set (it logged NaN): the batch's figures.
        ctx.ws.registry.log_metrics(reference.ref.run_id, {"forget_acc": ctx.reference_eval.forget_acc,
                                                           "mia_auc": ctx.reference_eval.mia_auc})
        reference_metrics = VersionMetrics.of(ctx.reference_eval, registered_cost(reference))
    return BatchOutcome(ctx.source.ref, VersionMetrics.of(ctx.source_eval, None), attempts, certificate, cost,
                        {str(c): len(ids) for c, ids in ctx.batch.forget_ids.items()},
                        reference.ref if reference else None, reference_metrics, source_gates)


def _metrics(evaluation: Evaluation | None, cost: CostRecord | None) -> dict[str, float | None]:
    return {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
            for k, v in VersionMetrics.of(evaluation, cost).to_dict().items()}


def register_attempt(ws: Workspace, record: BatchRecord, source: RegisteredModel, federation: Federation,
                     attempt: Attempt, number: int, outcome: Outcome, certificate: Certificate,
                     evaluation: Evaluation | None, steps: int = 1) -> ModelRef:
    """An attempt as a registered version of the batch's new data version (step ``number`` of
    ``steps`` in the escalation), its run's data version that version; its description says so,
    gates pending until they judge it."""
    name = record.scenario
    tags = {"role": "unlearned", "scenario": name, "method": attempt.method, "batch_id": record.batch_id,
            "attempt": str(number), "data_version": record.data_version_after, "certificate": certificate.guarantee,
            "source_version": source.ref.version}
    budget = getattr(outcome, "ledger", None)
    if budget is not None:
        tags.update(budget_used=f"{budget['used']:.6g}", budget_left=f"{budget['left']:.6g}")
    weights = ModelWeights(outcome.state, getattr(outcome, "node_states", None), budget)
    params = {"method": attempt.method, "attempt": number, "batch_id": record.batch_id,
              "requests": len(record.requests), "forget_samples": len(record.deleted_ids()),
              "data_version_before": record.data_version_before, "source_version": source.ref.version,
              **attempt.options}
    return register_version(ws, name, weights, federation.model_from(outcome.state),
                            tuple(federation.test.x.shape[1:]), tags, params, VersionMetrics.of(evaluation,
                                                                                                 outcome.cost),
                            {"certificate.json": certificate.to_json()},
                            description=batch_description(
                                record, number, steps, attempt.method, attempt.options, certificate.guarantee,
                                source.ref.version, note="none needed (only held-out samples deleted: the model "
                                                         "never trained on them)" if attempt.method == UNCHANGED
                                else "pending"))


def read_attempt(ws: Workspace, scenario: str, version) -> tuple[ModelRef, Outcome, Certificate]:
    """An attempt as an earlier run registered it: its weights, cost and certificate. A resumed
    batch judges this model, not a new one (a method with fresh noise would otherwise be judged on
    weights nobody registered)."""
    registered = ws.registry.load(scenario, str(version.version))
    certificate = Certificate.from_json(ws.registry.text(version.run_id, "certificate.json"))
    metrics = registered.metrics
    cost = CostRecord(metrics.get("wall_seconds", math.nan), metrics.get("flops", math.nan),
                      int(metrics.get("comm_bytes", 0) or 0))
    outcome = Outcome(registered.state, cost, notes={"resumed": f"registered as v{version.version} before the run "
                                                                "was interrupted"})
    return registered.ref, outcome, certificate


def tag_attempt(ws: Workspace, scenario: str, version: str, number: int) -> None:
    ws.registry.set_version_tag(scenario, version, "attempt", str(number))


def exact_retrain(ws: Workspace, scenario: str, batch_id: str, number: int, device: str | None) -> RegisteredModel:
    """The escalation's last step: the batch's new data version trained from scratch (``train-federated``,
    role and alias ``retrained``). Only called when that version has no reference yet, so the
    retrain-reference flow's reuse check would have nothing to reuse: its sub-flow is skipped (each
    sub-flow's start is ≈ 0.15 s of API calls against a served batch's Prefect server)."""
    train_federated(scenario=scenario, root=str(ws.root), device=device, role="retrained", batch_id=batch_id)
    return retrained_model(ws, scenario, ws.data_version(scenario))


def registered_cost(model: RegisteredModel) -> CostRecord:
    """The cost a registered version's run logged."""
    return CostRecord(model.metrics.get("wall_seconds", math.nan), model.metrics.get("flops", math.nan),
                      int(model.metrics.get("comm_bytes", 0) or 0))


def exact_certificate(scenario: str, batch_id: str, why: str) -> dict[str, Any]:
    return {"method": "retrain", "guarantee": EXACT_RETRAIN, "claimed": EXACT_RETRAIN, "scenario": scenario,
            "batch_id": batch_id, "notes": [f"retrained from scratch on the retained data ({why})"]}


def retrain_for_new_features(ws: Workspace, record: BatchRecord, source: RegisteredModel,
                             device: str | None) -> BatchOutcome:
    """A batch that deleted only held-out samples of a scenario whose feature transform is fit on
    the held-out split: no model of the earlier data version fits the new one's features (nor may
    it keep statistics of the deleted samples), so the new data version gets an exact retrain."""
    exact = retrained_model(ws, record.scenario, record.data_version_after) or exact_retrain(
        ws, record.scenario, record.batch_id, 0, device)
    tag_attempt(ws, record.scenario, exact.ref.version, 0)
    why = "held-out samples deleted: the feature transform fit on them changed"
    cost = registered_cost(exact)
    attempt = AttemptRecord(attempt=0, method=EXACT_RETRAIN_METHOD, version=exact.ref, certificate=EXACT_RETRAIN,
                            metrics=_metrics(None, cost), note=f"exact retrain: {why}")
    return BatchOutcome(source.ref, VersionMetrics(), [attempt], exact_certificate(record.scenario, record.batch_id,
                                                                                 why), cost, {}, exact.ref)


def keep_source(ws: Workspace, record: BatchRecord, source: RegisteredModel, registered: dict) -> BatchOutcome:
    """A batch that deleted only held-out test samples: no model was trained on them, so the source
    model is, unchanged, the model of the new data version — registered as its version with the
    source's guarantee (an original or retrained source is exactly what retraining gives)."""
    exact = source.ref.role in ("original", "retrained")
    guarantee = EXACT_RETRAIN if exact else source.tags.get("certificate", EXACT_RETRAIN)
    if 0 in registered:
        ref = ModelRef(version=str(registered[0].version), role="unlearned",
                       data_version=record.data_version_after, run_id=registered[0].run_id)
    else:
        federation = read_federation(ws, record.scenario, torch.device("cpu"), record.data_version_after)
        federation = with_weights(federation, source)
        certificate = Certificate(method=UNCHANGED, guarantee=guarantee, claimed=guarantee, scenario=record.scenario,
                                  batch_id=record.batch_id, notes=["only held-out samples were deleted: the model "
                                                                   "never trained on them"])
        ref = register_attempt(ws, record, source, federation, Attempt(method=UNCHANGED), 0,
                               Outcome(source.state, CostRecord(0.0, 0.0, 0)), certificate, None)
    attempt = AttemptRecord(attempt=0, method=UNCHANGED, version=ref, certificate=guarantee,
                            metrics=_metrics(None, CostRecord(0.0, 0.0, 0)),
                            note="only held-out samples deleted: nothing to unlearn")
    return BatchOutcome(source.ref, VersionMetrics(), [attempt], {"method": UNCHANGED, "guarantee": guarantee},
                        CostRecord(0.0, 0.0, 0), {})


def close_without_model(ws: Workspace, record: BatchRecord, source: RegisteredModel) -> None:
    """The batch deleted every training sample: no model can be trained or unlearned on what is left.
    The deletion stands (ledger, data version); alias ``current`` — a model trained on the deleted
    samples — is removed; a receipt says so, so no later run retries the batch."""
    scenario = record.scenario
    remove_alias(ws, scenario, "current")
    erasure = scan_stores(ws, record.purged, capture_fingerprints(ws, record))
    release_fingerprints(ws, record.batch_id)
    receipt = Receipt(
        batch_id=record.batch_id, scenario=scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()), forgotten_per_client={},
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        outcome=NO_MODEL, models={"original": ws.registry.alias_ref(scenario, "original"), "source": source.ref,
                                  "unlearned": None, "retrained": None, "current": None},
        promoted=False, metrics={}, costs={}, erasure=erasure.model_dump(mode="json"),
        batch_record=ws.relative(record_path(ws.folders, record.batch_id)))
    path = write_receipt(ws, receipt)
    raise BatchCannotSucceed(
        f"batch {record.batch_id} deleted every training sample of {scenario}: the deletion is applied (data version "
        f"{record.data_version_after}, receipt {ws.relative(path)}) but no model can be trained or unlearned on no "
        f"data, so alias 'current' was removed and nothing serves. Add training data, then train a new model with "
        f"`fedunlearn train --scenario {scenario}`")


# --- promote and receipt ---------------------------------------------------------------------------

def tier_fields(ws: Workspace, record: BatchRecord, certificate: str | None, policy: ForgettingPolicy) -> dict:
    """The receipt's tier fields: the tier the chosen version forgets on, each request's deadline and,
    on the interim tier, when exact forgetting is due and the latest safe time to start it."""
    deadlines = record.deadlines(ws.params.requests.deadline_days)
    tier = tier_of(certificate)
    fields = {"forgetting": tier.value, "policy": policy.value, "deadlines": deadlines}
    if tier is Tier.interim:
        due = exact_due(deadlines.values())
        fields.update(exact_due=due, exact_start_by=safe_start(ws, record.scenario, due))
    return fields


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
    tier = tier_fields(ws, record, chosen.certificate, policy)
    ws.registry.set_version_tag(scenario, chosen.version.version, FORGETTING_TAG, tier["forgetting"])
    ws.registry.set_alias(scenario, "current", chosen.version.version)
    failpoint("after-alias-move")
    erasure = scan_stores(ws, record.purged, capture_fingerprints(ws, record))
    release_fingerprints(ws, batch_id)
    metrics = {"source": outcome.source_metrics.to_dict(), "unlearned": chosen.metrics,
               **({"retrained": outcome.reference_metrics.to_dict()} if outcome.reference_metrics else {})}
    reference_seconds = outcome.reference_metrics.wall_seconds if outcome.reference_metrics else math.nan
    chosen_seconds = outcome.cost.wall_seconds
    speedup = reference_seconds / chosen_seconds if chosen_seconds and chosen_seconds > 0 else None
    receipt = Receipt(
        batch_id=batch_id, scenario=scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()), forgotten_per_client=outcome.forgotten_per_client,
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        method=chosen.method, models={"original": ws.registry.alias_ref(scenario, "original"),
                                      "source": outcome.source, "unlearned": chosen.version,
                                      "retrained": outcome.reference or (chosen.version if chosen.method == "retrain"
                                                                         else None),
                                      "current": ws.registry.alias_ref(scenario, "current")},
        certificate=outcome.certificate, gates=chosen.gates, attempts=outcome.attempts, promoted=True,
        metrics=metrics,
        costs={"unlearned": {"wall_seconds": outcome.cost.wall_seconds, "flops": outcome.cost.flops,
                             "comm_bytes": outcome.cost.comm_bytes},
               **({"retrained": {k: getattr(outcome.reference_metrics, k) for k in ("wall_seconds", "flops",
                                                                                       "comm_bytes")}}
                  if outcome.reference_metrics else {}),
               "speedup_vs_retrain": None if speedup is None or math.isnan(speedup) else speedup},
        erasure=erasure.model_dump(mode="json"), source_gates=outcome.source_gates, **tier,
        batch_record=ws.relative(record_path(RequestFolders(ws.root), batch_id)))
    path = write_receipt(ws, receipt)
    if chosen.method == "retrain":  # an exact retrain serves: it repays what earlier batches forgot approximately
        mark_repaid(ws, scenario, chosen.version.version, f"batch {batch_id}")
    sync_state(ws.root, f"batch {batch_id}: receipt")
    failpoint("after-receipt")
    return receipt, path
