"""A deletion batch's forget set and what measures a model on it — the evaluation sets, the
evaluator (accuracies, membership attacks) and the per-example audit's references — built from
the data before the batch, as ``unlearn-and-register`` builds them for its source and attempts;
and an exact retrain measured with them on the forget sets of the batches whose debt it repays, so
that ``fedunlearn compare`` and MLflow's compare view put it beside the batch's source and unlearned
version on the same samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from prefect import get_run_logger
from torch import nn

from fedunlearn.evaluation.evaluator import EvaluationSets, Evaluator, evaluation_sets
from fedunlearn.evaluation.forget_sets import RETRAINED, figures
from fedunlearn.federation.protocol import Federation
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.unlearning.base import ForgetSet
from fedunlearn.evaluation.audit import AuditResult, AuditSet
from flows.audit import train_audit_set
from flows.results import ReferenceResult
from stores.registry import RegisteredModel
from stores.workspace import ScenarioScope
from tasks.audit import audit, load_audit_set
from tasks.data import load_data
from tasks.evaluation import build_evaluator, evaluate
from tasks.forget_sets import log_forget_set
from tasks.models import backdoor_ids


@dataclass(frozen=True)
class ForgetSetKit:
    """What measures a model on one batch's forget set: its evaluation sets, evaluator and the
    audit's reference models (``audit_set``; None: none usable, the audit is left out), and the
    forget samples' labels before a backdoor trigger relabelled them."""

    sets: EvaluationSets
    evaluator: Evaluator
    audit_set: AuditSet | None
    clean_forget_labels: np.ndarray | None
    seed: int

    def audit(self, name: str, model: nn.Module) -> AuditResult | None:
        if self.audit_set is None:
            return None
        return audit(name, model, self.sets.forget, self.audit_set, self.seed, self.clean_forget_labels)


def forget_set_kit(scope: ScenarioScope, record: BatchRecord, federation: Federation, deletion: ForgetSet,
                   poisoned: list[str], device: torch.device, may_train: bool = True) -> ForgetSetKit:
    """The batch's evaluation sets, evaluator and audit reference models on ``federation`` (the data
    before the batch). Without a usable set, ``may_train`` trains one on the current data
    version (a batch); otherwise the audit is left out (a measurement after the batch, which must not
    retrain them)."""
    ws, scenario = scope.ws, scope.scenario
    forget_ids = {i for ids in deletion.forget_ids.values() for i in ids.tolist()}
    clean_forget_labels = None
    if poisoned and forget_ids <= set(poisoned):  # the forget set carries the trigger: so must its non-members
        clean = load_data(ws, scenario, federation.device, record.data_version_before)
        clean_forget_labels = clean.forget_data(deletion).y.cpu().numpy()
    sets = evaluation_sets(federation, deletion, clean_forget_labels=clean_forget_labels)
    evaluator = build_evaluator(ws, scenario, federation, deletion, bool(poisoned), sets)
    audit_set = load_audit_set(ws, scenario, federation, record.deleted_ids())
    if audit_set is None and may_train:  # none yet, or too many saw held-out rows deleted since
        train_audit_set(scope, device, record.data_version_after)
        audit_set = load_audit_set(ws, scenario, federation, record.deleted_ids())
    return ForgetSetKit(sets, evaluator, audit_set, clean_forget_labels, ws.params.seed)


def retrain_device(result: ReferenceResult) -> torch.device | None:
    """The device the retrain ran on, as its training flow resolved it; None for a reference reused
    without training (its measurement takes the command's device)."""
    return torch.device(result.trained.device) if result.trained else None


def measure_retrained(scope: ScenarioScope, version: str, records: list[BatchRecord], device: torch.device) -> list[str]:
    """The exact retrain ``version`` measured on the forget set of each batch of ``records`` (the
    batches whose debt it repays, as the caller holds them), each logged as that batch's figures;
    returns the batches measured. Per batch, not on their union: each batch's source and unlearned
    version were measured on its own forget set. A batch whose data before it cannot be read back
    (purged, or DVC's cache lost) is left unmeasured with a warning: the retrain serves and the
    receipts say so either way."""
    ws, scenario, log = scope.ws, scope.scenario, get_run_logger()
    if not records:
        return []
    model = ws.registry.load(scenario, version)
    measured = []
    for record in records:
        if record.purged:
            log.warning("%s v%s not measured on the forget set of %s: its rows were purged", scenario,
                        version, record.batch_id)
            continue
        try:
            done = measure_on(scope, record, model, device)
        except Exception as err:  # a measurement after the fact: the repayment it follows stands
            log.warning("%s v%s not measured on the forget set of %s: %s: %s", scenario, version,
                        record.batch_id, type(err).__name__, err)
            continue
        if done:
            measured.append(record.batch_id)
    return measured


def measure_on(scope: ScenarioScope, record: BatchRecord, model: RegisteredModel, device: torch.device) -> bool:
    """``model`` (trained without the batch's samples) evaluated and audited on the batch's forget set;
    False when the batch deleted no training sample (no forget set)."""
    ws = scope.ws
    poisoned = backdoor_ids(ws, record.scenario)
    federation = load_data(ws, record.scenario, device, record.data_version_before, backdoor_ids=poisoned)
    deletion = record.forget_set(federation.clients)
    if deletion is None:
        return False
    kit = forget_set_kit(scope, record, federation, deletion, poisoned, device, may_train=False)
    name = f"retrained-v{model.ref.version}"
    network = federation.model_from(model.state)
    evaluation = evaluate(kit.evaluator, name, network)
    verdict = kit.audit(name, network)
    log_forget_set(ws, record.scenario, model.ref, record.batch_id, RETRAINED, figures(evaluation, verdict),
                   len(kit.sets.forget), verdict.verdict if verdict is not None else None)
    return True
