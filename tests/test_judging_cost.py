"""Where a batch's FLOPs go (fedunlearn/evaluation/judging_cost.py, batch_receipts.batch_flops,
Cost.parts): judging a candidate counted as forward passes over the rows it scores; an attempt's
split keeps the method's own parts beside its evaluation and audit; a batch's total adds every
attempt and the source's judging, and says "not counted" (None) rather than a partial sum."""

import math

import numpy as np
import pytest
import torch

from fedunlearn.batch_receipts import batch_flops
from fedunlearn.evaluation.evaluator import EvaluationSets
from fedunlearn.evaluation.judging_cost import JudgingCost, cost_split, judging_cost
from fedunlearn.federation.cost import Cost
from fedunlearn.federation.local import Tensors
from fedunlearn.receipts import EscalationStep


def rows(n: int) -> Tensors:
    return Tensors(torch.zeros(n, 2), torch.zeros(n, dtype=torch.long), np.arange(n))


def test_judging_counts_a_forward_pass_a_scored_row():
    sets = EvaluationSets(test=rows(100), retained=rows(50), forget=rows(4), nonmembers=rows(4), shadow_in=rows(7),
                          shadow_out=rows(7))
    cost = judging_cost(30.0, sets, pool_rows=200, references=4)
    forward = 10.0  # a training pass is three forward passes
    assert cost.evaluation == forward * (100 + 50 + 2 * 4 + 4)
    assert cost.audit == forward * (4 + 200 + 4 * 4)
    assert cost.flops == cost.evaluation + cost.audit
    assert judging_cost(30.0, sets, pool_rows=None, references=0).audit == 0.0


def test_costs_add_up_part_by_part():
    total = Cost(1.0, 10.0, 1, {"teacher": 2.0, "retained": 8.0}) + Cost(0.5, 5.0, 2, {"recovery": 4.0, "teacher": 1.0})
    assert total.parts == {"teacher": 3.0, "retained": 8.0, "recovery": 4.0}
    assert (total.flops, total.wall_seconds, total.comm_bytes) == (15.0, 1.5, 3)
    assert (Cost() + Cost()).parts == {}


def test_an_attempts_split_keeps_the_methods_parts_beside_its_judging():
    judged = JudgingCost(evaluation=3.0, audit=7.0)
    assert cost_split(Cost(flops=10.0, parts={"teacher": 4.0, "retained": 6.0}), judged) == {
        "teacher": 4.0, "retained": 6.0, "evaluation": 3.0, "audit": 7.0}
    assert cost_split(Cost(flops=10.0), judged) == {"method": 10.0, "evaluation": 3.0, "audit": 7.0}
    assert cost_split(Cost(flops=math.nan), judged) == {} and cost_split(Cost(flops=1.0), None) == {}


def test_a_batch_total_counts_every_attempt_or_says_it_could_not():
    failed = EscalationStep(attempt=0, method="fedquit", cost_split={"method": 5.0, "evaluation": 1.0, "audit": 2.0})
    served = EscalationStep(attempt=1, method="puf-special", cost_split={"method": 3.0, "evaluation": 1.0, "audit": 2.0})
    retrain = EscalationStep(attempt=2, method="retrain")
    assert batch_flops([failed, served], None, source_judging=3.0) == pytest.approx(17.0)
    assert batch_flops([failed, retrain], 100.0, source_judging=3.0) == pytest.approx(111.0)
    assert batch_flops([failed, retrain], None, source_judging=3.0) is None      # the retrain's own FLOPs unknown
    assert batch_flops([EscalationStep(attempt=0, method="ga")], None, 3.0) is None  # an attempt not counted
    assert batch_flops([failed], None, source_judging=None) is None
