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

from fedunlearn.batch_decisions import (UNCHANGED, BatchUnlearning, RegisteredAttempt, Route, exact_certificate,
                                        metrics_of, route)
from fedunlearn.batch_receipts import batch_flops, receipt_without_model
from fedunlearn.benchmark import yardstick
from fedunlearn.certify.certificate import EXACT_RETRAIN, Certificate
from fedunlearn.certify.gates import GateOutcome, PromotionGates, judge_source
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
    """What every candidate of one batch is judged with, gathered once (``gather_judging``): the
    evaluation sets, evaluator and audit reference models (``kit``), the data a candidate's weights are
    read into (``federation``), the audit's ``seed``, and the source judged on them (``source``: the
    gates' baseline)."""

    kit: ForgetSetKit
    federation: Federation
    seed: int
    source: Judged

    def audit(self, name: str, state: dict) -> AuditResult:
        """A candidate's weights audited on the forget set."""
        return audit_with(self.kit, self.seed, name, self.federation.model_from(state))

    def judge(self, name: str, state: dict) -> tuple[Evaluation, AuditResult]:
        """A candidate's weights evaluated and audited."""
        network = self.federation.model_from(state)
        return evaluate(self.kit.evaluator, name, network), audit_with(self.kit, self.seed, name, network)

    def gate(self, name: str, judged: tuple[Evaluation, AuditResult], guarantee: str,
             reference: Judged | None, gates: PromotionGates) -> GateOutcome:
        """A candidate's gates against the source, and the exact reference where there is one."""
        evaluation, verdict = judged
        return apply_gates(name, evaluation, guarantee, self.source.evaluation,
                           reference.evaluation if reference else None, gates, verdict, self.source.audit)

    def flops(self) -> JudgingCost | None:
        """What evaluating and auditing one candidate costs; None where the federation does not count
        training FLOPs per sample (it is then not counted)."""
        per_sample = getattr(self.federation, "flops_per_sample", None)
        if per_sample is None:
            return None
        audit_set = self.kit.audit_set
        pool = None if audit_set is None else len(audit_set.pool)
        return judging_cost(per_sample(), self.kit.sets, pool, 0 if audit_set is None else len(audit_set))


@task(name="gather-judging", task_run_name="gather-judging", cache_policy=NO_CACHE)
def gather_judging(scope: ScenarioScope, batch: Batch, data: BatchData) -> Judging:
    """The evaluation sets, evaluator and audit reference models (trained first if the scenario has
    none usable), and the source model evaluated and audited on the batch's forget set."""
    record, federation, seed = batch.record, data.federation, scope.ws.params.seed
    kit = forget_set_kit(scope, record, federation, data.forget, list(batch.poisoned), batch.device)
    if hasattr(federation, "calibration"):  # HFL: a method sizing its strength reads pool A, never pool B
        federation.calibration = kit.audit_set.calibration_rows(federation.test)
    network = federation.model_from(batch.source.state)
    name = f"source-v{batch.source.ref.version}"
    source = Judged(batch.source, evaluate(kit.evaluator, name, network), audit_with(kit, seed, name, network))
    return Judging(kit, federation, seed, source)


@dataclass(frozen=True)
class Unlearning:
    """What every method of one batch unlearns from: the source's weights and test accuracy (a
    method's target), and ``setup``, the forget set with what the source is measured to remember (the
    rest is left as a retrain would leave it) in the federation, with the evaluation sets."""

    source: RegisteredModel
    source_test_acc: float
    setup: yardstick.BenchmarkSetup


def unlearning_inputs(batch: Batch, data: BatchData, judging: Judging) -> Unlearning:
    source = judging.source
    forget = data.forget.with_remembered(source.audit.removal_targets())
    setup = yardstick.BenchmarkSetup(batch.record.scenario, f"batch {batch.record.batch_id}", data.federation,
                                     forget, bool(batch.poisoned), judging.kit.sets)
    return Unlearning(batch.source, source.evaluation.test_acc, setup)


def audit_with(kit: ForgetSetKit, seed: int, name: str, model: nn.Module) -> AuditResult:
    return audit(name, model, kit.sets.forget, kit.audit_set, seed, kit.clean_forget_labels)


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
    reference = batch_reference(scope, batch, judging)
    source_gates = judge_the_source(scope.ws, batch, judging.source, reference)
    planned = ordered_attempts(batch, scope.config.setting, judging.source.audit, data.route)
    escalated = escalate(scope, batch, judging, unlearning_inputs(batch, data, judging), planned, reference)
    return Unlearned(batch, batch_outcome(scope, batch, judging, data.forget, escalated, source_gates))


def batch_reference(scope: ScenarioScope, batch: Batch, judging: Judging) -> Judged | None:
    """The new data version's exact reference, retrained first when the batch asked for it
    (``--retrain``), evaluated on the batch's forget set; None when it has none."""
    record = batch.record
    if batch.retrain_reference:
        reference_for(scope, batch.device, record.data_version_after, record.batch_id)
    found = find_reference(scope.ws, scope.scenario, record.data_version_after)
    if found is None:
        return None
    return Judged(found, evaluate(judging.kit.evaluator, "retrained", judging.federation.model_from(found.state)))


def judge_the_source(ws: Workspace, batch: Batch, source: Judged, reference: Judged | None) -> GateOutcome:
    """The source judged by the checks a candidate meets (``gates.judge_source``), logged on its run."""
    gates = judge_source(source.evaluation, reference=reference.evaluation if reference else None,
                         gates=batch.gates, source_audit=source.audit.as_check(), atypical=source.audit.atypical)
    log_source_audit(ws, source.model.ref.run_id, batch.record.batch_id, source.audit, gates)
    return gates


def ordered_attempts(batch: Batch, setting: str, source_audit: AuditResult, taken: Route) -> list[Attempt]:
    """The batch's attempts, in the order ``escalation.batch_order`` gives on its route and on what the
    source's audit measured."""
    planned = list(batch.attempts)
    ordered = batch_order(planned, setting, exact_only=taken in (Route.exact_only, Route.retrain_for_new_features),
                          removal_wanted=source_audit.removal_wanted(), chosen_by_user=batch.chosen_by_user)
    if ordered != planned and not ordered[0].exact:
        get_run_logger().info("the source model remembers, or may remember, forget samples (per sample: %s; %d "
                              "removal target(s); audit AUC %.3f): %s first, where the seed methods' gradient is "
                              "close to zero", source_audit.per_sample_summary(), len(source_audit.removal_targets()),
                              source_audit.auc, ordered[0].method)
    return ordered


def escalate(scope: ScenarioScope, batch: Batch, judging: Judging, inputs: Unlearning, planned: list[Attempt],
             reference: Judged | None) -> Escalated:
    """The attempts in order until one may serve (``tiers.serves``); the exact retrain ends the chain."""
    attempts, certificate, cost = [], None, Cost()
    label, cost_of_judging = f"attempts of {batch.record.batch_id}", judging.flops()
    for number, attempt in enumerate(planned):
        step = Step(attempt, number, len(planned))
        progress.report(label, number, len(planned), f"attempt {number + 1} of at most {len(planned)}: "
                                                     f"{attempt.method}")
        if attempt.exact:
            reference = audited_reference(scope, batch, judging, reference)
            record, certificate = record_exact(scope.ws, batch.record, step, reference)
            attempts.append(record)
            cost = registered_cost(reference.model)
            break
        candidate = attempt_outcome(scope.ws, batch, inputs, step)
        judged = judging.judge(step.name, candidate.outcome.state)
        gate = judging.gate(step.name, judged, candidate.certificate.guarantee, reference, batch.gates)
        attempts.append(record_attempt(scope.ws, batch, inputs, step, candidate, judged, gate, cost_of_judging))
        certificate, cost = candidate.certificate, candidate.outcome.cost
        if stops(gate, batch.forgetting, exact_in_hand=reference is not None):
            break
        get_run_logger().warning("attempt %d (%s) did not pass its gates (%s%s): escalating", number + 1,
                                 attempt.method, gate.verdict, "; interim tier: " + "; ".join(gate.held_back)
                                 if batch.forgetting is ForgettingPolicy.interim else "")
    if attempts:
        last = attempts[-1]
        progress.report(label, len(attempts), len(planned), f"{len(attempts)} attempt(s), the last {last.method}: "
                        + (last.gates.verdict if last.gates is not None else "exact retrain"), final=True)
    return Escalated(attempts, certificate, cost, reference)


@dataclass(frozen=True)
class Step:
    """Attempt ``number`` of the ``steps`` the escalation plans."""

    attempt: Attempt
    number: int
    steps: int

    @property
    def name(self) -> str:
        return f"{self.attempt.method}-{self.number}"


@dataclass(frozen=True)
class Candidate:
    """An attempt's model, computed now (``ref`` None until registered) or read back as an earlier
    run registered it, with its certificate."""

    outcome: Outcome
    certificate: Certificate
    ref: ModelRef | None = None


def audited_reference(scope: ScenarioScope, batch: Batch, judging: Judging, reference: Judged | None) -> Judged:
    """The escalation's last step: the new data version's reference, or an exact retrain of it now
    (``exact_retrain``), audited on the forget set."""
    if reference is None:
        model = exact_retrain(scope, batch.record, batch.device)
        evaluation, verdict = judging.judge("retrained", model.state)
        return Judged(model, evaluation, verdict)
    return replace(reference, audit=judging.audit("retrained", reference.model.state))


def record_exact(ws: Workspace, record: BatchRecord, step: Step, reference: Judged) -> tuple[EscalationStep, Certificate]:
    """The exact step tagged, its audit logged and its version described; no gate needed."""
    exact, verdict, scenario = reference.model, reference.audit, record.scenario
    tag_attempt(ws, scenario, exact.ref.version, step.number)
    log_audit(ws, exact.ref.run_id, verdict)
    describe_version(ws, scenario, exact.ref.version, batch_description(
        record, step.number, step.steps, step.attempt.method, step.attempt.options, EXACT_RETRAIN, None,
        note=f"none needed (exact retrain; audit {verdict.verdict})"))
    done = EscalationStep(attempt=step.number, method=step.attempt.method, version=exact.ref,
                          certificate=EXACT_RETRAIN, metrics=metrics_of(reference.evaluation, None),
                          note=f"exact retrain: nothing of the deleted samples, no gate needed (audit: "
                               f"{verdict.verdict})")
    return done, exact_certificate(scenario, record.batch_id, "the escalation's last step")


def attempt_outcome(ws: Workspace, batch: Batch, inputs: Unlearning, step: Step) -> Candidate:
    """The attempt an earlier run registered, read back (a method with fresh noise would otherwise be
    judged on weights nobody registered); else computed: through Flower on a Flower runner where the
    method has a Flower version, otherwise in-process (on a Flower runner the batch says so)."""
    earlier = batch.registered.get(step.number)
    if earlier is not None:
        return read_attempt(ws, batch.record.scenario, earlier)
    attempt, engine = step.attempt, flower_engine(batch.runtime)
    if engine is not None and attempt.method in flower_methods():
        return Candidate(*unlearn_through_flower(ws, batch.record, inputs.setup, inputs.source.state, attempt.method,
                                                 inputs.source_test_acc, attempt.options, engine))
    if engine is not None:
        get_run_logger().warning("attempt %d (%s) runs in-process: %s has no Flower version (Flower engine %s)",
                                 step.number + 1, attempt.method, attempt.method, engine)
    return Candidate(*unlearn_in_gpu_slot(inputs.setup, inputs.source.state, attempt.method, inputs.source_test_acc,
                                          attempt.options))


def record_attempt(ws: Workspace, batch: Batch, inputs: Unlearning, step: Step, candidate: Candidate,
                   judged: tuple[Evaluation, AuditResult], gate: GateOutcome,
                   cost_of_judging: JudgingCost | None) -> EscalationStep:
    """An attempt registered (unless an earlier run did), its audit logged on its run and its version
    described with its gates."""
    evaluation, verdict = judged
    attempt, outcome, certificate, ref = step.attempt, candidate.outcome, candidate.certificate, candidate.ref
    if ref is None:
        ref = register_attempt(ws, batch.record, inputs.source, inputs.setup.fed_state, attempt, step.number,
                               outcome, certificate, evaluation, step.steps)
        log_audit(ws, ref.run_id, verdict)
        failpoint("after-registration")
    describe_version(ws, batch.record.scenario, ref.version, batch_description(
        batch.record, step.number, step.steps, attempt.method, attempt.options, certificate.guarantee,
        inputs.source.ref.version, gate))
    return EscalationStep(attempt=step.number, method=attempt.method, options=attempt.options, version=ref,
                          certificate=certificate.guarantee, gates=gate, metrics=metrics_of(evaluation, outcome.cost),
                          cost_split=cost_split(outcome.cost, cost_of_judging))


def batch_outcome(scope: ScenarioScope, batch: Batch, judging: Judging, forget: ForgetSet, escalated: Escalated,
                  source_gates: GateOutcome) -> BatchUnlearning:
    """The escalation's figures as the batch's receipt and registry hold them; the source's and the
    reference's own measurement on the forget set logged where ``compare`` reads them."""
    source, reference, reference_metrics = judging.source, escalated.reference, None
    forget_size = len(judging.kit.sets.forget)
    log_on_forget_set(scope.ws, batch.record, source, SOURCE, forget_size)
    if reference is not None:
        # Its training run could not know the forget set (it logged NaN): the batch's figures.
        if reference.audit is None:
            reference = replace(reference, audit=judging.audit("retrained", reference.model.state))
        log_on_forget_set(scope.ws, batch.record, reference, RETRAINED, forget_size)
        reference_metrics = VersionMetrics.of(reference.evaluation, registered_cost(reference.model))
    judged = judging.flops()
    spent = batch_flops(escalated.attempts, escalated.cost.flops if is_exact_retrain(escalated.attempts[-1].method)
                        else None, judged.flops if judged else None)
    return BatchUnlearning(source.model.ref, VersionMetrics.of(source.evaluation, None), escalated.attempts,
                           escalated.certificate, escalated.cost,
                           {str(c): len(ids) for c, ids in forget.forget_ids.items()},
                           reference.model.ref if reference else None, reference_metrics, source_gates,
                           batch_flops=spent)


def log_on_forget_set(ws: Workspace, record: BatchRecord, judged: Judged, part: str, forget_size: int) -> None:
    """The batch's own measurement of its source or reference on its forget set, where ``compare``
    and MLflow's compare view read it beside the unlearned version's (no second evaluation)."""
    log_forget_set(ws, record.scenario, judged.model.ref, record.batch_id, part,
                   figures(judged.evaluation, judged.audit), forget_size, judged.audit.verdict)


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


def read_attempt(ws: Workspace, scenario: str, earlier: RegisteredAttempt) -> Candidate:
    """An attempt as an earlier run registered it: its weights, cost and certificate."""
    version = earlier.ref
    registered = ws.registry.load(scenario, version.version)
    certificate = Certificate.from_json(ws.registry.text(version.run_id, "certificate.json"))
    metrics = registered.metrics
    cost = Cost(metrics.get("wall_seconds", math.nan), metrics.get("flops", math.nan),
                      int(metrics.get("comm_bytes", 0) or 0))
    outcome = Outcome(registered.state, cost, notes={"resumed": f"registered as v{version.version} before the run "
                                                                "was interrupted"})
    return Candidate(outcome, certificate, registered.ref)


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


