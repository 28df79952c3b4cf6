"""Stage ``unlearn-and-register`` of ``process-deletions``: the data before the batch and the model
trained on it, the batch's route (``fedunlearn.batch_decisions.route``), then the escalation — each
attempt unlearned, evaluated, audited, registered and gated until one may serve; the last is an
exact retrain. Attempts an earlier run registered are read back, not redone."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from torch import nn

from fedunlearn.batch_decisions import (UNCHANGED, BatchUnlearning, RegisteredAttempt, Route, batch_flops,
                                        exact_certificate, metrics_of, receipt_without_model, route)
from fedunlearn.benchmark import yardstick
from fedunlearn.certify.certificate import EXACT_RETRAIN, Certificate
from fedunlearn.certify.gates import GateOutcome, judge_source
from fedunlearn.certify.tiers import stops
from fedunlearn.config import ForgettingPolicy
from fedunlearn.data.store import read_manifest, refits_on_holdout_deletion
from fedunlearn.errors import BatchCannotSucceed
from fedunlearn.evaluation.audit import AuditResult
from fedunlearn.evaluation.forget_sets import RETRAINED, SOURCE, figures
from fedunlearn.evaluation.judging_cost import JudgingCost, cost_split, judging_cost
from fedunlearn.evaluation.records import Evaluation, VersionMetrics
from fedunlearn.faults import failpoint
from fedunlearn.federation.cost import Cost
from fedunlearn.federation.protocol import Federation
from fedunlearn.receipts import EscalationStep, ModelRef
from fedunlearn.requests.batch import BatchRecord, record_path
from fedunlearn.runtime_choice import IN_PROCESS_RUNTIME, flower_engine
from fedunlearn.unlearning.base import ForgetSet, Outcome
from fedunlearn.unlearning.escalation import EXACT_RETRAIN_METHOD, Attempt, batch_order, is_exact_retrain
from flows.batch import Batch, Unlearned
from flows.forget_sets import ForgetSetKit, forget_set_kit
from flows.reference import reference_for
from flows.train import Training, train_model
from runtime import progress
from stores.registry import ModelWeights, RegisteredModel
from stores.workspace import ScenarioScope, Workspace
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
        federation.budget = model.weights.budget
    return federation


@dataclass(frozen=True)
class Judged:
    """A version measured on the batch's forget set: the model, its evaluation and its audit."""

    model: RegisteredModel
    evaluation: Evaluation
    audit: AuditResult | None = None


@dataclass(frozen=True)
class BatchData:
    """What the batch deleted, read once: the data before the batch (``federation``, holding the
    source's weights), its forget set (None: only held-out samples) and the batch's route."""

    federation: Federation
    forget: ForgetSet | None
    route: Route


@task(name="read-batch-data", task_run_name="read-batch-data", cache_policy=NO_CACHE)
def read_batch_data(scope: ScenarioScope, batch: Batch) -> BatchData:
    """The data before the batch with the source's weights, its forget set, and
    ``batch_decisions.route`` on what the batch deleted and how the scenario's features are fit."""
    record = batch.record
    federation = with_weights(load_data(scope.ws, scope.scenario, batch.device, record.data_version_before,
                                        backdoor_ids=list(batch.poisoned)), batch.source)
    forget = record.forget_set(federation.clients)
    taken = route(refits_on_holdout_deletion(read_manifest(scope.scenario, scope.ws.root)),
                  any(e.held_out for e in record.requests), None if forget is None else forget.num_forget,
                  sum(len(c) for c in federation.clients))
    if taken in (Route.exact_only, Route.retrain_for_new_features):
        get_run_logger().warning("%s deletes held-out samples, on which %s's feature transform is fit: every "
                                 "sample's features moved, so the batch retrains exactly", record.batch_id,
                                 scope.scenario)
    return BatchData(federation, forget, taken)


@dataclass(frozen=True)
class Judging:
    """What every attempt of one batch is judged with, gathered once (``gather_judging``): the scope,
    the batch and its data (``data``), the evaluation sets, evaluator and audit reference models
    (``kit``), the source model judged on them (``source``), and what the methods unlearn
    (``setup``: the forget set with what the source is measured to remember)."""

    scope: ScenarioScope
    batch: Batch
    data: BatchData
    kit: ForgetSetKit
    source: Judged
    setup: yardstick.BenchmarkSetup

    @property
    def ws(self) -> Workspace:
        return self.scope.ws

    @property
    def scenario(self) -> str:
        return self.scope.scenario

    @property
    def record(self) -> BatchRecord:
        return self.batch.record

    @property
    def federation(self) -> Federation:
        return self.data.federation

    def audit(self, name: str, model: nn.Module) -> AuditResult:
        return audit_with(self.kit, self.ws.params.seed, name, model)

    def judge(self, name: str, model: RegisteredModel) -> Judged:
        return judge_with(self.kit, self.federation, self.ws.params.seed, name, model)


@task(name="gather-judging", task_run_name="gather-judging", cache_policy=NO_CACHE)
def gather_judging(scope: ScenarioScope, batch: Batch, data: BatchData) -> Judging:
    """The evaluation sets, evaluator and audit reference models (trained first if the scenario has
    none usable), the source model evaluated and audited on the batch's forget set, and the forget
    set a removal method acts on: what the source is measured to remember (the rest is left as a
    retrain would leave it)."""
    record, federation, seed = batch.record, data.federation, scope.ws.params.seed
    kit = forget_set_kit(scope, record, federation, data.forget, list(batch.poisoned), batch.device)
    if hasattr(federation, "calibration"):  # HFL: a method sizing its strength reads pool A, never pool B
        federation.calibration = kit.audit_set.calibration_rows(federation.test)
    source = judge_with(kit, federation, seed, f"source-v{batch.source.ref.version}", batch.source)
    forget = data.forget.with_remembered(source.audit.removal_targets())
    setup = yardstick.BenchmarkSetup(record.scenario, f"batch {record.batch_id}", federation, forget,
                                     bool(batch.poisoned), kit.sets)
    return Judging(scope, batch, data, kit, source, setup)


def audit_with(kit: ForgetSetKit, seed: int, name: str, model: nn.Module) -> AuditResult:
    return audit(name, model, kit.sets.forget, kit.audit_set, seed, kit.clean_forget_labels)


def judge_with(kit: ForgetSetKit, federation: Federation, seed: int, name: str, model: RegisteredModel) -> Judged:
    network = federation.model_from(model.state)
    return Judged(model, evaluate(kit.evaluator, name, network), audit_with(kit, seed, name, network))


@dataclass(frozen=True)
class Escalated:
    """The escalation done: its attempts, the last one's certificate and cost, and the data version's
    exact reference as it stands at the end (the one found, or the retrain that ended the chain)."""

    attempts: list[EscalationStep]
    certificate: Certificate | None
    cost: Cost
    reference: Judged | None


@task(name="unlearn-and-register", task_run_name="unlearn-and-register", cache_policy=NO_CACHE)
def unlearn_and_register(scope: ScenarioScope, batch: Batch) -> Unlearned:
    """The batch's attempts in order, each registered and gated, until one may serve under its
    forgetting policy (``tiers.serves``; the last, exact retrain, needs no gate). Attempts registered
    by an earlier run are read back, not redone. Unless the user chose the attempts, a forget set the
    source remembers, or may (``AuditResult.removal_wanted``), tries the methods that can remove it first
    (``escalation.batch_order``)."""
    data = read_batch_data(scope, batch)
    if data.route is Route.retrain_for_new_features:
        return Unlearned(batch, retrain_for_new_features(scope, batch))
    if data.route is Route.keep_source:
        return Unlearned(batch, keep_source(batch, scope.ws))
    if data.route is Route.no_model:
        close_without_model(scope, batch)
    judging = gather_judging(scope, batch, data)
    reference = batch_reference(judging)
    source_gates = judge_the_source(judging, reference)
    escalated = escalate(judging, ordered_attempts(judging, data.route), reference)
    return Unlearned(batch, batch_outcome(judging, escalated, source_gates))


def batch_reference(judging: Judging) -> Judged | None:
    """The new data version's exact reference, retrained first when the batch asked for it
    (``--retrain``), evaluated on the batch's forget set; None when it has none."""
    batch, record = judging.batch, judging.batch.record
    if batch.retrain_reference:
        reference_for(judging.scope, batch.device, record.data_version_after, record.batch_id)
    found = find_reference(judging.ws, judging.scenario, record.data_version_after)
    if found is None:
        return None
    return Judged(found, evaluate(judging.kit.evaluator, "retrained", judging.federation.model_from(found.state)))


def judge_the_source(judging: Judging, reference: Judged | None) -> GateOutcome:
    """The source judged by the checks a candidate meets (``gates.judge_source``), logged on its run."""
    source = judging.source
    gates = judge_source(source.evaluation, reference=reference.evaluation if reference else None,
                         gates=judging.batch.gates, source_audit=source.audit.as_check(),
                         atypical=source.audit.atypical)
    log_source_audit(judging.ws, source.model.ref.run_id, judging.record.batch_id, source.audit, gates)
    return gates


def ordered_attempts(judging: Judging, taken: Route) -> list[Attempt]:
    """The batch's attempts, in the order ``escalation.batch_order`` gives on its route and on what the
    source's audit measured."""
    batch, source_audit = judging.batch, judging.source.audit
    planned = list(batch.attempts)
    ordered = batch_order(planned, judging.scope.config.setting,
                          exact_only=taken in (Route.exact_only, Route.retrain_for_new_features),
                          removal_wanted=source_audit.removal_wanted(), chosen_by_user=batch.chosen_by_user)
    if ordered != planned and not ordered[0].exact:
        get_run_logger().info("the source model remembers, or may remember, forget samples (per sample: %s; %d "
                              "removal target(s); audit AUC %.3f): %s first, where the seed methods' gradient is "
                              "close to zero", source_audit.per_sample_summary(), len(source_audit.removal_targets()),
                              source_audit.auc, ordered[0].method)
    return ordered


def escalate(judging: Judging, planned: list[Attempt], reference: Judged | None) -> Escalated:
    """The attempts in order until one may serve (``tiers.serves``); the exact retrain ends the chain."""
    attempts, certificate, cost, forgetting = [], None, Cost(), judging.batch.forgetting
    label = f"attempts of {judging.record.batch_id}"
    for number, attempt in enumerate(planned):
        progress.report(label, number, len(planned), f"attempt {number + 1} of at most {len(planned)}: "
                                                     f"{attempt.method}")
        if attempt.exact:
            record, certificate, reference = try_exact(judging, attempt, number, len(planned), reference)
            attempts.append(record)
            cost = registered_cost(reference.model)
            break
        record, certificate, cost = try_method(judging, attempt, number, len(planned), reference)
        attempts.append(record)
        gate = record.gates
        if stops(gate, forgetting, exact_in_hand=reference is not None):
            break
        get_run_logger().warning("attempt %d (%s) did not pass its gates (%s%s): escalating", number + 1,
                                 attempt.method, gate.verdict, "; interim tier: " + "; ".join(gate.held_back)
                                 if forgetting is ForgettingPolicy.interim else "")
    if attempts:
        last = attempts[-1]
        progress.report(label, len(attempts), len(planned), f"{len(attempts)} attempt(s), the last {last.method}: "
                        + (last.gates.verdict if last.gates is not None else "exact retrain"), final=True)
    return Escalated(attempts, certificate, cost, reference)


def try_exact(judging: Judging, attempt: Attempt, number: int, steps: int,
              reference: Judged | None) -> tuple[EscalationStep, Certificate, Judged]:
    """The escalation's last step: the reference of the new data version, or an exact retrain now;
    audited, described, no gate needed. It becomes the batch's reference."""
    ws, scenario, record = judging.ws, judging.scenario, judging.record
    if reference is None:
        reference = judging.judge("retrained", exact_retrain(judging.scope, record, judging.batch.device))
    else:
        reference = replace(reference, audit=judging.audit("retrained",
                                                           judging.federation.model_from(reference.model.state)))
    exact, verdict = reference.model, reference.audit
    tag_attempt(ws, scenario, exact.ref.version, number)
    log_audit(ws, exact.ref.run_id, verdict)
    describe_version(ws, scenario, exact.ref.version, batch_description(
        record, number, steps, attempt.method, attempt.options, EXACT_RETRAIN, None,
        note=f"none needed (exact retrain; audit {verdict.verdict})"))
    step = EscalationStep(attempt=number, method=attempt.method, version=exact.ref, certificate=EXACT_RETRAIN,
                         metrics=metrics_of(reference.evaluation, None),
                         note=f"exact retrain: nothing of the deleted samples, no gate needed (audit: "
                              f"{verdict.verdict})")
    return step, exact_certificate(scenario, record.batch_id, "the escalation's last step"), reference


def try_method(judging: Judging, attempt: Attempt, number: int, steps: int,
               reference: Judged | None) -> tuple[EscalationStep, Certificate, Cost]:
    """One unlearning attempt (or the one an earlier run registered, read back): evaluated, audited,
    registered, gated against the source or the reference, described."""
    ws, scenario, name, source = judging.ws, judging.scenario, f"{attempt.method}-{number}", judging.source
    earlier = judging.batch.registered.get(number)
    if earlier is not None:
        ref, outcome, certificate = read_attempt(ws, scenario, earlier)
    else:
        outcome, certificate = compute_attempt(judging, attempt, number)
    model = judging.federation.model_from(outcome.state)
    evaluation = evaluate(judging.kit.evaluator, name, model)
    verdict = judging.audit(name, model)
    if earlier is None:
        ref = register_attempt(ws, judging.record, source.model, judging.federation, attempt, number, outcome,
                               certificate, evaluation, steps)
        log_audit(ws, ref.run_id, verdict)
        failpoint("after-registration")
    gate = apply_gates(name, evaluation, certificate.guarantee, source.evaluation,
                       reference.evaluation if reference else None, judging.batch.gates, verdict, source.audit)
    describe_version(ws, scenario, ref.version, batch_description(
        judging.record, number, steps, attempt.method, attempt.options, certificate.guarantee,
        source.model.ref.version, gate))
    step = EscalationStep(attempt=number, method=attempt.method, options=attempt.options, version=ref,
                         certificate=certificate.guarantee, gates=gate, metrics=metrics_of(evaluation, outcome.cost),
                         cost_split=cost_split(outcome.cost, judging_flops(judging)))
    return step, certificate, outcome.cost


def judging_flops(judging: Judging) -> JudgingCost | None:
    """What evaluating and auditing one candidate of this batch costs; None where the federation
    does not count training FLOPs per sample (it is then not counted)."""
    per_sample = getattr(judging.federation, "flops_per_sample", None)
    if per_sample is None:
        return None
    kit = judging.kit
    pool = None if kit.audit_set is None else len(kit.audit_set.pool)
    return judging_cost(per_sample(), kit.sets, pool, 0 if kit.audit_set is None else len(kit.audit_set))


def compute_attempt(judging: Judging, attempt: Attempt, number: int) -> tuple[Outcome, Certificate]:
    """The attempt's model, through Flower on a Flower runner where the method has a Flower version;
    otherwise in-process, and on a Flower runner the batch says so (the user asked for Flower)."""
    source, engine = judging.source, flower_engine(judging.batch.runtime)
    if engine is not None and attempt.method in flower_methods():
        return unlearn_through_flower(judging.ws, judging.record, judging.setup, source.model.state, attempt.method,
                                      source.evaluation.test_acc, attempt.options, engine)
    if engine is not None:
        get_run_logger().warning("attempt %d (%s) runs in-process: %s has no Flower version (Flower engine %s)",
                                 number + 1, attempt.method, attempt.method, engine)
    return unlearn_in_gpu_slot(judging.setup, source.model.state, attempt.method, source.evaluation.test_acc,
                               attempt.options)


def batch_outcome(judging: Judging, escalated: Escalated, source_gates: GateOutcome) -> BatchUnlearning:
    source, reference, reference_metrics = judging.source, escalated.reference, None
    log_on_forget_set(judging, source, SOURCE)
    if reference is not None:
        # Its training run could not know the forget set (it logged NaN): the batch's figures.
        if reference.audit is None:
            reference = replace(reference, audit=judging.audit(
                "retrained", judging.federation.model_from(reference.model.state)))
        log_on_forget_set(judging, reference, RETRAINED)
        reference_metrics = VersionMetrics.of(reference.evaluation, registered_cost(reference.model))
    judged = judging_flops(judging)
    spent = batch_flops(escalated.attempts, escalated.cost.flops if is_exact_retrain(escalated.attempts[-1].method)
                        else None, judged.flops if judged else None)
    return BatchUnlearning(source.model.ref, VersionMetrics.of(source.evaluation, None), escalated.attempts,
                           escalated.certificate, escalated.cost,
                           {str(c): len(ids) for c, ids in judging.setup.batch.forget_ids.items()},
                           reference.model.ref if reference else None, reference_metrics, source_gates,
                           batch_flops=spent)


def log_on_forget_set(judging: Judging, judged: Judged, part: str) -> None:
    """The batch's own measurement of its source or reference on its forget set, where ``compare``
    and MLflow's compare view read it beside the unlearned version's (no second evaluation)."""
    log_forget_set(judging.ws, judging.scenario, judged.model.ref, judging.record.batch_id, part,
                   figures(judged.evaluation, judged.audit), len(judging.kit.sets.forget), judged.audit.verdict)


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
    budget = getattr(outcome, "budget", None)
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


def read_attempt(ws: Workspace, scenario: str, earlier: RegisteredAttempt) -> tuple[ModelRef, Outcome, Certificate]:
    """An attempt as an earlier run registered it: its weights, cost and certificate. A resumed
    batch judges this model, not a new one (a method with fresh noise would otherwise be judged on
    weights nobody registered)."""
    version = earlier.ref
    registered = ws.registry.load(scenario, version.version)
    certificate = Certificate.from_json(ws.registry.text(version.run_id, "certificate.json"))
    metrics = registered.metrics
    cost = Cost(metrics.get("wall_seconds", math.nan), metrics.get("flops", math.nan),
                      int(metrics.get("comm_bytes", 0) or 0))
    outcome = Outcome(registered.state, cost, notes={"resumed": f"registered as v{version.version} before the run "
                                                                "was interrupted"})
    return registered.ref, outcome, certificate


def tag_attempt(ws: Workspace, scenario: str, version: str, number: int) -> None:
    tag_version(ws, scenario, version, "attempt", str(number))


def exact_retrain(scope: ScenarioScope, record: BatchRecord, device: torch.device) -> RegisteredModel:
    """The escalation's last step: the batch's new data version trained from scratch (``train_model``,
    role and alias ``retrained``). Only called when that version has no reference yet, so
    ``reference_for``'s reuse check would have nothing to reuse."""
    trained = train_model(scope, device, record.data_version_after, Training(role="retrained",
                                                                            batch_id=record.batch_id))
    return scope.ws.registry.load(scope.scenario, trained.model_version)


def registered_cost(model: RegisteredModel) -> Cost:
    """The cost a registered version's run logged."""
    return Cost(model.metrics.get("wall_seconds", math.nan), model.metrics.get("flops", math.nan),
                      int(model.metrics.get("comm_bytes", 0) or 0))


def retrain_for_new_features(scope: ScenarioScope, batch: Batch) -> BatchUnlearning:
    """A batch that deleted only held-out samples of a scenario whose feature transform is fit on
    the held-out split: no model of the earlier data version fits the new one's features (nor may
    it keep statistics of the deleted samples), so the new data version gets an exact retrain."""
    ws, record, source = scope.ws, batch.record, batch.source
    exact = retrained_model(ws, record.scenario, record.data_version_after) or exact_retrain(
        scope, record, batch.device)
    tag_attempt(ws, record.scenario, exact.ref.version, 0)
    why = "held-out samples deleted: the feature transform fit on them changed"
    cost = registered_cost(exact)
    attempt = EscalationStep(attempt=0, method=EXACT_RETRAIN_METHOD, version=exact.ref, certificate=EXACT_RETRAIN,
                            metrics=metrics_of(None, cost), note=f"exact retrain: {why}")
    return BatchUnlearning(source.ref, VersionMetrics(), [attempt], exact_certificate(record.scenario, record.batch_id,
                                                                                 why), cost, {}, exact.ref)


def keep_source(batch: Batch, ws: Workspace) -> BatchUnlearning:
    """A batch that deleted only held-out test samples: no model was trained on them, so the source
    model is, unchanged, the model of the new data version — registered as its version with the
    source's guarantee (an original or retrained source is exactly what retraining gives)."""
    record, registered, source = batch.record, batch.registered, batch.source
    exact = source.ref.role in ("original", "retrained")
    guarantee = EXACT_RETRAIN if exact else source.tags.get("certificate", EXACT_RETRAIN)
    certificate = Certificate(method=UNCHANGED, guarantee=guarantee, claimed=guarantee, scenario=record.scenario,
                              batch_id=record.batch_id, notes=["only held-out samples were deleted: the model "
                                                               "never trained on them"])
    if 0 in registered:
        ref = registered[0].ref
    else:
        federation = read_federation(ws, record.scenario, torch.device("cpu"), record.data_version_after)
        federation = with_weights(federation, source)
        ref = register_attempt(ws, record, source, federation, Attempt(method=UNCHANGED), 0,
                               Outcome(source.state, Cost(0.0, 0.0, 0)), certificate, None)
    attempt = EscalationStep(attempt=0, method=UNCHANGED, version=ref, certificate=guarantee,
                            metrics=metrics_of(None, Cost(0.0, 0.0, 0)),
                            note="only held-out samples deleted: nothing to unlearn")
    return BatchUnlearning(source.ref, VersionMetrics(), [attempt], certificate,
                        Cost(0.0, 0.0, 0), {})


def close_without_model(scope: ScenarioScope, batch: Batch) -> None:
    """The batch deleted every training sample: no model can be trained or unlearned on what is left.
    The deletion stands (ledger, data version); alias ``current`` — a model trained on the deleted
    samples — is removed; a receipt says so, so no later run retries the batch."""
    ws, scenario = scope.ws, scope.scenario
    record, source = batch.record, batch.source
    remove_alias(ws, scenario, "current")
    erasure = scan_stores(ws, record.purged, batch.fingerprints or capture_fingerprints(ws, record),
                          batch.found_clean, record)
    receipt = receipt_without_model(record, source.ref, ws.registry.alias_ref(scenario, "original"),
                                    erasure.model_dump(mode="json"),
                                    ws.relative(record_path(ws.folders, record.batch_id)))
    path = write_receipt(ws, receipt)
    raise BatchCannotSucceed(
        f"{record.batch_id} deleted every training sample of {scenario}: the deletion is applied (data version "
        f"{record.data_version_after}, receipt {ws.relative(path)}) but no model can be trained or unlearned on no "
        f"data, so alias 'current' was removed and nothing serves. Add training data, then train a new model with "
        f"`fedunlearn train --scenario {scenario}`")


