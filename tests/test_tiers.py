"""The two tiers of forgetting without Prefect: the interim judgement beside the strict verdict
(certify.tiers.interim_judgement), which attempt serves under each policy (certify.tiers.serves),
the tiers of the certificates, and when the exact retrain must start (latest_safe_time)."""

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from fedunlearn.certify.gates import NO_OP_CHECK, PromotionGates, judge, judge_source
from fedunlearn.certify.tiers import (ForgettingPolicy, Tier, exact_due, latest_safe_time, owes_exact, repay_now,
                                      serves, tier_of)
from fedunlearn.evaluation.mia import result_from_scores
from fedunlearn.evaluation.records import Evaluation, Evidence
from fedunlearn.evaluation.uncertainty import Check, judge_within

RNG = np.random.default_rng(1)


def evaluation(test_hits: int, forget: np.ndarray, members: np.ndarray, nonmembers: np.ndarray) -> Evaluation:
    test = np.arange(1000) < test_hits
    attacks = {"loss": result_from_scores("loss", members, nonmembers)}
    return Evaluation(test_acc=float(test.mean()), retain_acc=float(test.mean()), forget_acc=float(forget.mean()),
                      mia_auc=attacks["loss"].auc, bd_asr=None,
                      evidence=Evidence({"test": test, "forget": forget}, attacks, None))


def audit(verdict: str, estimate: float, interval: tuple[float, float]) -> Check:
    return Check(name="forget_audit", estimate=estimate, interval=interval, limit=0.55, n=40, verdict=verdict,
                 alpha=0.05, rule="auc <= 0.5 + tolerance", method="delong-logit", confidence=0.95)


# Ten forgotten samples on a model that generalises: every membership check is inconclusive for the
# source model and for any candidate alike (nothing measurable to remove).
FEW_MEMBERS, FEW_NONMEMBERS = RNG.normal(0, 1, 10), RNG.normal(0, 1, 10)
GENERALISING_SOURCE = evaluation(950, np.arange(10) < 9, FEW_MEMBERS, FEW_NONMEMBERS)
INCONCLUSIVE_AUDIT = audit("inconclusive", 0.55, (0.35, 0.74))


def verdicts(outcome) -> dict[str, str]:
    return {c.name: c.verdict for c in outcome.checks}


def test_without_a_measurable_signal_an_approximate_version_serves_on_the_interim_tier_only():
    candidate = evaluation(951, np.arange(10) < 9, FEW_MEMBERS + 0.01, FEW_NONMEMBERS)
    outcome = judge(candidate, "empirical only", source=GENERALISING_SOURCE, reference=None, gates=PromotionGates(),
                    audit=INCONCLUSIVE_AUDIT, source_audit=INCONCLUSIVE_AUDIT)
    assert outcome.verdict == "inconclusive" and not outcome.passed  # the strict verdict is unchanged
    assert outcome.interim and outcome.held_back == []
    assert verdicts(outcome)["test_acc_drop_vs_source"] == "pass"
    assert any("forget_audit inconclusive; the source model does not fail it either" in note
               for note in outcome.unmeasured)
    assert serves(outcome.passed, outcome.interim, ForgettingPolicy.interim)
    assert not serves(outcome.passed, outcome.interim, ForgettingPolicy.strict)


def test_a_no_op_pass_is_reported_as_unmeasurable_not_as_forgetting():
    many_members, many_nonmembers = RNG.normal(0, 1, 500), RNG.normal(0, 1, 500)
    source = evaluation(950, np.arange(500) < 475, many_members, many_nonmembers)
    outcome = judge(source, "empirical only", source=source, reference=None, gates=PromotionGates())
    assert verdicts(outcome)[NO_OP_CHECK] == "inconclusive" and outcome.interim
    assert outcome.unmeasured == ["no measurable membership signal: the source model passes the same checks"]


def test_where_the_source_model_fails_a_check_an_inconclusive_candidate_is_held_back():
    # A model that memorised the forget set: its audit calls the source "not forgotten". A candidate that
    # only blurs the signal (inconclusive) has not shown it gone, so the interim tier refuses it.
    memorised = audit("fail", 0.93, (0.85, 0.97))
    blurred = audit("inconclusive", 0.62, (0.48, 0.75))
    candidate = evaluation(950, np.arange(10) < 9, FEW_MEMBERS, FEW_NONMEMBERS)
    outcome = judge(candidate, "empirical only", source=GENERALISING_SOURCE, reference=None, gates=PromotionGates(),
                    audit=blurred, source_audit=memorised)
    assert outcome.verdict == "inconclusive" and outcome.interim is False
    assert outcome.held_back == ["forget_audit inconclusive where the source model fails it (a measurable signal "
                                 "not shown gone)"]
    # The source itself (a no-op) fails outright.
    no_op = judge(GENERALISING_SOURCE, "empirical only", source=GENERALISING_SOURCE, reference=None,
                  gates=PromotionGates(), audit=memorised, source_audit=memorised)
    assert no_op.verdict == "fail" and no_op.interim is False and "forget_audit fails" in no_op.held_back
    assert judge_source(GENERALISING_SOURCE, reference=None, gates=PromotionGates(),
                        source_audit=memorised).verdict == "fail"


def test_a_failing_check_lost_utility_or_a_failed_certificate_hold_the_interim_tier_back():
    kept = evaluation(950, np.arange(10) < 9, FEW_MEMBERS, FEW_NONMEMBERS)
    assert not judge(kept, "not certified", source=GENERALISING_SOURCE, reference=None, gates=PromotionGates(),
                     audit=INCONCLUSIVE_AUDIT, source_audit=INCONCLUSIVE_AUDIT).interim
    broken = evaluation(800, np.arange(10) < 9, FEW_MEMBERS, FEW_NONMEMBERS)  # 15 points of test accuracy lost
    outcome = judge(broken, "empirical only", source=GENERALISING_SOURCE, reference=None, gates=PromotionGates(),
                    audit=INCONCLUSIVE_AUDIT, source_audit=INCONCLUSIVE_AUDIT)
    assert outcome.verdict == "fail" and not outcome.interim and "test_acc_drop_vs_source fails" in outcome.held_back
    beyond = evaluation(925, np.arange(10) < 9, FEW_MEMBERS, FEW_NONMEMBERS)  # 2.5 points lost: past the limit
    outcome = judge(beyond, "empirical only", source=GENERALISING_SOURCE, reference=None,
                    gates=PromotionGates(), audit=INCONCLUSIVE_AUDIT, source_audit=INCONCLUSIVE_AUDIT)
    assert verdicts(outcome)["test_acc_drop_vs_source"] == "inconclusive" and not outcome.interim
    assert outcome.held_back == ["utility not shown: test_acc_drop_vs_source inconclusive, its estimate beyond the "
                                 "limit 0.02"]


def test_an_inconclusive_utility_check_whose_estimate_is_within_the_limit_does_not_hold_back():
    # A retrain's own seed moves test accuracy by a point or so: not shown within 2 points, but not beyond.
    within = evaluation(935, np.arange(10) < 9, FEW_MEMBERS, FEW_NONMEMBERS)  # 1.5 points lost
    outcome = judge(within, "empirical only", source=GENERALISING_SOURCE, reference=None,
                    gates=PromotionGates(), audit=INCONCLUSIVE_AUDIT, source_audit=INCONCLUSIVE_AUDIT)
    assert verdicts(outcome)["test_acc_drop_vs_source"] == "inconclusive" and outcome.interim


def equivalence(estimate: float, interval: tuple[float, float], margin: float = 0.2) -> Check:
    return judge_within("forget_audit_equivalence", estimate, lambda level: interval, margin, n=324,
                        method="stratified-delong-logit")


MEMORISED = audit("fail", 0.93, (0.85, 0.97))


@pytest.mark.parametrize("strict, equivalent, serves_interim, reason", [
    # a retrain-like forget set the one-sided rule cannot call forgotten: equivalent within the margin
    (audit("inconclusive", 0.52, (0.44, 0.60)), equivalence(0.52, (0.44, 0.60)), True, None),
    # remembered: wholly above the margin
    (MEMORISED, equivalence(0.93, (0.85, 0.97)), False, "forget_audit fails: AUC 0.930 shown above 0.5 ± 0.200"),
    # over-forgotten: the forget set stands out *below* never-seen samples; the one-sided rule calls it forgotten
    (audit("pass", 0.12, (0.07, 0.2)), equivalence(0.12, (0.07, 0.2)), False,
     "forget_audit fails: AUC 0.120 shown below 0.5 ± 0.200"),
    # straddling the margin where the source fails the audit: not shown gone
    (audit("fail", 0.7, (0.62, 0.77)), equivalence(0.7, (0.62, 0.77)), False,
     "forget_audit inconclusive where the source model fails it"),
])
def test_on_the_interim_tier_the_audit_is_read_two_sided_within_a_margin(strict, equivalent, serves_interim, reason):
    candidate = evaluation(950, np.zeros(10, bool), FEW_MEMBERS, FEW_NONMEMBERS)
    outcome = judge(candidate, "empirical only", source=GENERALISING_SOURCE, reference=None, gates=PromotionGates(),
                    audit=strict, source_audit=MEMORISED, audit_equivalence=equivalent)
    assert outcome.interim is serves_interim
    assert verdicts(outcome)["forget_audit"] == strict.verdict  # the strict tier keeps its own rule
    assert outcome.audit_equivalence.verdict == equivalent.verdict
    if reason is not None:
        assert any(line.startswith(reason) for line in outcome.held_back), outcome.held_back


def test_atypical_forget_samples_keep_the_population_attack_out_of_the_verdict():
    # Members whose labels the audit's references reject (mislabelled rows, found by the audit, never
    # declared) against typical non-members: a population AUC far below chance says nothing about
    # membership. The check is left out and the reason said.
    low_members, nonmembers = RNG.normal(-3, 1, 40), RNG.normal(0, 1, 300)
    candidate = evaluation(950, np.zeros(40, bool), low_members, nonmembers)
    plain = judge(candidate, "empirical only", source=candidate, reference=None, gates=PromotionGates())
    assert "mia_auc_minus_chance" in verdicts(plain)
    outcome = judge(candidate, "empirical only", source=candidate, reference=None, gates=PromotionGates(),
                    atypical=40)
    assert "mia_auc_minus_chance" not in verdicts(outcome)
    assert any(line.startswith("mia_auc_minus_chance left out: 40 forget sample(s) carry a label models that never")
               for line in outcome.unmeasured)


@pytest.mark.parametrize("certificate, tier, owed", [
    ("exact retrain", Tier.exact, False), ("formal (ε,δ)", Tier.formal, False),
    ("empirical only", Tier.interim, True), ("constraint satisfied", Tier.interim, True),
    ("bounded approximation", Tier.interim, True)])
def test_only_exact_and_formal_versions_owe_nothing(certificate, tier, owed):
    assert tier_of(certificate) is tier and owes_exact(certificate) is owed


def test_the_exact_retrain_starts_by_the_earliest_deadline_less_its_measured_duration_and_a_margin():
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    due = exact_due([t0 + timedelta(days=3), t0 + timedelta(days=2), t0 + timedelta(days=30)])
    assert due == t0 + timedelta(days=2) and exact_due([]) is None
    start = latest_safe_time(due, retrain_seconds=600, safety_factor=2.0, margin=timedelta(hours=6))
    assert start == t0 + timedelta(days=2) - timedelta(minutes=20) - timedelta(hours=6)
    assert not repay_now(start, start - timedelta(seconds=1)) and repay_now(start, start)
    assert not repay_now(None, start)
    with pytest.raises(ValueError, match="safety_factor >= 1"):
        latest_safe_time(due, retrain_seconds=600, safety_factor=0.5, margin=timedelta(0))


def test_a_deadline_too_early_for_the_retrain_gives_a_start_time_already_passed_not_an_overflow():
    """A year-1 deadline (requests accepted it before they were refused) must not stop the batch's
    receipt on every re-run: its exact retrain is simply due at once."""
    due = datetime(1, 1, 1, tzinfo=timezone.utc)
    start = latest_safe_time(due, retrain_seconds=600, safety_factor=2.0, margin=timedelta(hours=6))
    assert start == datetime.min.replace(tzinfo=timezone.utc) and repay_now(start, datetime.now(timezone.utc))
