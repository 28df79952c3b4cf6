"""The gates judge each metric with its uncertainty (certify.gates): pass, fail or inconclusive —
a handful of forgotten samples is inconclusive, never a fail on noise; clear evidence passes or
fails either way. Both policies (against a retrained reference; against the source and chance),
class requests, the backdoor, the certificate, and a metric nobody measured."""

import dataclasses

import numpy as np
import pytest

from fedunlearn.certify.gates import WITH_REFERENCE, WITHOUT_REFERENCE, PromotionGates, judge
from fedunlearn.evaluation.mia import result_from_scores
from fedunlearn.evaluation.records import Evaluation, Evidence


def evaluation(test: np.ndarray, forget: np.ndarray, members: np.ndarray | None = None,
               nonmembers: np.ndarray | None = None, backdoor: np.ndarray | None = None,
               **splits: np.ndarray) -> Evaluation:
    attacks = {}
    if members is not None:
        attacks["loss"] = result_from_scores("loss", members, nonmembers)
    return Evaluation(test_acc=float(test.mean()), retain_acc=float(test.mean()), forget_acc=float(forget.mean()),
                      mia_auc=attacks["loss"].auc if attacks else float("nan"),
                      bd_asr=float(backdoor.mean()) if backdoor is not None else None,
                      evidence=Evidence({"test": test, "forget": forget, **splits}, attacks, backdoor))


def hits(n: int, k: int) -> np.ndarray:
    return np.arange(n) < k


RNG = np.random.default_rng(0)
SOURCE = evaluation(hits(1000, 950), hits(400, 400))


def verdicts(outcome) -> dict[str, str]:
    return {c.name: c.verdict for c in outcome.checks}


def test_eight_forgotten_samples_are_inconclusive_not_a_failure():
    # The UI batch of the issue: an attack AUC of 0.69 over 8 samples is noise at that size.
    members, nonmembers = np.array([3, 5, 6, 7, 8, 9, 10, 11.0]), np.array([1, 2, 4, 5.5, 6.5, 8.5, 9.5, 2.5])
    candidate = evaluation(hits(1000, 945), hits(8, 7), members, nonmembers)
    outcome = judge(candidate, "empirical only", source=SOURCE, reference=None, gates=PromotionGates())
    assert outcome.policy == WITHOUT_REFERENCE and 0.65 < candidate.mia_auc < 0.75
    assert verdicts(outcome)["mia_auc_minus_chance"] == "inconclusive" and outcome.verdict == "inconclusive"
    assert not outcome.passed


def test_clear_evidence_passes_and_clear_evidence_fails():
    unseen_members, unseen_nonmembers = RNG.normal(0, 1, 2000), RNG.normal(0, 1, 2000)
    forgot = evaluation(hits(1000, 948), hits(2000, 1890), unseen_members, unseen_nonmembers)
    passed = judge(forgot, "empirical only", source=SOURCE, reference=None, gates=PromotionGates())
    assert passed.verdict == "pass" and passed.passed, verdicts(passed)
    kept = evaluation(hits(1000, 850), hits(2000, 2000), RNG.normal(1, 1, 2000), RNG.normal(0, 1, 2000))
    failed = judge(kept, "empirical only", source=SOURCE, reference=None, gates=PromotionGates())
    assert failed.verdict == "fail" and verdicts(failed)["forget_acc_minus_test_acc"] == "fail"
    assert verdicts(failed)["mia_auc_minus_chance"] == "fail"


def test_against_a_reference_the_gaps_are_paired_and_judged_both_ways():
    members, nonmembers = RNG.normal(0, 1, 500), RNG.normal(0, 1, 500)
    reference = evaluation(hits(1000, 940), hits(500, 400), members, nonmembers)
    same = evaluation(hits(1000, 940), hits(500, 400), members + RNG.normal(0, 0.01, 500), nonmembers)
    close = judge(same, "bounded approximation", source=SOURCE, reference=reference, gates=PromotionGates())
    assert close.policy == WITH_REFERENCE and close.verdict == "pass", verdicts(close)
    assert [c.name for c in close.checks] == ["certificate", "abs_gap_test_acc", "abs_gap_forget_acc",
                                              "abs_gap_mia_auc"]
    worse = evaluation(hits(1000, 800), hits(500, 500), members + 2, nonmembers)
    far = judge(worse, "bounded approximation", source=SOURCE, reference=reference, gates=PromotionGates())
    assert {k: v for k, v in verdicts(far).items() if k != "certificate"} == {
        "abs_gap_test_acc": "fail", "abs_gap_forget_acc": "fail", "abs_gap_mia_auc": "fail"}


def test_a_class_request_is_judged_on_the_remaining_and_the_removed_classes():
    remaining = hits(900, 880)
    removed = evaluation(hits(1000, 880), hits(300, 0), remaining_classes_test=remaining,
                         forgotten_classes_test=hits(100, 0))
    source = evaluation(hits(1000, 975), hits(300, 300), remaining_classes_test=hits(900, 880),
                        forgotten_classes_test=hits(100, 95))
    outcome = judge(removed, "constraint satisfied", source=source, reference=None,
                    gates=PromotionGates(max_mia_auc_excess=None))
    assert outcome.passed, verdicts(outcome)
    assert list(verdicts(outcome)) == ["certificate", "remaining_classes_test_acc_drop_vs_source",
                                       "forgotten_classes_test_acc", "forget_acc"]
    still_there = evaluation(hits(1000, 960), hits(300, 290), remaining_classes_test=remaining,
                             forgotten_classes_test=hits(100, 80))
    assert judge(still_there, "constraint satisfied", source=source, reference=None,
                 gates=PromotionGates(max_mia_auc_excess=None)).verdict == "fail"


def test_a_class_request_whose_forgotten_classes_are_predicted_above_chance_is_refused():
    """Chance is 1/C = 0.1: 13 % on 3000 forget samples is shown above it, though within the 0.15
    limit on forgetting — refused in both policies and on the interim tier, whatever L_u says."""
    def class_removal(forget: np.ndarray, forgotten_test: np.ndarray, num_classes: int | None = 10) -> Evaluation:
        removal = evaluation(hits(1000, 880), forget, remaining_classes_test=hits(900, 880),
                             forgotten_classes_test=forgotten_test)
        return dataclasses.replace(removal, evidence=dataclasses.replace(removal.evidence, num_classes=num_classes))

    source = class_removal(hits(3000, 3000), hits(100, 95))
    gates = PromotionGates(max_mia_auc_excess=None)
    above = class_removal(hits(3000, 390), hits(1000, 125))
    unknown_chance = judge(class_removal(hits(3000, 390), hits(1000, 125), None), "constraint satisfied",
                           source=source, reference=None, gates=gates)
    assert unknown_chance.passed  # the 0.15 limits alone let it through
    refused = judge(above, "constraint satisfied", source=source, reference=None, gates=gates)
    assert verdicts(refused)["forget_acc"] == verdicts(refused)["forgotten_classes_test_acc"] == "pass"
    assert verdicts(refused)["forget_acc_above_chance"] == "fail"
    assert verdicts(refused)["forgotten_classes_test_acc_above_chance"] == "fail"
    assert refused.verdict == "fail" and not refused.interim
    assert "forget_acc_above_chance fails" in refused.held_back
    retrained = class_removal(hits(3000, 0), hits(1000, 0))
    against_retrain = judge(above, "constraint satisfied", source=source, reference=retrained,
                            gates=PromotionGates(max_forget_acc_gap=0.2))
    assert against_retrain.policy == WITH_REFERENCE and verdicts(against_retrain)["forget_acc_above_chance"] == "fail"
    # At chance (not shown above it) and below it, the check passes and the version serves.
    for forget, forgotten_test in ((hits(3000, 300), hits(1000, 100)), (hits(3000, 0), hits(1000, 0))):
        served = judge(class_removal(forget, forgotten_test), "constraint satisfied", source=source, reference=None,
                       gates=gates)
        assert verdicts(served)["forget_acc_above_chance"] == "pass" and served.passed and served.interim
    # A certificate that proves the forgetting does not outweigh the evidence.
    assert judge(above, "formal (ε,δ)", source=source, reference=None, gates=gates).verdict == "fail"


def test_the_backdoor_the_certificate_and_an_unmeasured_metric():
    members, nonmembers = RNG.normal(0, 1, 400), RNG.normal(0, 1, 400)
    backdoored = evaluation(hits(1000, 948), hits(400, 376), members, nonmembers, backdoor=hits(900, 700))
    outcome = judge(backdoored, "empirical only", source=SOURCE, reference=None, gates=PromotionGates())
    assert verdicts(outcome)["bd_asr"] == "fail" and not outcome.passed
    clean = evaluation(hits(1000, 948), hits(400, 376), members, nonmembers, backdoor=hits(900, 3))
    assert verdicts(judge(clean, "empirical only", source=SOURCE, reference=None,
                          gates=PromotionGates()))["bd_asr"] == "pass"
    uncertified = judge(clean, "not certified", source=SOURCE, reference=None, gates=PromotionGates())
    assert verdicts(uncertified)["certificate"] == "fail" and uncertified.verdict == "fail"
    unmeasured = evaluation(hits(1000, 948), hits(1, 1))
    unmeasured.evidence.correct["forget"] = np.zeros(0, dtype=bool)
    outcome = judge(unmeasured, "empirical only", source=SOURCE, reference=None, gates=PromotionGates())
    assert verdicts(outcome)["forget_acc_minus_test_acc"] == "inconclusive" and not outcome.passed
    off = PromotionGates(max_forget_acc_excess=None, max_mia_auc_excess=None, max_test_acc_drop=None)
    # Every check switched off: the source itself would pass, so nothing is shown.
    nothing_checked = judge(unmeasured, "empirical only", source=SOURCE, reference=None, gates=off)
    assert nothing_checked.verdict == "inconclusive" and verdicts(nothing_checked)["power_vs_no_op"] == "inconclusive"


def test_gates_reject_a_negative_tolerance():
    with pytest.raises(ValueError):
        PromotionGates(max_forget_acc_gap=-0.1)


def test_a_formal_certificate_is_not_held_back_by_inconclusive_evidence_but_is_by_a_failure():
    few = evaluation(hits(1000, 945), hits(8, 7), np.array([3, 5, 6, 7, 8, 9, 10, 11.0]),
                     np.array([1, 2, 4, 5.5, 6.5, 8.5, 9.5, 2.5]))
    approximate = judge(few, "empirical only", source=SOURCE, reference=None, gates=PromotionGates())
    proven = judge(few, "formal (ε,δ)", source=SOURCE, reference=None, gates=PromotionGates())
    assert approximate.verdict == "inconclusive" and proven.verdict == "pass" and "proven" in proven.policy
    broken = evaluation(hits(1000, 800), hits(8, 7))
    assert judge(broken, "formal (ε,δ)", source=SOURCE, reference=None, gates=PromotionGates()).verdict == "fail"


def test_without_reference_a_pass_the_source_itself_would_get_shows_nothing():
    """A model that generalises to its forget set passes the no-reference checks without any
    unlearning; then the candidate's pass is no evidence of forgetting: inconclusive."""
    unseen_members, unseen_nonmembers = RNG.normal(0, 1, 2000), RNG.normal(0, 1, 2000)
    generalising_source = evaluation(hits(1000, 950), hits(2000, 1900), RNG.normal(0, 1, 2000),
                                     RNG.normal(0, 1, 2000))
    candidate = evaluation(hits(1000, 948), hits(2000, 1890), unseen_members, unseen_nonmembers)
    outcome = judge(candidate, "empirical only", source=generalising_source, reference=None, gates=PromotionGates())
    assert outcome.verdict == "inconclusive" and verdicts(outcome)["power_vs_no_op"] == "inconclusive"
    assert all(v == "pass" for name, v in verdicts(outcome).items() if name != "power_vs_no_op")
    # A source that kept the forget set (it fails the same checks): the candidate's pass stands.
    memorising_source = evaluation(hits(1000, 950), hits(2000, 2000), RNG.normal(1, 1, 2000), RNG.normal(0, 1, 2000))
    outcome = judge(candidate, "empirical only", source=memorising_source, reference=None, gates=PromotionGates())
    assert outcome.passed and "power_vs_no_op" not in verdicts(outcome)
