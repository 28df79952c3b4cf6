"""What judging one candidate costs, in FLOPs: its evaluation and its per-example audit, counted
as forward passes (a third of a training pass each, ``TRAINING_STEP_OVER_FORWARD``) over the rows
they score, so that a batch's total can stand beside its attempts' own costs.

Counted: the candidate's passes over the test, retained and forget sets (correctness), the forget
set and its non-members again (the population attacks), and in the audit the forget set and pool B
under the candidate plus the forget set under each reference (pool B's scores under the references
are kept in the audit set, so they are not paid again). Not counted: the shadow model's passes
(trained and scored once per data version) and the host's own bookkeeping."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedunlearn.evaluation.evaluator import EvaluationSets
from fedunlearn.federation.cost import TRAINING_STEP_OVER_FORWARD, Cost


@dataclass(frozen=True)
class JudgingCost:
    """FLOPs of one candidate's evaluation and of its audit."""

    evaluation: float
    audit: float

    @property
    def flops(self) -> float:
        return self.evaluation + self.audit


def judging_cost(training_flops_per_sample: float, sets: EvaluationSets, pool_rows: int | None,
                 references: int) -> JudgingCost:
    """The forward passes of one evaluation over ``sets`` and of one audit against a pool B of
    ``pool_rows`` rows and ``references`` reference models (``pool_rows=None``: no audit)."""
    forward = training_flops_per_sample / TRAINING_STEP_OVER_FORWARD
    forget = len(sets.forget)
    evaluated = len(sets.test) + len(sets.retained) + 2 * forget + len(sets.nonmembers)
    audited = 0 if pool_rows is None else forget + pool_rows + references * forget
    return JudgingCost(evaluation=float(forward * evaluated), audit=float(forward * audited))


def cost_split(cost: Cost, judging: JudgingCost | None) -> dict[str, float]:
    """An attempt's FLOPs by part: the method's own split (``Cost.parts``; the whole under "method"
    where it has none), then judging it ("evaluation", "audit"). Empty where either is not counted."""
    if judging is None or math.isnan(cost.flops):
        return {}
    return {**(dict(cost.parts) or {"method": cost.flops}), "evaluation": judging.evaluation, "audit": judging.audit}
