"""Gates with their uncertainty: the intervals agree with reference implementations, a check at
its limit fails with probability ≤ α (simulated), and few samples give `inconclusive`, not `fail`."""

import json

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from fedunlearn.evaluation.uncertainty import (FAIL, INCONCLUSIVE, PASS, Check, auc, auc_difference_interval,
                                               auc_interval, check_auc, check_auc_gap,
                                               check_paired_proportion_gap, check_proportion,
                                               check_proportion_gap, check_stratified_auc, judge_at_most,
                                               paired_proportion_difference_interval,
                                               proportion_difference_interval, proportion_interval, stratified_auc,
                                               stratified_auc_interval, stratified_counts, STRATIFIED_AUC_METHOD,
                                               equivalence_margin, judge_within, stratified_null_sd)

ALPHA = 0.05
DRAWS = 2000
# Binomial standard error of a rejection rate near 0.05 over 2,000 draws is 0.005: allow 2 of them.
MARGIN = 0.01


def shifted_normal_scores(rng, members: int, nonmembers: int, true_auc: float):
    """Scores whose population AUC is ``true_auc``: N(d, 1) vs N(0, 1) with d = √2 Φ⁻¹(AUC)."""
    shift = np.sqrt(2.0) * stats.norm.ppf(true_auc)
    return rng.normal(shift, 1.0, members), rng.normal(0.0, 1.0, nonmembers)


# --- intervals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("successes,n", [(0, 10), (3, 10), (10, 10), (47, 1000)])
def test_proportion_intervals_match_scipy(successes, n):
    result = stats.binomtest(successes, n)
    for method, scipy_method in (("clopper-pearson", "exact"), ("wilson", "wilson")):
        expected = result.proportion_ci(confidence_level=0.9, method=scipy_method)
        assert proportion_interval(successes, n, confidence=0.9, method=method) == pytest.approx(
            (expected.low, expected.high), abs=1e-9)


def test_independent_difference_is_newcombes_hybrid_score_interval():
    # Newcombe (1998a), example (a): 56/70 vs 48/80 → 0.0524 to 0.3339; Fagerland, Lydersen & Laake
    # (2017, "Statistical Analysis of Contingency Tables"), Perondi et al.'s trial: 7/34 vs 1/34.
    assert proportion_difference_interval(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert proportion_difference_interval(7, 34, 1, 34) == pytest.approx((0.0189, 0.3404), abs=1e-4)


def paired_outcomes(both: int, only_a: int, only_b: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    counts = [both, only_a, only_b, neither]
    return np.repeat([True, True, False, False], counts), np.repeat([True, False, True, False], counts)


def test_paired_difference_is_newcombes_method_10_and_shorter_than_independent():
    # Fagerland, Lydersen & Laake (2017), Cavo et al.'s paired table [[59, 6], [16, 80]]:
    # Newcombe's square-and-add interval −0.1186 to −0.0046.
    assert paired_proportion_difference_interval(*paired_outcomes(59, 6, 16, 80)) == pytest.approx(
        (-0.1186, -0.0046), abs=1e-4)
    correct_a, correct_b = paired_outcomes(942, 8, 3, 47)  # two models that agree on 989 of 1000 samples
    paired = paired_proportion_difference_interval(correct_a, correct_b)
    independent = proportion_difference_interval(int(correct_a.sum()), 1000, int(correct_b.sum()), 1000)
    assert paired[0] < correct_a.mean() - correct_b.mean() < paired[1]
    assert paired[1] - paired[0] < 0.5 * (independent[1] - independent[0])
    # Outcomes without association give back the independent interval (φ = 0).
    assert paired_proportion_difference_interval(*paired_outcomes(25, 25, 25, 25)) == pytest.approx(
        proportion_difference_interval(50, 100, 50, 100), abs=1e-12)


def test_auc_handles_ties_like_sklearn_and_its_interval_stays_in_the_unit_interval():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.integers(0, 5, 30).astype(float), rng.integers(0, 4, 40).astype(float)
    labels = np.r_[np.ones(30), np.zeros(40)]
    assert auc(members, nonmembers) == pytest.approx(roc_auc_score(labels, np.r_[members, nonmembers]))
    low, high = auc_interval(members, nonmembers)
    assert 0.0 < low < auc(members, nonmembers) < high < 1.0
    # Perfect separation of 3 vs 3 happens by chance 1 time in 20: the interval must not collapse on 1.
    low, high = auc_interval(np.array([4.0, 5.0, 6.0]), np.array([1.0, 2.0, 3.0]))
    assert low < 0.8 and high <= 1.0


def test_paired_auc_difference_of_a_model_with_itself_is_exactly_zero():
    rng = np.random.default_rng(1)
    members, nonmembers = shifted_normal_scores(rng, 20, 20, 0.7)
    assert auc_difference_interval(members, nonmembers, members, nonmembers, paired=True) == (0.0, 0.0)
    low, high = auc_difference_interval(members, nonmembers, members, nonmembers, paired=False)
    assert low < 0.0 < high


# --- verdicts: error rates at the limit (simulated) ---------------------------------------------

@pytest.mark.parametrize("members,nonmembers", [(8, 8), (8, 100), (60, 60)])
def test_an_auc_exactly_at_the_limit_is_failed_at_most_alpha_of_the_time(members, nonmembers):
    rng = np.random.default_rng(members * 1000 + nonmembers)
    limit = 0.55
    verdicts = [check_auc("mia", *shifted_normal_scores(rng, members, nonmembers, limit), limit).verdict
                for _ in range(DRAWS)]
    assert verdicts.count(FAIL) / DRAWS <= ALPHA + MARGIN
    # ... and it is not waved through either: passing a value at the limit is the other error.
    assert verdicts.count(PASS) / DRAWS <= ALPHA + MARGIN


def test_a_proportion_at_the_limit_is_failed_at_most_alpha_of_the_time():
    rng = np.random.default_rng(2)
    successes = rng.binomial(50, 0.1, DRAWS)
    fails = sum(check_proportion("bd_asr", int(k), 50, 0.1).verdict == FAIL for k in successes)
    assert fails / DRAWS <= ALPHA  # Clopper–Pearson: exact, no simulation margin needed in expectation


def test_a_paired_accuracy_gap_at_the_tolerance_is_failed_at_most_alpha_of_the_time():
    rng = np.random.default_rng(3)
    n, tolerance, disagreement = 500, 0.02, 0.04
    a_only, b_only = (disagreement + tolerance) / 2, (disagreement - tolerance) / 2  # a − b = tolerance
    fails = 0
    for _ in range(DRAWS):
        both, only_a, only_b, neither = rng.multinomial(n, [0.9 - b_only, a_only, b_only, 0.1 - a_only])
        check = check_paired_proportion_gap("test_acc", *paired_outcomes(both, only_a, only_b, neither), tolerance)
        fails += check.verdict == FAIL
    assert fails / DRAWS <= ALPHA + MARGIN


def test_an_auc_gap_at_the_tolerance_is_failed_at_most_alpha_of_the_time():
    rng = np.random.default_rng(4)
    tolerance, fails = 0.05, 0
    shift_a, shift_b = np.sqrt(2) * stats.norm.ppf(0.55 + tolerance), np.sqrt(2) * stats.norm.ppf(0.55)
    for _ in range(DRAWS):
        # Two models scoring the same 40 + 40 samples, their scores correlated 0.8.
        members = rng.multivariate_normal([0, 0], [[1, 0.8], [0.8, 1]], 40)
        nonmembers = rng.multivariate_normal([0, 0], [[1, 0.8], [0.8, 1]], 40)
        check = check_auc_gap("mia_auc", members[:, 0] + shift_a, nonmembers[:, 0], members[:, 1] + shift_b,
                              nonmembers[:, 1], tolerance, paired=True)
        fails += check.verdict == FAIL
    assert fails / DRAWS <= ALPHA + MARGIN


# --- verdicts: what the gates see ----------------------------------------------------------------

def test_an_auc_of_069_over_8_samples_is_inconclusive_not_fail():
    nonmembers = np.arange(8.0)
    members = np.arange(8.0) + 1.5
    members[0] = 2.5  # 44 of the 64 member/non-member pairs ordered: AUC 0.6875
    check = check_auc("mia_auc", members, nonmembers, 0.55)
    assert check.estimate == pytest.approx(0.6875)
    assert check.verdict == INCONCLUSIVE, check
    assert check.interval[0] < 0.55 < check.interval[1]


def test_clearly_bad_and_clearly_good_large_samples_are_decided():
    rng = np.random.default_rng(5)
    bad = check_auc("mia_auc", *shifted_normal_scores(rng, 500, 500, 0.69), 0.55)
    good = check_auc("mia_auc", *shifted_normal_scores(rng, 2000, 2000, 0.5), 0.55)
    assert (bad.verdict, good.verdict) == (FAIL, PASS), (bad, good)
    assert check_proportion("bd_asr", 60, 100, 0.1).verdict == FAIL
    assert check_proportion("bd_asr", 1, 1000, 0.1).verdict == PASS
    assert check_proportion("bd_asr", 1, 5, 0.1).verdict == INCONCLUSIVE  # 20% of 5: could be anything


def test_gap_checks_pass_inside_fail_outside_and_pairing_buys_power():
    correct_a, correct_b = paired_outcomes(945, 5, 8, 42)  # accuracies 0.950 vs 0.953, agreeing on 987
    assert check_paired_proportion_gap("test_acc", correct_a, correct_b, 0.02).verdict == PASS
    # The same accuracies without the pairing cannot tell a 0.3-point gap from a 2-point one.
    assert check_proportion_gap("test_acc", 950, 1000, 953, 1000, 0.02).verdict == INCONCLUSIVE
    assert check_proportion_gap("test_acc", 950, 1000, 800, 1000, 0.02).verdict == FAIL
    rng = np.random.default_rng(6)
    members, nonmembers = shifted_normal_scores(rng, 300, 300, 0.9)
    same_samples = check_auc_gap("mia_auc", members, nonmembers, members * 0.99, nonmembers, 0.05, paired=True)
    assert same_samples.verdict == PASS and same_samples.method == "delong-paired"
    unrelated = check_auc_gap("mia_auc", members, nonmembers, *shifted_normal_scores(rng, 300, 300, 0.5), 0.05,
                              paired=False)
    assert unrelated.verdict == FAIL and unrelated.n == 1200


def test_check_records_serialise_to_json_and_back():
    check = check_auc("mia_auc", np.array([0.9, 0.8, 0.4]), np.array([0.1, 0.5, 0.3]), 0.55)
    record = json.loads(check.to_json())
    assert set(record) == {"name", "estimate", "interval", "limit", "n", "verdict", "alpha", "rule", "method",
                           "confidence"}
    assert record["confidence"] == pytest.approx(1 - 2 * ALPHA) and record["n"] == 6
    assert Check.from_dict(record) == check
    assert check.passed == (check.verdict == PASS)


def test_invalid_inputs_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        judge_at_most("x", 0.5, lambda level: (0.4, 0.6), 0.55, n=10, method="m", alpha=0.6)
    with pytest.raises(ValueError, match="confidence"):
        proportion_interval(3, 10, confidence=1.0)
    with pytest.raises(ValueError, match="n ≥ 1"):
        check_proportion("x", 0, 0, 0.1)
    with pytest.raises(ValueError, match="at least one member"):
        check_auc("x", np.array([]), np.array([0.1]), 0.55)
    with pytest.raises(ValueError, match="same non-zero length"):
        check_paired_proportion_gap("x", np.ones(3, bool), np.ones(4, bool), 0.02)
    with pytest.raises(ValueError, match="paired AUCs"):
        auc_difference_interval(np.ones(3), np.zeros(3), np.ones(4), np.zeros(3), paired=True)
    with pytest.raises(ValueError, match="unknown proportion interval"):
        proportion_interval(3, 10, method="wald")


# --- the label-stratified AUC -------------------------------------------------------------------

def labelled_scores(rng, member_labels: np.ndarray, nonmember_labels: np.ndarray, true_auc: float):
    """Scores with a strong label effect (+1.5 per label) and, within every label, population AUC
    ``true_auc`` of members over non-members."""
    members, nonmembers = shifted_normal_scores(rng, len(member_labels), len(nonmember_labels), true_auc)
    return members + 1.5 * member_labels, nonmembers + 1.5 * nonmember_labels


def test_stratified_auc_ignores_a_label_mix_that_alone_separates_the_populations():
    rng = np.random.default_rng(0)
    member_labels = rng.choice([3, 4], 200)            # a client holding two labels
    nonmember_labels = rng.integers(0, 5, 1000)        # the pool, every label
    members, nonmembers = labelled_scores(rng, member_labels, nonmember_labels, 0.5)
    assert auc(members, nonmembers) > 0.75             # the label mix alone separates them
    check = check_stratified_auc("audit", members, member_labels, nonmembers, nonmember_labels, 0.55)
    assert abs(check.estimate - 0.5) < 0.05 and check.verdict == PASS, check
    assert check.n == 200 + int(np.isin(nonmember_labels, [3, 4]).sum()) and check.method == "stratified-delong-logit"
    # With one stratum it is the plain AUC.
    one = np.zeros(len(members), dtype=int), np.zeros(len(nonmembers), dtype=int)
    assert stratified_auc(members, one[0], nonmembers, one[1]) == pytest.approx(auc(members, nonmembers))


def test_stratified_auc_weights_strata_by_their_members_and_leaves_out_strata_without_non_members():
    members, member_strata = np.array([1.0, 1.0, 1.0, 0.0, 9.0]), np.array([0, 0, 0, 1, 2])
    nonmembers, nonmember_strata = np.array([0.5, 0.5, 2.0]), np.array([0, 0, 1])
    # Stratum 0: AUC 1 (3 members), stratum 1: AUC 0 (1 member), stratum 2: no non-member, left out.
    assert stratified_auc(members, member_strata, nonmembers, nonmember_strata) == pytest.approx(0.75)
    assert stratified_counts(member_strata, nonmember_strata) == (4, 3)
    with pytest.raises(ValueError, match="at least one member and one non-member"):
        stratified_auc(members, np.full(5, 7), nonmembers, nonmember_strata)


@pytest.mark.parametrize("members", [12, 60])
def test_a_stratified_auc_at_the_limit_is_failed_at_most_alpha_of_the_time(members):
    """Members spread unevenly over 6 labels, 20 non-members per label, AUC 0.5 within each label."""
    rng = np.random.default_rng(members)
    nonmember_labels = np.repeat(np.arange(6), 20)
    draws, failed = 600, 0
    for _ in range(draws):
        member_labels = rng.choice(6, members, p=[0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
        scores = labelled_scores(rng, member_labels, nonmember_labels, 0.5)
        failed += check_stratified_auc("audit", scores[0], member_labels, scores[1], nonmember_labels,
                                       0.5).verdict == FAIL
    # Binomial standard error over 600 draws at 0.05: 0.009; allow 2.5 of them.
    assert failed / draws <= ALPHA + 0.022


def test_a_perfectly_separated_forget_set_gets_a_lower_bound_that_rises_with_the_estimate():
    """At the estimate, a Hanley–McNeil floor on the logit scale pushed the lower bound of an AUC
    near 1 down as the AUC rose; the score-type floor does not."""
    labels = np.repeat(np.arange(10), 2)
    nonmember_labels = np.repeat(np.arange(10), 30)
    nonmembers = np.tile(np.linspace(0.0, 1.0, 30), 10)
    lows = []
    for top in (0.9, 0.99, 2.0):     # the members' scores: a few below the top non-members, then none
        members = np.where(np.arange(20) % 7 == 0, top, 5.0)
        lows.append(stratified_auc_interval(members, labels, nonmembers, nonmember_labels, confidence=0.9)[0])
    assert lows == sorted(lows) and lows[-1] > 0.9, lows


def _stratified_draw(rng, shift: float, strata: int = 10, members: int = 4, nonmembers: int = 27):
    member_strata = np.repeat(np.arange(strata), members)
    nonmember_strata = np.repeat(np.arange(strata), nonmembers)
    return (rng.normal(shift, 1, member_strata.size), member_strata, rng.normal(0, 1, nonmember_strata.size),
            nonmember_strata)


def test_the_stratified_null_sd_is_the_spread_of_the_stratified_auc_of_exchangeable_samples():
    rng = np.random.default_rng(7)
    draws = [_stratified_draw(rng, 0.0) for _ in range(1200)]
    spread = np.std([stratified_auc(*draw) for draw in draws])
    predicted = stratified_null_sd(draws[0][1], draws[0][3])
    assert abs(spread - predicted) / predicted < 0.08   # the spread's own standard error: about 0.02
    with pytest.raises(ValueError, match="at least one member and one non-member"):
        stratified_null_sd(np.array([1]), np.array([2]))


def _within_rate(shift: float, draws: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    passed = 0
    for _ in range(draws):
        draw = _stratified_draw(rng, shift)
        margin = equivalence_margin(stratified_null_sd(draw[1], draw[3]), beta=0.01)
        check = judge_within("eq", stratified_auc(*draw), lambda level: stratified_auc_interval(*draw, confidence=level),
                             margin, n=draw[0].size + draw[2].size, method=STRATIFIED_AUC_METHOD)
        passed += check.verdict == PASS
    return passed / draws


def test_a_margin_sized_to_the_counts_passes_exchangeable_samples_and_stops_separated_ones_on_both_sides():
    # 40 members in 10 strata against 270 non-members: the audit's shape at 40 canaries.
    assert _within_rate(0.0, 300, 1) >= 0.96                   # true AUC 0.5: passes at about 1 − β
    assert _within_rate(1.8, 200, 2) <= 0.05                   # true AUC ≈ 0.9: remembered
    assert _within_rate(-1.8, 200, 3) <= 0.05                  # true AUC ≈ 0.1: over-forgotten


def _edge_passes(side: int, draws: int, seed: int, strata: int, members: int) -> int:
    """How many of ``draws`` forget sets whose true AUC is 0.5 + side · margin pass (side −1 or +1:
    the band's edge; 0: exchangeable with never-seen samples)."""
    member_strata, nonmember_strata = np.repeat(np.arange(strata), members), np.repeat(np.arange(strata), 27)
    margin = equivalence_margin(stratified_null_sd(member_strata, nonmember_strata))
    shift = np.sqrt(2) * stats.norm.ppf(0.5 + side * margin)
    rng, passed = np.random.default_rng(seed), 0
    for _ in range(draws):
        draw = _stratified_draw(rng, shift, strata, members)
        check = judge_within("eq", stratified_auc(*draw), lambda level: stratified_auc_interval(*draw, confidence=level),
                             margin, n=draw[0].size + draw[2].size, method=STRATIFIED_AUC_METHOD)
        passed += check.verdict == PASS
    return passed


@pytest.mark.parametrize("strata, members", [(10, 1), (10, 4)])
def test_on_the_margins_edge_either_side_passes_at_most_alpha_even_with_one_sample_a_stratum(strata, members):
    """Ten deleted samples of ten classes leave one member a stratum: each stratum's DeLong member
    component was zero there and the lower edge passed about three times α. The edge's pass rate
    must be compatible with α (its Clopper–Pearson 95 % lower bound at most α) on both sides."""
    draws = 160
    for side in (-1, +1):
        passed = _edge_passes(side, draws, 11 + side, strata, members)
        assert passed == 0 or stats.beta.ppf(0.025, passed, draws - passed + 1) <= ALPHA, (side, passed)
    assert _edge_passes(0, 60, 5, strata, members) >= 56      # exchangeable: passes at about 1 − β


def test_judge_within_fails_wholly_outside_passes_wholly_inside_else_inconclusive():
    def at(interval):
        return judge_within("eq", sum(interval) / 2, lambda level: interval, 0.2, n=10, method="m")
    assert at((0.75, 0.9)).verdict == FAIL and at((0.1, 0.25)).verdict == FAIL
    assert at((0.35, 0.68)).verdict == PASS
    assert at((0.55, 0.8)).verdict == INCONCLUSIVE and at((0.2, 0.4)).verdict == INCONCLUSIVE
    assert at((0.35, 0.68)).confidence == pytest.approx(0.9)
    with pytest.raises(ValueError, match="margin must be > 0"):
        judge_within("eq", 0.5, lambda level: (0.4, 0.6), 0.0, n=10, method="m")
    with pytest.raises(ValueError, match="beta must lie in"):
        equivalence_margin(0.05, beta=1.5)


def test_the_placements_rank_as_scipy_s_rankdata_does():
    """Average ranks from 1 (ties their mean; NaN throughout with a NaN score), exactly as
    ``stats.rankdata`` gives them."""
    from scipy import stats

    from fedunlearn.evaluation.uncertainty import _average_ranks
    rng = np.random.default_rng(8)
    for scores in (rng.normal(size=50), np.round(rng.normal(size=50), 1), np.full(7, 0.3), np.array([2.0]),
                   np.array([1.0, np.nan, 0.0]), np.array([np.inf, -np.inf, 0.0, np.inf])):
        assert np.array_equal(_average_ranks(scores), stats.rankdata(scores), equal_nan=True), scores
