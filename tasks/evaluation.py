"""Prefect tasks of evaluation, shared by the benchmark and the deletion pipeline: the evaluator of
a batch (``fedunlearn.evaluation.evaluator``), evaluating a model, and judging it at the gates."""

from __future__ import annotations

import os

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from fedunlearn.certify.gates import GateOutcome, PromotionGates, judge
from fedunlearn.evaluation.evaluator import (EvaluationSets, Evaluator, evaluation_sets, shadow_key,
                                             train_shadow_model)
from fedunlearn.evaluation.records import Evaluation
from fedunlearn.evaluation.audit import AuditResult
from fedunlearn.federation import local
from fedunlearn.federation.protocol import Federation
from fedunlearn.unlearning.base import ForgetSet
from fedunlearn.timing import core_compute
from stores.workspace import Workspace


SHADOW_DIR = "shadow-models"


@task(name="build-evaluator", cache_policy=NO_CACHE)
@core_compute
def build_evaluator(ws: Workspace, scenario: str, federation: Federation, forget_set: ForgetSet,
                    backdoor: bool = False, sets: EvaluationSets | None = None) -> Evaluator:
    """The batch's evaluator, its shadow model read from the workspace's cache when one was trained
    on the same rows and settings before (``evaluator.shadow_key``), else trained and kept there.
    Only the current key of a scenario is kept: a shadow model trained on a held-out row that a
    request deleted since is removed with the first batch after it."""
    sets = sets or evaluation_sets(federation, forget_set)
    key = shadow_key(federation, sets.shadow_in)
    folder = ws.cache_dir / SHADOW_DIR
    path = folder / f"{scenario}-{key}.pt"
    shadow = None
    if path.is_file():
        shadow = federation.model_from(federation.engine().initial_state())
        shadow.load_state_dict(torch.load(path, map_location=federation.device, weights_only=True))
    else:
        shadow = train_shadow_model(federation, sets.shadow_in)
        folder.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(".tmp")
        torch.save(shadow.state_dict(), staged)
        os.replace(staged, path)
    for stale in folder.glob(f"{scenario}-*.pt"):
        if stale != path:
            stale.unlink()
    return Evaluator(federation, forget_set, backdoor=backdoor, sets=sets, shadow_model=shadow)


@core_compute
def accuracy(model: nn.Module, data: local.Tensors) -> float:
    """A model's accuracy on ``data``, timed as the core's compute (training's per-round and final figures)."""
    return local.accuracy(model, data)


@task(name="evaluate", cache_policy=NO_CACHE, task_run_name="evaluate-{name}")
@core_compute
def evaluate(evaluator: Evaluator, name: str, model: nn.Module, reference: nn.Module | None = None) -> Evaluation:
    return evaluator.evaluate(model, reference)


@task(name="apply-gates", cache_policy=NO_CACHE, task_run_name="gates-{name}")
def apply_gates(name: str, candidate: Evaluation, certificate: str, source: Evaluation, reference: Evaluation | None,
                gates: PromotionGates, audit: AuditResult | None = None,
                source_audit: AuditResult | None = None) -> GateOutcome:
    """The gates with the audit read both ways: one-sided for the strict verdict, as equivalence and
    per sample (against the source's own per-sample evidence) for the interim tier; forget samples
    whose label the references reject keep the population attack out."""
    return judge(candidate, certificate, source=source, reference=reference, gates=gates,
                 audit=audit.as_check() if audit else None,
                 source_audit=source_audit.as_check() if source_audit else None,
                 audit_equivalence=audit.equivalence_check() if audit else None,
                 atypical=audit.atypical if audit else 0,
                 per_sample=audit.per_sample_check(source_audit) if audit else None)
