"""Stage ``unlearn-and-register`` of ``process-deletions``: the data before the batch and the model
trained on it, the batch's route (``fedunlearn.batch_decisions.route``), then the escalation — each
attempt unlearned, evaluated, audited, registered and gated until one may serve; the last is an
exact retrain. Attempts an earlier run registered are read back, not redone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from fedunlearn.batch_decisions import (UNCHANGED, BatchUnlearning, Route, attempts_for_route, attempts_in_order,
                                        exact_certificate, metrics_of, receipt_without_model, route,
                                        stops)
from fedunlearn.benchmark import runner
from fedunlearn.certify.certificate import EXACT_RETRAIN, Certificate
from fedunlearn.certify.gates import GateOutcome, PromotionGates, judge_source
from fedunlearn.config import ForgettingPolicy
from fedunlearn.data.store import read_manifest, refits_on_holdout_deletion
from fedunlearn.errors import BatchCannotSucceed
from fedunlearn.evaluation.forget_sets import RETRAINED, SOURCE, figures
from fedunlearn.evaluation.records import Evaluation, VersionMetrics
from fedunlearn.faults import failpoint
from fedunlearn.federation.cost import CostRecord
from fedunlearn.federation.protocol import Federation
from fedunlearn.receipts import AttemptRecord, ModelRef
from fedunlearn.requests.batch import BatchRecord, record_path
from fedunlearn.runner_choice import IN_PROCESS_RUNTIME, flower_engine
from fedunlearn.unlearning.base import DeletionBatch, Outcome
from fedunlearn.unlearning.escalation import EXACT_RETRAIN_METHOD, Attempt
from flows.batch import Batch, Unlearned
from flows.forget_sets import forget_set_kit
from flows.reference import retrain_reference as retrain_reference_flow
from flows.train import train_federated
from stores.registry import ModelWeights, RegisteredModel
from stores.workspace import Workspace
from tasks.audit import audit, log_audit, log_source_audit
from tasks.data import load_data, read_federation
from tasks.erasure import capture_fingerprints, scan_stores
from tasks.evaluation import apply_gates, evaluate
from tasks.forget_sets import log_forget_set
from tasks.models import (batch_description, describe_version, find_reference,
                          register_version, remove_alias, retrained_model, tag_version)
from tasks.receipts import write_receipt
from tasks.unlearning import flower_methods, unlearn_in_gpu_slot, unlearn_through_flower


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
    registered: Mapping[int, Any]
    gates: PromotionGates
    device: str
    reference: RegisteredModel | None = None
    reference_eval: Evaluation | None = None
    reference_audit: Any = None
    engine: str | None = None  # Flower's engine for the method attempts; None: in-process

    @property
    def scenario(self) -> str:
        return self.record.scenario

    def audit(self, name: str, model) -> Any:
        return audit(name, model, self.sets.forget, self.references, self.ws.params.seed, self.clean_forget_labels)


@task(name="unlearn-and-register", task_run_name="unlearn-and-register", cache_policy=NO_CACHE)
def unlearn_and_register(batch: Batch) -> Unlearned:
    """The batch's attempts in order, each registered and gated, until one may serve under its
    forgetting policy (``tiers.serves``; the last, exact retrain, needs no gate). Attempts registered
    by an earlier run are read back, not redone. Unless the user chose the attempts, a forget set the
    source remembers tries the methods that can remove it first (``attempts_in_order``)."""
    ws, record, source, poisoned = batch.ws, batch.record, batch.source, list(batch.poisoned)
    federation = with_weights(load_data(ws, batch.scenario, batch.device, record.data_version_before,
                                        backdoor_ids=poisoned), source)
    forget = record.forget_set(federation.clients)
    taken = route(refits_on_holdout_deletion(read_manifest(batch.scenario, ws.root)),
                  any(e.held_out for e in record.requests), None if forget is None else forget.num_forget,
                  sum(len(c) for c in federation.clients))
    if taken in (Route.exact_only, Route.retrain_for_new_features):
        get_run_logger().warning("%s deletes held-out samples, on which %s's feature transform is fit: every "
                                 "sample's features moved, so the batch retrains exactly", batch.record.batch_id,
                                 batch.scenario)
    if taken is Route.retrain_for_new_features:
        return Unlearned(batch, retrain_for_new_features(batch, source))
    if taken is Route.keep_source:
        return Unlearned(batch, keep_source(batch, source))
    if taken is Route.no_model:
        close_without_model(batch, source)
    ctx = batch_context(batch, source, federation, forget, poisoned)
    if batch.retrain_reference:
        retrain_reference_flow(scenario=batch.scenario, root=str(ws.root), device=batch.device_name,
                               batch_id=batch.record.batch_id)
    ctx.reference = find_reference(ws, batch.scenario, record.data_version_after)
    if ctx.reference is not None:
        ctx.reference_eval = evaluate(ctx.evaluator, "retrained", federation.model_from(ctx.reference.state))
    source_gates = judge_source(ctx.source_eval, reference=ctx.reference_eval, gates=batch.gates,
                                source_audit=ctx.source_audit.as_check(), canaries=ctx.source_audit.canaries)
    log_source_audit(ws, source.ref.run_id, batch.record.batch_id, ctx.source_audit, source_gates)
    planned = attempts_for_route(taken, list(batch.attempts))
    ordered = attempts_in_order(planned, ws.scenario(batch.scenario).setting, ctx.source_audit.remembered(),
                                batch.chosen_by_user)
    if ordered != planned:
        get_run_logger().info("the source model remembers the forget set (per sample: %s; audit AUC %.3f): %s first, "
                              "where the seed methods' gradient is close to zero",
                              ctx.source_audit.per_sample_summary(), ctx.source_audit.auc, ordered[0].method)
    attempts, certificate, cost = escalate(ctx, ordered, batch.forgetting)
    return Unlearned(batch, batch_outcome(ctx, attempts, certificate, cost, source_gates))


def batch_context(of: Batch, source: RegisteredModel, federation: Federation, batch: DeletionBatch,
                  poisoned: list[str]) -> BatchContext:
    """The evaluation sets, evaluator and audit references of the batch (references trained first if
    the scenario has none usable), and the source model evaluated and audited on them."""
    ws, record = of.ws, of.record
    kit = forget_set_kit(ws, record, federation, batch, poisoned, of.device_name)
    sets, evaluator, references = kit.sets, kit.evaluator, kit.references
    source_model = federation.model_from(source.state)
    source_eval = evaluate(evaluator, f"source-v{source.ref.version}", source_model)
    if hasattr(federation, "calibration"):  # HFL: a method sizing its strength reads pool A, never pool B
        federation.calibration = references.calibration_rows(federation.test)
    source_audit = audit(f"source-v{source.ref.version}", source_model, sets.forget, references, ws.params.seed,
                         kit.clean_forget_labels)
    # A removal method acts on what the source is measured to remember, and leaves the rest as a retrain would.
    batch = batch.with_remembered(source_audit.removal_targets())
    setup = runner.BenchmarkSetup(record.scenario, f"batch {record.batch_id}", federation, batch, bool(poisoned), sets)
    return BatchContext(ws, record, source, federation, batch, sets, setup, evaluator, references,
                        kit.clean_forget_labels, source_eval, source_audit, of.registered, of.gates, of.device_name,
                        engine=flower_engine(of.runner))


def escalate(ctx: BatchContext, planned: list[Attempt],
             forgetting: ForgettingPolicy) -> tuple[list[AttemptRecord], Certificate | None, CostRecord]:
    """The attempts in order until one may serve (``tiers.serves``); the exact retrain ends the chain."""
    attempts, certificate, cost = [], None, CostRecord()
    for number, attempt in enumerate(planned):
        if attempt.exact:
            record, certificate, cost = try_exact(ctx, attempt, number, len(planned))
            attempts.append(record)
            break
        record, certificate, cost = try_method(ctx, attempt, number, len(planned))
        attempts.append(record)
        gate = record.gates
        if stops(gate, forgetting, exact_in_hand=ctx.reference is not None):
            break
        get_run_logger().warning("attempt %d (%s) did not pass its gates (%s%s): escalating", number + 1,
                                 attempt.method, gate.verdict, "; interim tier: " + "; ".join(gate.held_back)
                                 if forgetting is ForgettingPolicy.interim else "")
    return attempts, certificate, cost


def try_exact(ctx: BatchContext, attempt: Attempt, number: int,
              steps: int) -> tuple[AttemptRecord, Certificate, CostRecord]:
    """The escalation's last step: the reference of the new data version, or an exact retrain now;
    audited, described, no gate needed. It becomes the batch's reference."""
    ws, scenario, batch_id = ctx.ws, ctx.scenario, ctx.record.batch_id
    exact = ctx.reference or exact_retrain(ws, scenario, batch_id, ctx.device)
    tag_attempt(ws, scenario, exact.ref.version, number)
    exact_model = ctx.federation.model_from(exact.state)
    exact_eval = ctx.reference_eval or evaluate(ctx.evaluator, "retrained", exact_model)
    verdict = ctx.audit("retrained", exact_model)
    log_audit(ws, exact.ref.run_id, verdict)
    ctx.reference_audit = verdict
    describe_version(ws, scenario, exact.ref.version, batch_description(
        ctx.record, number, steps, attempt.method, attempt.options, EXACT_RETRAIN, None,
        note=f"none needed (exact retrain; audit {verdict.verdict})"))
    ctx.reference, ctx.reference_eval = exact, exact_eval
    record = AttemptRecord(attempt=number, method=attempt.method, version=exact.ref, certificate=EXACT_RETRAIN,
                           metrics=metrics_of(exact_eval, None),
                           note=f"exact retrain: nothing of the deleted samples, no gate needed (audit: "
                                f"{verdict.verdict})")
    return record, exact_certificate(scenario, batch_id, "the escalation's last step"), registered_cost(exact)


def try_method(ctx: BatchContext, attempt: Attempt, number: int,
               steps: int) -> tuple[AttemptRecord, Certificate, CostRecord]:
    """One unlearning attempt (or the one an earlier run registered, read back): evaluated, audited,
    registered, gated against the source or the reference, described."""
    ws, scenario, name = ctx.ws, ctx.scenario, f"{attempt.method}-{number}"
    if number in ctx.registered:
        ref, outcome, certificate = read_attempt(ws, scenario, ctx.registered[number])
    else:
        outcome, certificate = compute_attempt(ctx, attempt, number)
    model = ctx.federation.model_from(outcome.state)
    evaluation = evaluate(ctx.evaluator, name, model)
    verdict = ctx.audit(name, model)
    if number not in ctx.registered:
        ref = register_attempt(ws, ctx.record, ctx.source, ctx.federation, attempt, number, outcome, certificate,
                               evaluation, steps)
        log_audit(ws, ref.run_id, verdict)
        failpoint("after-registration")
    gate = apply_gates(name, evaluation, certificate.guarantee, ctx.source_eval, ctx.reference_eval, ctx.gates,
                       verdict, ctx.source_audit)
    describe_version(ws, scenario, ref.version, batch_description(
        ctx.record, number, steps, attempt.method, attempt.options, certificate.guarantee, ctx.source.ref.version,
        gate))
    record = AttemptRecord(attempt=number, method=attempt.method, options=attempt.options, version=ref,
                           certificate=certificate.guarantee, gates=gate, metrics=metrics_of(evaluation, outcome.cost))
    return record, certificate, outcome.cost


def compute_attempt(ctx: BatchContext, attempt: Attempt, number: int) -> tuple[Outcome, Certificate]:
    """The attempt's model, through Flower on a Flower runner where the method has a Flower version;
    otherwise in-process, and on a Flower runner the batch says so (the user asked for Flower)."""
    if ctx.engine is not None and attempt.method in flower_methods():
        return unlearn_through_flower(ctx.ws, ctx.record, ctx.setup, ctx.source.state, attempt.method,
                                      ctx.source_eval.test_acc, attempt.options, ctx.engine)
    if ctx.engine is not None:
        get_run_logger().warning("attempt %d (%s) runs in-process: %s has no Flower version (Flower engine %s)",
                                 number + 1, attempt.method, attempt.method, ctx.engine)
    return unlearn_in_gpu_slot(ctx.setup, ctx.source.state, attempt.method, ctx.source_eval.test_acc,
                               attempt.options)


def batch_outcome(ctx: BatchContext, attempts: list[AttemptRecord], certificate: Certificate | None, cost: CostRecord,
                  source_gates: GateOutcome) -> BatchUnlearning:
    reference, reference_metrics = ctx.reference, None
    log_on_forget_set(ctx, ctx.source.ref, SOURCE, ctx.source_eval, ctx.source_audit)
    if reference is not None:
        # Its training run could not know the forget set (it logged NaN): the batch's figures.
        verdict = ctx.reference_audit or ctx.audit("retrained", ctx.federation.model_from(reference.state))
        log_on_forget_set(ctx, reference.ref, RETRAINED, ctx.reference_eval, verdict)
        reference_metrics = VersionMetrics.of(ctx.reference_eval, registered_cost(reference))
    return BatchUnlearning(ctx.source.ref, VersionMetrics.of(ctx.source_eval, None), attempts, certificate, cost,
                        {str(c): len(ids) for c, ids in ctx.batch.forget_ids.items()},
                        reference.ref if reference else None, reference_metrics, source_gates)


def log_on_forget_set(ctx: BatchContext, ref: ModelRef, part: str, evaluation: Evaluation, verdict) -> None:
    """The batch's own measurement of its source or reference on its forget set, where ``compare``
    and MLflow's compare view read it beside the unlearned version's (no second evaluation)."""
    log_forget_set(ctx.ws, ctx.scenario, ref, ctx.record.batch_id, part, figures(evaluation, verdict),
                   len(ctx.sets.forget), verdict.verdict)


def register_attempt(ws: Workspace, record: BatchRecord, source: RegisteredModel, federation: Federation,
                     attempt: Attempt, number: int, outcome: Outcome, certificate: Certificate,
                     evaluation: Evaluation | None, steps: int = 1) -> ModelRef:
    """An attempt as a registered version of the batch's new data version (step ``number`` of
    ``steps`` in the escalation), its run's data version that version; its description says so,
    gates pending until they judge it."""
    name = record.scenario
    tags = {"role": "unlearned", "scenario": name, "method": attempt.method, "batch_id": record.batch_id,
            "attempt": str(number), "data_version": record.data_version_after, "certificate": certificate.guarantee,
            "source_version": source.ref.version, "runtime": outcome.notes.get("runtime", IN_PROCESS_RUNTIME)}
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
    tag_version(ws, scenario, version, "attempt", str(number))


def exact_retrain(ws: Workspace, scenario: str, batch_id: str, device: str) -> RegisteredModel:
    """The escalation's last step: the batch's new data version trained from scratch (``train-federated``,
    role and alias ``retrained``). Only called when that version has no reference yet, so the
    retrain-reference flow's reuse check would have nothing to reuse: its sub-flow is skipped (each
    sub-flow's start is API calls against the Prefect server)."""
    train_federated(scenario=scenario, root=str(ws.root), device=device, role="retrained", batch_id=batch_id)
    return retrained_model(ws, scenario, ws.data_version(scenario))


def registered_cost(model: RegisteredModel) -> CostRecord:
    """The cost a registered version's run logged."""
    return CostRecord(model.metrics.get("wall_seconds", math.nan), model.metrics.get("flops", math.nan),
                      int(model.metrics.get("comm_bytes", 0) or 0))


def retrain_for_new_features(batch: Batch, source: RegisteredModel) -> BatchUnlearning:
    """A batch that deleted only held-out samples of a scenario whose feature transform is fit on
    the held-out split: no model of the earlier data version fits the new one's features (nor may
    it keep statistics of the deleted samples), so the new data version gets an exact retrain."""
    ws, record = batch.ws, batch.record
    exact = retrained_model(ws, record.scenario, record.data_version_after) or exact_retrain(
        ws, record.scenario, record.batch_id, batch.device_name)
    tag_attempt(ws, record.scenario, exact.ref.version, 0)
    why = "held-out samples deleted: the feature transform fit on them changed"
    cost = registered_cost(exact)
    attempt = AttemptRecord(attempt=0, method=EXACT_RETRAIN_METHOD, version=exact.ref, certificate=EXACT_RETRAIN,
                            metrics=metrics_of(None, cost), note=f"exact retrain: {why}")
    return BatchUnlearning(source.ref, VersionMetrics(), [attempt], exact_certificate(record.scenario, record.batch_id,
                                                                                 why), cost, {}, exact.ref)


def keep_source(batch: Batch, source: RegisteredModel) -> BatchUnlearning:
    """A batch that deleted only held-out test samples: no model was trained on them, so the source
    model is, unchanged, the model of the new data version — registered as its version with the
    source's guarantee (an original or retrained source is exactly what retraining gives)."""
    ws, record, registered = batch.ws, batch.record, batch.registered
    exact = source.ref.role in ("original", "retrained")
    guarantee = EXACT_RETRAIN if exact else source.tags.get("certificate", EXACT_RETRAIN)
    certificate = Certificate(method=UNCHANGED, guarantee=guarantee, claimed=guarantee, scenario=record.scenario,
                              batch_id=record.batch_id, notes=["only held-out samples were deleted: the model "
                                                               "never trained on them"])
    if 0 in registered:
        ref = ModelRef(version=str(registered[0].version), role="unlearned",
                       data_version=record.data_version_after, run_id=registered[0].run_id)
    else:
        federation = read_federation(ws, record.scenario, torch.device("cpu"), record.data_version_after)
        federation = with_weights(federation, source)
        ref = register_attempt(ws, record, source, federation, Attempt(method=UNCHANGED), 0,
                               Outcome(source.state, CostRecord(0.0, 0.0, 0)), certificate, None)
    attempt = AttemptRecord(attempt=0, method=UNCHANGED, version=ref, certificate=guarantee,
                            metrics=metrics_of(None, CostRecord(0.0, 0.0, 0)),
                            note="only held-out samples deleted: nothing to unlearn")
    return BatchUnlearning(source.ref, VersionMetrics(), [attempt], certificate,
                        CostRecord(0.0, 0.0, 0), {})


def close_without_model(batch: Batch, source: RegisteredModel) -> None:
    """The batch deleted every training sample: no model can be trained or unlearned on what is left.
    The deletion stands (ledger, data version); alias ``current`` — a model trained on the deleted
    samples — is removed; a receipt says so, so no later run retries the batch."""
    ws, record, scenario = batch.ws, batch.record, batch.scenario
    remove_alias(ws, scenario, "current")
    erasure = scan_stores(ws, record.purged, batch.fingerprints or capture_fingerprints(ws, record),
                          batch.found_clean)
    receipt = receipt_without_model(record, source.ref, ws.registry.alias_ref(scenario, "original"),
                                    erasure.model_dump(mode="json"),
                                    ws.relative(record_path(ws.folders, record.batch_id)))
    path = write_receipt(ws, receipt)
    raise BatchCannotSucceed(
        f"{record.batch_id} deleted every training sample of {scenario}: the deletion is applied (data version "
        f"{record.data_version_after}, receipt {ws.relative(path)}) but no model can be trained or unlearned on no "
        f"data, so alias 'current' was removed and nothing serves. Add training data, then train a new model with "
        f"`fedunlearn train --scenario {scenario}`")


