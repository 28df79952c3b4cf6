"""Membership inference: the attacks separate an overfit model's training samples from
label-matched unseen samples, and see nothing when both sides are unseen."""

import numpy as np
import pytest
import torch

from fedunlearn.evaluation.mia import (attack_metrics, label_matched_nonmembers, lira_scores, loss_attack,
                                       result_from_scores, run_population_attacks, ulira_audit, worst_case_auc)
from fedunlearn.federation.local import Tensors, sgd_epochs
from models import build_model

NUM_FEATURES, NUM_CLASSES = 20, 4
# Random features with random labels: nothing generalises, so whatever an attack detects on
# members is memorisation, and a model that never saw either side gives chance.
_rng = np.random.default_rng(0)
POOL = Tensors.from_arrays(_rng.normal(size=(2000, NUM_FEATURES)), _rng.integers(0, NUM_CLASSES, 2000),
                           np.array([f"s{i}" for i in range(2000)]), torch.device("cpu"))


def rows(start: int, stop: int) -> np.ndarray:
    return np.arange(start, stop)


def subset(indices: np.ndarray) -> Tensors:
    mask = np.zeros(len(POOL), dtype=bool)
    mask[indices] = True
    return POOL.select(mask)


def overfit_mlp(data: Tensors, seed: int, epochs: int = 100) -> torch.nn.Module:
    model = build_model("mlp", (NUM_FEATURES,), NUM_CLASSES, seed=seed)
    sgd_epochs(model, data, epochs=epochs, lr=0.1, batch_size=32, momentum=0.9,
               generator=torch.Generator().manual_seed(seed))
    return model


MEMBERS, NONMEMBER_POOL = rows(0, 100), rows(100, 1000)
SHADOW_IN, SHADOW_OUT = rows(1000, 1100), rows(1100, 1200)
UNSEEN = rows(1200, 1400)


@pytest.fixture(scope="module")
def target_and_shadow():
    target = overfit_mlp(subset(MEMBERS), seed=1)
    shadow = overfit_mlp(subset(SHADOW_IN), seed=2)
    return target, (shadow, subset(SHADOW_IN), subset(SHADOW_OUT))


def matched(member_rows: np.ndarray, seed: int) -> Tensors:
    labels = POOL.y.numpy()
    picked = label_matched_nonmembers(labels[member_rows], labels[NONMEMBER_POOL], seed)
    return subset(NONMEMBER_POOL[picked])


def test_population_attacks_detect_memorised_members(target_and_shadow):
    target, shadow = target_and_shadow
    results = run_population_attacks(target, subset(MEMBERS), matched(MEMBERS, 0), shadow)
    assert set(results) == {"confidence", "loss", "shadow"}
    for result in results.values():  # measured: AUC 0.95 for all three
        assert result.auc > 0.85, result.summary()
        assert result.accuracy > 0.8, result.summary()
        assert len(result.fpr) == len(result.tpr)
    assert worst_case_auc(results) == max(r.auc for r in results.values())


def test_population_attacks_see_chance_when_no_side_was_trained_on(target_and_shadow):
    target, shadow = target_and_shadow
    results = run_population_attacks(target, subset(UNSEEN), matched(UNSEEN, 1), shadow)
    for result in results.values():  # measured: AUC 0.50 for all three
        assert abs(result.auc - 0.5) < 0.12, result.summary()


def test_yeom_threshold_rule_sets_the_accuracy(target_and_shadow):
    target, _ = target_and_shadow
    members, nonmembers = subset(MEMBERS), matched(MEMBERS, 0)
    best = loss_attack(target, members, nonmembers)
    # A threshold no loss reaches flags nobody: balanced accuracy 0.5, whatever the scores.
    assert loss_attack(target, members, nonmembers, loss_threshold=0.0).accuracy == 0.5
    yeom = loss_attack(target, members, nonmembers, loss_threshold=0.1)
    assert yeom.auc == best.auc and 0.5 < yeom.accuracy <= best.accuracy


def test_label_matched_nonmembers_reproduce_the_histogram():
    members = np.array([0, 0, 0, 1, 2, 2, 2, 2, 2, 2])
    pool = np.array([0] * 50 + [1] * 30 + [2] * 4 + [3] * 20)  # label 2: 6 needed, only 4 available
    picked = label_matched_nonmembers(members, pool, seed=0)
    assert np.array_equal(pool[picked], members)
    assert len(np.unique(picked[members == 0])) == 3  # enough candidates: no repeats
    assert set(picked[members == 2]) == set(np.flatnonzero(pool == 2))  # all 4 used, then repeats
    assert np.array_equal(picked, label_matched_nonmembers(members, pool, seed=0))
    with pytest.raises(ValueError, match="no sample with label 3"):
        label_matched_nonmembers(np.array([3]), np.array([0, 1]), seed=0)


def test_result_from_scores_on_separable_scores():
    perfect = result_from_scores("toy", np.array([2.0, 3.0, 4.0]), np.array([0.0, 1.0]))
    assert (perfect.auc, perfect.accuracy, perfect.tpr_at_1fpr) == (1.0, 1.0, 1.0)
    inverted = result_from_scores("toy", np.array([0.0, 1.0]), np.array([2.0, 3.0]))
    assert inverted.auc == 0.0 and inverted.tpr_at_1fpr == 0.0
    with pytest.raises(ValueError):
        result_from_scores("toy", np.array([]), np.array([1.0]))


def test_attack_metrics_flatten_results_and_report_the_worst_case():
    results = {"a": result_from_scores("a", np.array([1.0, 2.0]), np.array([0.0, 3.0])),
               "b": result_from_scores("b", np.array([2.0]), np.array([1.0]))}
    metrics = attack_metrics(results)
    assert metrics["mia_a_auc"] == 0.5 and metrics["mia_b_auc"] == 1.0 and metrics["mia_auc"] == 1.0
    assert {"mia_a_accuracy", "mia_a_tpr_at_1fpr"} <= set(metrics)


def test_lira_scores_favour_the_side_the_target_resembles():
    shadow_phi = np.array([[5.0, 5.0], [5.2, 0.1], [0.0, 5.1], [0.2, 0.0]])
    included = np.array([[True, True], [True, False], [False, True], [False, False]])
    scores = lira_scores(np.array([5.1, 0.05]), shadow_phi, included)
    assert scores[0] > 0 > scores[1]
    with pytest.raises(ValueError, match="at least one 'in'"):
        lira_scores(np.array([1.0, 1.0]), shadow_phi, np.ones_like(included))


def test_ulira_audit_separates_trained_from_unseen_and_not_retrained():
    base, candidate_rows = rows(1400, 1500), rows(1500, 1540)
    candidates = subset(candidate_rows)

    def trained_on_included(include_mask, seed):  # no unlearning at all: the audit must see it
        return overfit_mlp(subset(np.concatenate([base, candidate_rows[include_mask]])), seed, epochs=60)

    def retrained_without_candidates(include_mask, seed):  # exact unlearning
        return overfit_mlp(subset(base), seed, epochs=60)

    leaky = ulira_audit(trained_on_included, candidates, num_pairs=3)
    exact = ulira_audit(retrained_without_candidates, candidates, num_pairs=3)
    assert leaky.auc > 0.9 and leaky.tpr_at_1fpr > 0.3, leaky.summary()  # measured: 0.99, 0.82
    assert abs(exact.auc - 0.5) < 0.12, exact.summary()  # measured: 0.53
    with pytest.raises(ValueError, match="num_pairs >= 2"):
        ulira_audit(trained_on_included, candidates, num_pairs=1)
