"""Per-sample forgetting evidence (fedunlearn.evaluation.per_sample): each forget sample's own score
judged against never-seen pairs of its difficulty, two-sided — error rates that hold at every request
size, one sample included, and power where a sample is memorised, with nobody saying which."""

from pathlib import Path

import numpy as np
import pytest

from fedunlearn.certify.gates import PER_SAMPLE_CHECK, GateCheck, GateOutcome, PromotionGates
from fedunlearn.certify.tiers import interim_judgement
from fedunlearn.evaluation.audit import AuditResult
from fedunlearn.evaluation.per_sample import (OVER_FORGOTTEN, REMEMBERED, UNMEASURED, WITHIN_RANGE, NeverSeen,
                                              holm, nearest, poisson_binomial_tail, sample_evidence)
from fedunlearn.evaluation.uncertainty import FAIL, INCONCLUSIVE, PASS

SIZES = (1, 2, 4, 8, 16, 40)
ALPHA = 0.05


def test_holm_rejects_what_the_step_down_rule_rejects():
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 9):
        for _ in range(50):
            p = rng.uniform(0, 0.05, m) ** rng.uniform(0.5, 2)
            order = np.sort(p)
            # Brute force: the largest k with p_(j) ≤ α/(m − j) for all j < k.
            k = next((j for j in range(m) if order[j] > ALPHA / (m - j)), m)
            expected = p <= order[k - 1] if k else np.zeros(m, bool)
            assert (holm(p, ALPHA) == expected).all(), (p, k)


def test_the_poisson_binomial_tail_is_the_binomial_one_for_equal_rates():
    from scipy import stats
    for n, rate, k in ((1, 0.01, 1), (4, 0.2, 2), (40, 0.01, 3), (10, 0.9, 10)):
        assert poisson_binomial_tail(np.full(n, rate), k) == pytest.approx(stats.binom.sf(k - 1, n, rate))
    assert poisson_binomial_tail(np.array([0.5, 0.1]), 0) == 1.0


def test_nearest_takes_the_pairs_closest_in_difficulty():
    pool = np.array([-10.0, -9.0, 0.0, 1.0, 5.0])
    assert sorted(nearest(np.array([-9.4]), pool, 2)[0].tolist()) == [0, 1]
    assert sorted(nearest(np.array([4.0]), pool, 2)[0].tolist()) == [3, 4]


def test_pool_bs_own_pairs_join_the_yardstick_where_dense_and_relabelled_ones_fill_in_where_not():
    """A typical sample meets pool B's own pairs of its difficulty (twice: as nearest pairs and as the
    dense own kind); a sample far harder than any of pool B's own (a mislabelled row) meets only the
    relabelled pairs that are as hard."""
    from fedunlearn.evaluation.per_sample import neighbourhoods
    own = np.linspace(0.0, 6.0, 300)
    relabelled = np.linspace(-12.0, -6.0, 900)
    never_seen = NeverSeen(np.zeros(1200), np.concatenate([own, relabelled]), np.ones(1200, bool),
                           np.arange(1200) >= 300)
    typical, wrong = neighbourhoods(np.array([3.0, -10.0]), never_seen)
    assert len(typical) == 2 and all((rows < 300).all() for rows in typical)
    assert len(wrong) == 1 and (wrong[0] >= 300).all() and len(wrong[0]) == 200


def _shift(difficulty):
    """A candidate's strength against the references', which depends on difficulty: more confident
    on labels the references believe, less on those they reject (what a retrain shows)."""
    return 0.3 * difficulty


def _pairs(rng, n, tails=5, low=-12.0, high=6.0):
    difficulty = rng.uniform(low, high, n)
    z = _shift(difficulty) + (rng.standard_t(tails, n) if tails else rng.normal(size=n))
    hits = rng.random(n) < 1.0 / (1.0 + np.exp(-difficulty))
    return z, difficulty, hits


def _never_seen(rng, size=2500, tails=5) -> NeverSeen:
    """Pool B's own pairs at every difficulty (dense enough to be the yardstick everywhere)."""
    return NeverSeen(*_pairs(rng, size, tails), np.zeros(size, bool))


@pytest.mark.parametrize("tails", [5, None])
def test_a_never_seen_sample_is_flagged_at_most_alpha_of_the_time_at_every_size(tails):
    """The null (an exact retrain): forget samples drawn like never-seen pairs, at any difficulty —
    over 200 seeded draws per size the family-wise false flag rate, either side, stays at or below
    α plus its sampling slack."""
    rng = np.random.default_rng(1)
    for n in SIZES:
        flagged = 0
        for _ in range(200):
            evidence = sample_evidence(*_pairs(rng, n, tails), _never_seen(rng, size=1500, tails=tails), ALPHA)
            flagged += bool(evidence.remembered.any() or evidence.over_forgotten.any())
        assert flagged / 200 <= ALPHA + 0.025, (n, flagged)


@pytest.mark.parametrize("n", SIZES)
def test_memorised_atypical_samples_are_remembered_at_every_size_and_a_no_op_cannot_hide_them(n):
    """Samples whose label models that never saw them reject (difficulty −10), scored far above
    never-seen pairs of that difficulty by a source that learnt them: remembered at every size, one
    sample included, though nothing said which they are; typical samples a model generalises to are
    not."""
    rng = np.random.default_rng(2)
    remembered = typical_flagged = 0
    for _ in range(100):
        never_seen = _never_seen(rng)
        difficulty = np.full(n, -10.0) + rng.normal(0, 0.5, n)
        evidence = sample_evidence(_shift(difficulty) + 8.0, difficulty, np.ones(n, bool), never_seen, ALPHA)
        remembered += bool(evidence.remembered.all())
        typical = _pairs(rng, n, low=2.0, high=6.0)
        typical_flagged += bool(sample_evidence(*typical, never_seen, ALPHA).remembered.any())
    assert remembered >= 95 and typical_flagged <= 8, (remembered, typical_flagged)


def _hard_pairs(rng, size=600, hit_rate=0.05):
    """Never-seen pairs whose label models that never saw them reject (difficulty about −10): the
    candidate predicts a few of them (``hit_rate``)."""
    difficulty = -10.0 + rng.normal(0, 0.5, size)
    hits = rng.random(size) < hit_rate
    z = _shift(difficulty) + rng.normal(size=size)
    return NeverSeen(z, difficulty, hits, np.ones(size, bool))


def test_a_predicted_label_outranks_a_score_a_sample_is_remembered_by_the_prediction_not_the_score_alone():
    """One hard sample (difficulty −10), its z at the 75th percentile of never-seen pairs: predicted
    with its label — which never-seen pairs of that difficulty rarely are — it is remembered (the
    no-op on a memorised row with a modest margin); not predicted (a candidate that never saw it,
    near-uniform on a row unlike any held-out one), it is not, however its score ranks among the
    pairs the candidate also misses."""
    rng = np.random.default_rng(8)
    never_seen = _hard_pairs(rng)
    missed_z = never_seen.z[~never_seen.hits]
    for z in (np.quantile(never_seen.z, 0.75), np.quantile(missed_z, 0.999)):
        predicted = sample_evidence(np.array([z]), np.array([-10.0]), np.array([True]), never_seen, ALPHA)
        unpredicted = sample_evidence(np.array([z]), np.array([-10.0]), np.array([False]), never_seen, ALPHA)
        assert predicted.remembered[0] and predicted.p_remembered[0] <= ALPHA / 2
        assert not unpredicted.remembered[0] and unpredicted.p_remembered[0] > ALPHA / 2


def test_a_score_that_is_high_only_for_easy_pairs_is_not_memory():
    """The same z that marks a sample remembered at difficulty −10 is ordinary at difficulty 5, where
    the candidate's strength lifts every never-seen pair: the yardstick is the sample's difficulty."""
    rng = np.random.default_rng(5)
    never_seen = _never_seen(rng)
    z = np.array([_shift(5.0) + 0.5, _shift(5.0) + 0.5])
    evidence = sample_evidence(z, np.array([-10.0, 5.0]), np.array([True, True]), never_seen, ALPHA)
    assert evidence.p_remembered[0] < 0.02 < 0.2 < evidence.p_remembered[1]


@pytest.mark.parametrize("n", SIZES)
def test_an_over_forgotten_sample_is_told_apart_at_every_size(n):
    """One forget sample pushed far under never-seen pairs (a sample whose label the candidate now
    refuses): flagged over-forgotten, not remembered, at every size."""
    rng = np.random.default_rng(3)
    found = 0
    for _ in range(100):
        never_seen = _never_seen(rng)
        z, difficulty, hits = _pairs(rng, n)
        z[0], hits[0] = -40.0, False
        evidence = sample_evidence(z, difficulty, hits, never_seen, ALPHA)
        found += bool(evidence.over_forgotten[0] and not evidence.remembered[0])
    assert found >= 95, found


def test_typical_samples_a_candidate_gets_wrong_in_numbers_are_over_forgotten():
    """Six of ten typical samples missed where never-seen pairs of their difficulty are missed about
    one time in a hundred: the count marks them, though no single score is extreme (what a quitting
    loss on ordinary deleted samples does)."""
    rng = np.random.default_rng(4)
    never_seen = _never_seen(rng)
    difficulty = np.full(10, 5.0)
    hits = np.array([False] * 6 + [True] * 4)
    evidence = sample_evidence(_shift(difficulty), difficulty, hits, never_seen, ALPHA)
    assert evidence.over_forgotten[:6].all() and not evidence.over_forgotten[6:].any()


def test_without_never_seen_pairs_every_sample_is_unmeasured():
    never_seen = NeverSeen(np.array([0.0, 0.1]), np.array([0.0, 1.0]), np.ones(2, bool), np.zeros(2, bool))
    evidence = sample_evidence(np.array([50.0, 0.0]), np.array([0.0, 0.0]), np.array([True, True]), never_seen,
                               ALPHA)
    assert evidence.labels() == [UNMEASURED, UNMEASURED]
    assert np.isnan(evidence.t[0]) and evidence.p_remembered[0] == 1.0


def _audit(readings: list[str], alpha: float | None = ALPHA) -> AuditResult:
    samples = [{"sample_id": f"s-{i}", "label": 0, "z": 0.0, "p_value": 0.5, "t": 0.0,
                "p_remembered": 0.001 if r == REMEMBERED else 0.5, "p_over": 0.5, "reading": r}
               for i, r in enumerate(readings)]
    return AuditResult("inconclusive", 0.5, (0.2, 0.8), 0.55, ALPHA, len(readings), 30, 4, True, samples, [], 0.0,
                       0.0, margin=0.5, per_sample_alpha=alpha)


def test_the_per_sample_check_fails_a_flagged_sample_passes_what_the_source_remembered_gone_else_is_inconclusive():
    source_remembers, source_does_not = _audit([REMEMBERED, WITHIN_RANGE]), _audit([WITHIN_RANGE] * 2)
    assert _audit([REMEMBERED, WITHIN_RANGE]).per_sample_check(source_remembers).verdict == FAIL  # the no-op
    assert _audit([WITHIN_RANGE, OVER_FORGOTTEN]).per_sample_check(source_does_not).verdict == FAIL
    assert _audit([WITHIN_RANGE] * 2).per_sample_check(source_remembers).verdict == PASS
    assert _audit([WITHIN_RANGE] * 2).per_sample_check(source_does_not).verdict == INCONCLUSIVE
    assert _audit([WITHIN_RANGE], alpha=None).per_sample_check(source_remembers) is None  # an earlier record
    assert _audit([REMEMBERED]).remembered() and not _audit([WITHIN_RANGE, OVER_FORGOTTEN]).remembered()


def test_a_high_auc_alone_is_not_remembered_as_docs_pipeline_says():
    """Issue 51: docs/pipeline.md's "remembered" is ``AuditResult.remembered``: no sample flagged and an
    interval reaching into the band is not remembered, however high the AUC; wholly above it is."""
    high = _audit([WITHIN_RANGE] * 10)
    high.auc, high.interval, high.margin = 0.949, (0.62, 0.99), 0.2
    assert not high.remembered()
    high.interval = (0.71, 0.99)
    assert high.remembered()
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "pipeline.md").read_text().split())
    assert "shows the forget set **remembered** — one sample or more shown remembered by the per-sample" in text
    assert "wholly above the interim band 0.5 + m (`AuditResult.remembered`; a high AUC alone is not enough" in text


def test_removal_targets_are_the_samples_remembered_each_at_alpha_over_two_or_all_without_evidence():
    audit = _audit([REMEMBERED, WITHIN_RANGE, OVER_FORGOTTEN])
    assert audit.removal_targets() == ["s-0"]
    assert _audit([WITHIN_RANGE, WITHIN_RANGE], alpha=None).removal_targets() == ["s-0", "s-1"]


def test_a_sample_predicted_with_a_label_never_seen_models_reject_is_a_removal_target_too():
    """Not shown remembered at α/2, yet the source predicts a label the references reject (a learnt
    wrong label): the removal method treats it as remembered; an ordinary predicted sample is not."""
    audit = _audit([WITHIN_RANGE, WITHIN_RANGE])
    audit.samples[1]["atypical_hit"] = True
    assert audit.removal_targets() == ["s-1"]


def test_a_removal_method_goes_first_where_half_the_forget_set_is_predicted_with_labels_references_reject():
    """The batch's order (``escalation.batch_order``) reads ``removal_wanted``: a sample shown remembered, or
    half the forget set predicted with a label the references reject though short of α/2 (a memorised
    row of a small request); not a forget set with fewer such rows (the hard rows of a client's data)."""
    def suspected(readings: list[str], rows: int) -> AuditResult:
        audit = _audit(readings)
        for row in audit.samples[:rows]:
            row["atypical_hit"] = True
        return audit

    assert suspected([WITHIN_RANGE], 1).removal_wanted() and suspected([WITHIN_RANGE] * 4, 2).removal_wanted()
    assert _audit([REMEMBERED, WITHIN_RANGE, WITHIN_RANGE]).removal_wanted()
    assert not suspected([WITHIN_RANGE] * 3, 1).removal_wanted()
    assert not _audit([WITHIN_RANGE, OVER_FORGOTTEN]).removal_wanted()
    assert not _audit([WITHIN_RANGE], alpha=None).removal_wanted()  # an earlier record: its remembered()


def _outcome() -> GateOutcome:
    return GateOutcome.of("without reference", [GateCheck(name="certificate", value="empirical only", limit=None,
                                                          passed=True)])


@pytest.mark.parametrize("readings, source, served, unmeasured", [
    ([REMEMBERED], [REMEMBERED], False, False),        # a no-op on a memorised sample: held back
    ([OVER_FORGOTTEN], [WITHIN_RANGE], False, False),   # marked below never-seen samples: held back
    ([WITHIN_RANGE], [REMEMBERED], True, False),        # the remembered sample brought back within range
    ([WITHIN_RANGE], [WITHIN_RANGE], True, True),       # nothing to show: serves, said unmeasured
])
def test_the_interim_tier_reads_the_per_sample_check(readings, source, served, unmeasured):
    check = _audit(readings).per_sample_check(_audit(source))
    judged = interim_judgement(_outcome(), "empirical only", _outcome(), per_sample=check)
    assert judged.interim is served, judged.held_back
    assert any("per sample" in line for line in judged.unmeasured) is unmeasured
    assert judged.per_sample.name == PER_SAMPLE_CHECK and judged.interim_checks()[-1] == judged.per_sample
    assert judged.passed  # the strict reading keeps its own rule: the per-sample check is not in it
    assert all(c.name != PER_SAMPLE_CHECK for c in judged.checks)
    assert PromotionGates()  # the gates' settings are unchanged by the per-sample reading


@pytest.mark.parametrize("per_sample, audit_verdict, served", [
    ("pass", "inconclusive", True),           # each remembered sample shown back: the AUC's band cannot undo it
    ("inconclusive", "inconclusive", False),  # nothing shown per sample: the AUC's doubt holds it back
    ("pass", "fail", False),                  # the forget set shown outside the band: held back whatever
])
def test_an_inconclusive_forget_set_auc_yields_to_per_sample_evidence_that_passes(per_sample, audit_verdict, served):
    """A mixed request the source remembers part of: the per-sample evidence decides where it passes,
    so a retrain-quality candidate serves; a source-failed AUC still holds back without it, and a
    failed AUC always does."""
    audit = GateCheck(name="forget_audit", value=0.64, limit=0.2, passed=audit_verdict == "pass", verdict=audit_verdict)
    candidate = GateOutcome.of("without reference", [GateCheck(name="certificate", value="empirical only", limit=None,
                                                               passed=True), audit])
    no_op = GateOutcome.of("without reference", [audit.model_copy(update={"verdict": "fail", "passed": False})])
    check = _audit([WITHIN_RANGE]).per_sample_check(_audit([REMEMBERED] if per_sample == "pass" else [WITHIN_RANGE]))
    assert check.verdict == per_sample
    judged = interim_judgement(candidate, "empirical only", no_op, per_sample=check)
    assert judged.interim is served, judged.held_back
    if served:
        assert any("per-sample evidence shows every sample" in line for line in judged.unmeasured)


@pytest.mark.parametrize("margin, interval, verdict", [
    (0.5, (0.2, 0.8), INCONCLUSIVE),   # a band that holds every AUC decides nothing (issue 57's 2-canary batch)
    (0.89, (0.9, 0.99), INCONCLUSIVE),
    (0.3, (0.3, 0.7), PASS),           # within a band that means something
    (0.3, (0.85, 0.99), FAIL),         # wholly above it: remembered
])
def test_the_audit_s_equivalence_reading_is_inconclusive_where_its_margin_holds_every_auc(margin, interval, verdict):
    """The interim tier's forget_audit row: at a size where the margin is 0.5 or more, no AUC could
    fail it, so it does not pass either; the receipt's gate table shows no limit for it."""
    from fedunlearn.receipts import NO_LIMIT_AT_THIS_SIZE, gate_rows

    audit = _audit([WITHIN_RANGE] * 2)
    audit.margin, audit.interval, audit.auc = margin, interval, sum(interval) / 2
    check = audit.equivalence_check()
    assert check.verdict == verdict
    judged = interim_judgement(_outcome(), "empirical only", _outcome(), audit_equivalence=check)
    judged = judged.model_copy(update={"checks": judged.checks + [GateCheck(name="forget_audit", value=audit.auc,
                                                                            limit=0.55, passed=True)]})
    row = next(r for r in gate_rows(judged, interim_tier=True) if r["gate"] == "forget_audit")
    assert row["result"] == (verdict if verdict != FAIL else "FAIL")
    assert (row["limit"] == NO_LIMIT_AT_THIS_SIZE) is (margin >= 0.5)


def test_a_reading_s_scale_and_tail_are_the_nan_median_and_student_t_definitions():
    """The lower robust scale is MAD_TO_SD × np.nanmedian of the distances below the centre
    (MIN_SCALE where none is below) and the lower tail is Student's t cdf, exactly."""
    import math
    import warnings

    from scipy import stats

    from fedunlearn.evaluation.per_sample import MAD_TO_SD, MIN_SCALE, TAIL_DF, _lower_scale, _reading
    rng = np.random.default_rng(6)
    for residual in [rng.standard_t(5, m) for m in (1, 2, 7, 200)] + [np.zeros(5), np.arange(4.0)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            below = np.nanmedian(np.where(residual < 0, -residual, np.nan))
        assert _lower_scale(residual) == (MIN_SCALE if math.isnan(below) else max(MAD_TO_SD * below, MIN_SCALE))
    never_seen = _never_seen(rng, size=300)
    for z in (-3.0, 0.2, 4.0):
        reading = _reading(z, True, never_seen, np.arange(150))
        assert reading[1] == float(stats.t.cdf(reading[3], TAIL_DF)) and reading[1] < 1.0
