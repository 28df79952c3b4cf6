"""Prefect tasks of evaluation, shared by the benchmark and the deletion pipeline: the evaluator of
a batch (``fedunlearn.evaluation.evaluator``), evaluating a model, and judging it at the gates."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from fedunlearn.certify.gates import GateOutcome, PromotionGates, judge
from fedunlearn.evaluation.evaluator import EvaluationSets, Evaluator
from fedunlearn.evaluation.records import Evaluation
from fedunlearn.evaluation.uncertainty import Check
from fedunlearn.federation.protocol import Federation
from fedunlearn.unlearning.base import DeletionBatch
from tasks.timing import core_compute


@task(name="build-evaluator", cache_policy=NO_CACHE)
@core_compute
def build_evaluator(federation: Federation, batch: DeletionBatch, backdoor: bool = False,
                    sets: EvaluationSets | None = None) -> Evaluator:
    return Evaluator(federation, batch, backdoor=backdoor, sets=sets)


@task(name="evaluate", cache_policy=NO_CACHE, task_run_name="evaluate-{name}")
@core_compute
def evaluate(evaluator: Evaluator, name: str, model: nn.Module, reference: nn.Module | None = None) -> Evaluation:
    return evaluator.evaluate(model, reference)


@task(name="apply-gates", cache_policy=NO_CACHE, task_run_name="gates-{name}")
def apply_gates(name: str, candidate: Evaluation, certificate: str, source: Evaluation, reference: Evaluation | None,
                gates: PromotionGates, audit: Check | None = None) -> GateOutcome:
    return judge(candidate, certificate, source=source, reference=reference, gates=gates, audit=audit)
