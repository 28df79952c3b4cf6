"""Per-sample forgetting evidence (fedunlearn.evaluation.per_sample): each forget sample judged
against never-seen samples of its stratum, two-sided, Holm over the forget set — error rates that
hold at every request size, one sample included, and power where a sample is memorised."""

import itertools

from pathlib import Path

import numpy as np
import pytest

from fedunlearn.certify.gates import (PER_SAMPLE_CHECK, GateCheck, GateOutcome, PromotionGates, interim_judgement)
from fedunlearn.evaluation.audit import AuditResult
from fedunlearn.evaluation.per_sample import (OVER_FORGOTTEN, REMEMBERED, UNMEASURED, WITHIN_RANGE, NeverSeen,
                                              holm, lower_tail_scores, poisson_binomial_tail, sample_evidence)
from fedunlearn.evaluation.uncertainty import FAIL, INCONCLUSIVE, PASS

SIZES = (1, 2, 4, 8, 16, 40)
CANARY = 1 << 20
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


def _never_seen(rng, per_label=30, labels=10, canary_rate=0.01, label_rate=0.9, tails=5):
    """Never-seen samples under a candidate: ordinary ones (each label's own accuracy) and canaries
    (their planted label almost never predicted), calibrated scores with heavy tails."""
    strata = np.concatenate([np.repeat(np.arange(labels), per_label),
                             CANARY + np.repeat(np.arange(labels), per_label)])
    canary = strata >= CANARY
    hits = np.where(canary, rng.random(len(strata)) < canary_rate, rng.random(len(strata)) < label_rate)
    z = rng.standard_t(tails, len(strata)) if tails else rng.normal(size=len(strata))
    return NeverSeen(z, strata, np.where(canary, CANARY, strata), hits)


def _forget(rng, n, canaries: bool, canary_rate=0.01, label_rate=0.9, tails=5):
    """n forget samples drawn like never-seen ones (what an exact retrain gives them)."""
    labels = rng.integers(0, 10, n)
    strata = labels + (CANARY if canaries else 0)
    hits = rng.random(n) < (canary_rate if canaries else label_rate)
    z = rng.standard_t(tails, n) if tails else rng.normal(size=n)
    return z, strata, np.where(strata >= CANARY, CANARY, strata), hits


def _decide(never_seen, z, strata, keys, hits):
    t = lower_tail_scores(z, strata, never_seen, strata >= CANARY, never_seen.strata >= CANARY)
    return sample_evidence(hits, keys, t, never_seen, ALPHA)


@pytest.mark.parametrize("canaries, tails", [(True, 5), (False, 5), (False, None)])
def test_a_never_seen_sample_is_flagged_at_most_alpha_of_the_time_at_every_size(canaries, tails):
    """The null (an exact retrain): over 400 draws per size the family-wise false flag rate — either
    side — stays at or below α plus its sampling slack."""
    rng = np.random.default_rng(1)
    for n in SIZES:
        flagged = 0
        for _ in range(400):
            never_seen = _never_seen(rng, tails=tails)
            evidence = _decide(never_seen, *_forget(rng, n, canaries, tails=tails))
            flagged += bool(evidence.remembered.any() or evidence.over_forgotten.any())
        assert flagged / 400 <= ALPHA + 0.02, (n, flagged)


@pytest.mark.parametrize("n", SIZES)
def test_memorised_canaries_are_remembered_at_every_size_and_a_no_op_cannot_hide_them(n):
    """Every canary of the request predicted with its planted label (a source that memorised them):
    remembered at every size, one sample included; ordinary samples it gets right are unmeasured."""
    rng = np.random.default_rng(2)
    remembered = 0
    for _ in range(100):
        never_seen = _never_seen(rng)
        z, strata, keys, _ = _forget(rng, n, canaries=True)
        evidence = _decide(never_seen, z, strata, keys, np.ones(n, bool))
        remembered += bool(evidence.remembered.all())
        ordinary = _decide(never_seen, *_forget(rng, n, canaries=False)[:3], np.ones(n, bool))
        assert not ordinary.remembered.any() and set(ordinary.labels()) <= {UNMEASURED, OVER_FORGOTTEN}
    assert remembered >= 95, remembered


@pytest.mark.parametrize("n", SIZES)
def test_an_over_forgotten_sample_is_told_apart_at_every_size(n):
    """One forget sample pushed far under never-seen samples (an ordinary sample whose label the
    candidate now refuses): flagged over-forgotten, not remembered, at every size."""
    rng = np.random.default_rng(3)
    hits_found = 0
    for _ in range(100):
        never_seen = _never_seen(rng)
        z, strata, keys, hits = _forget(rng, n, canaries=False)
        z[0], hits[0] = -40.0, False
        evidence = _decide(never_seen, z, strata, keys, hits)
        hits_found += bool(evidence.over_forgotten[0])
        assert not evidence.remembered.any()
    assert hits_found >= 95, hits_found


def test_ordinary_samples_a_candidate_gets_wrong_in_numbers_are_over_forgotten():
    """Six of ten ordinary samples missed where never-seen samples are missed one time in ten: the
    count marks them, though no single score is extreme (the mixed request's failure)."""
    rng = np.random.default_rng(4)
    never_seen = _never_seen(rng, label_rate=0.95)
    z, strata, keys, _ = _forget(rng, 10, canaries=False)
    hits = np.array([False] * 6 + [True] * 4)
    evidence = _decide(never_seen, np.zeros(10), strata, keys, hits)
    assert evidence.over_forgotten[:6].all() and not evidence.over_forgotten[6:].any()


def test_a_sample_whose_stratum_has_no_never_seen_sample_is_unmeasured():
    never_seen = NeverSeen(np.array([0.0, 0.1, -0.1, 0.2]), np.zeros(4, int), np.zeros(4, int), np.ones(4, bool))
    evidence = _decide(never_seen, np.array([50.0, 0.0]), np.array([3, 0]), np.array([3, 0]), np.array([True, True]))
    assert evidence.labels() == [UNMEASURED, UNMEASURED]  # 3: nothing to compare; 0: never-seen all hit
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
