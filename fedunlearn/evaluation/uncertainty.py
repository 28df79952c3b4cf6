"""Checks that carry their uncertainty: each metric judged with its confidence interval.

A metric measured on few samples — a deletion batch has a handful to a few hundred forget samples
— is judged with its interval (DESIGN.md §6), and a check answers ``pass``, ``fail`` or
``inconclusive``: it never fails on noise, and never passes on a number too uncertain to prove
anything. Intervals: a proportion, Clopper–Pearson [1]_ (exact) or Wilson [2]_; the difference of
two proportions, independent [3]_ or paired [4]_; the ROC AUC of members against non-members,
DeLong [5]_ on the logit scale [6]_ floored at Hanley–McNeil [7]_; a label-stratified AUC [8]_,
[9]_; the difference of two AUCs. Verdicts at level α (default 0.05): ``at most``, ``|gap| at
most`` (two one-sided tests [10]_) and ``within margin of chance`` (``judge_within``; the margin
sized by ``equivalence_margin``); each fails a model that meets its limit with probability at most
α. Every check returns a ``Check`` record that serialises to JSON. Why these intervals, their
pitfalls, each rule's error rates and the measured coverage: docs/methods.md, "The statistics
behind the gates and the audit".

References
----------
.. [1] Clopper and Pearson (1934), "The Use of Confidence or Fiducial Limits Illustrated in the Case
   of the Binomial", Biometrika.
.. [2] Wilson (1927), "Probable Inference, the Law of Succession, and Statistical Inference", JASA.
.. [3] Newcombe (1998a), "Interval Estimation for the Difference Between Independent Proportions:
   Comparison of Eleven Methods", Statistics in Medicine: method 10.
.. [4] Newcombe (1998b), "Improved Confidence Intervals for the Difference Between Binomial
   Proportions Based on Paired Data", Statistics in Medicine: method 10.
.. [5] DeLong, DeLong and Clarke-Pearson (1988), "Comparing the Areas Under Two or More Correlated
   Receiver Operating Characteristic Curves: A Nonparametric Approach", Biometrics.
.. [6] Pohar Perme and Manevski (2018), "Confidence Intervals for the Mann–Whitney Test",
   Statistical Methods in Medical Research.
.. [7] Hanley and McNeil (1982), "The Meaning and Use of the Area Under a Receiver Operating
   Characteristic (ROC) Curve", Radiology.
.. [8] van Elteren (1960), "On the Combination of Independent Two-Sample Tests of Wilcoxon".
.. [9] Newcombe (2006), "Confidence Intervals for an Effect Size Measure Based on the Mann–Whitney
   Statistic. Part 2: Asymptotic Methods and Evaluation", Statistics in Medicine: method 5.
.. [10] Schuirmann (1987), "A Comparison of the Two One-Sided Tests Procedure and the Power
   Approach for Assessing the Equivalence of Average Bioavailability", Journal of
   Pharmacokinetics and Biopharmaceutics.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats
from scipy.special import expit, logit

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
AT_MOST, ABS_AT_MOST, WITHIN = "at most", "|gap| at most", "within margin of chance"
# An AUC lies in [0, 1]: a band of 0.5 ± this or wider around chance holds every value.
VACUOUS_MARGIN = 0.5
DEFAULT_ALPHA = 0.05
AUC_METHOD = "delong-logit"

ProportionMethod = Literal["clopper-pearson", "wilson"]
Bounds = tuple[float, float]
# confidence level → (low, high): the verdict rules pick the level they need.
IntervalAt = Callable[[float], Bounds]


@dataclass(frozen=True)
class Check:
    """One judged metric. ``estimate`` and ``interval`` are on the metric's scale (for a gap
    check: the signed gap, metric − reference); ``limit`` is the limit or the tolerance;
    ``confidence`` the two-sided level of ``interval``; ``n`` the samples behind the estimate
    (an AUC: members + non-members; a paired gap: the shared samples; an independent gap: both
    samples); ``method`` names the interval."""

    name: str
    estimate: float
    interval: Bounds
    limit: float
    n: int
    verdict: str
    alpha: float
    rule: str
    method: str
    confidence: float

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["interval"] = list(self.interval)
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "Check":
        return cls(**{**record, "interval": tuple(record["interval"])})


# --- intervals ----------------------------------------------------------------------------------

def _require_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def _z(confidence: float) -> float:
    """The standard normal quantile of a two-sided ``confidence`` level."""
    _require_confidence(confidence)
    return float(stats.norm.ppf(0.5 + confidence / 2.0))


def _require_counts(successes: int, n: int) -> None:
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"a proportion needs n ≥ 1 and 0 ≤ successes ≤ n, got {successes}/{n}")


def proportion_interval(successes: int, n: int, *, confidence: float = 0.95,
                        method: ProportionMethod = "clopper-pearson") -> Bounds:
    """Two-sided interval for a binomial proportion ``successes / n``.

    ``confidence`` (default 0.95): two-sided level. ``method`` (default ``"clopper-pearson"``):
    ``"clopper-pearson"`` (exact, coverage ≥ ``confidence`` always) or ``"wilson"`` (score
    interval, shorter, coverage close to nominal)."""
    _require_counts(successes, n)
    if method == "clopper-pearson":
        _require_confidence(confidence)
        tail = (1.0 - confidence) / 2.0
        low = 0.0 if successes == 0 else float(stats.beta.ppf(tail, successes, n - successes + 1))
        high = 1.0 if successes == n else float(stats.beta.ppf(1.0 - tail, successes + 1, n - successes))
        return low, high
    if method == "wilson":
        return _wilson(successes, n, _z(confidence))
    raise ValueError(f"unknown proportion interval {method!r}; choose 'clopper-pearson' or 'wilson'")


def _wilson(successes: int, n: int, z: float) -> Bounds:
    p = successes / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # Clamp rounding only: the Wilson interval always contains p and lies in [0, 1].
    return max(0.0, min(p, center - half)), min(1.0, max(p, center + half))


def _newcombe(p_a: float, wilson_a: Bounds, p_b: float, wilson_b: Bounds, phi: float) -> Bounds:
    """Newcombe's square-and-add of the Wilson limits, with correlation ``phi`` (0: independent)."""
    gap = p_a - p_b
    below_a, above_a = p_a - wilson_a[0], wilson_a[1] - p_a
    below_b, above_b = p_b - wilson_b[0], wilson_b[1] - p_b
    down = math.sqrt(max(below_a ** 2 - 2 * phi * below_a * above_b + above_b ** 2, 0.0))
    up = math.sqrt(max(above_a ** 2 - 2 * phi * above_a * below_b + below_b ** 2, 0.0))
    return max(-1.0, gap - down), min(1.0, gap + up)


def proportion_difference_interval(successes_a: int, n_a: int, successes_b: int, n_b: int, *,
                                   confidence: float = 0.95) -> Bounds:
    """Two-sided interval for p_a − p_b from two *independent* samples (Newcombe 1998a, method 10).
    On two models scored on the same samples it is valid but conservative when they agree more
    often than chance would have it (the usual case); prefer
    ``paired_proportion_difference_interval`` when the per-sample outcomes are at hand.
    ``confidence`` (default 0.95): two-sided level."""
    _require_counts(successes_a, n_a)
    _require_counts(successes_b, n_b)
    z = _z(confidence)
    return _newcombe(successes_a / n_a, _wilson(successes_a, n_a, z),
                     successes_b / n_b, _wilson(successes_b, n_b, z), 0.0)


def _paired_outcomes(outcomes_a: np.ndarray, outcomes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(outcomes_a, dtype=bool), np.asarray(outcomes_b, dtype=bool)
    if a.ndim != 1 or a.shape != b.shape or len(a) == 0:
        raise ValueError(f"paired outcomes need two 1-D arrays of the same non-zero length, got "
                         f"{a.shape} and {b.shape}")
    return a, b


def paired_proportion_difference_interval(outcomes_a: np.ndarray, outcomes_b: np.ndarray, *,
                                          confidence: float = 0.95) -> Bounds:
    """Two-sided interval for p_a − p_b where ``outcomes_a[i]`` and ``outcomes_b[i]`` (booleans,
    e.g. "model a / model b classified sample i correctly") are measured on the same sample i
    (Newcombe 1998b, method 10, with its continuity-corrected correlation).
    ``confidence`` (default 0.95): two-sided level."""
    a, b = _paired_outcomes(outcomes_a, outcomes_b)
    n = len(a)
    both, only_a, only_b = int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum())
    neither = n - both - only_a - only_b
    z = _z(confidence)
    margins = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    association = both * neither - only_a * only_b
    if association > 0:  # Newcombe's correction: shrink a positive association by n/2
        association = max(association - n / 2.0, 0.0)
    phi = association / math.sqrt(margins) if margins > 0 else 0.0
    k_a, k_b = both + only_a, both + only_b
    return _newcombe(k_a / n, _wilson(k_a, n, z), k_b / n, _wilson(k_b, n, z), phi)


def _average_ranks(scores: np.ndarray) -> np.ndarray:
    """``stats.rankdata(scores)`` (ranks from 1, ties given their mean; NaN throughout where a score is
    NaN), without its per-call argument handling, which dominated audits of many small strata."""
    if np.isnan(scores).any():
        return np.full(len(scores), np.nan)
    order = np.argsort(scores, kind="mergesort")
    inverse = np.empty(len(order), dtype=np.intp)
    inverse[order] = np.arange(len(order))
    ordered = scores[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]
    dense = first.cumsum()[inverse]
    bounds = np.r_[np.nonzero(first)[0], len(first)]
    return 0.5 * (bounds[dense] + bounds[dense - 1] + 1)


def _placements(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's structural components: per member, the share of non-members it outscores (ties
    count ½); per non-member, the share of members that outscore it. Their means are the AUC."""
    members = np.asarray(member_scores, dtype=np.float64)
    nonmembers = np.asarray(nonmember_scores, dtype=np.float64)
    if members.ndim != 1 or nonmembers.ndim != 1 or len(members) == 0 or len(nonmembers) == 0:
        raise ValueError("an AUC needs 1-D scores with at least one member and one non-member")
    joint = _average_ranks(np.concatenate([members, nonmembers]))
    m = len(members)
    member_placements = (joint[:m] - _average_ranks(members)) / len(nonmembers)
    nonmember_placements = 1.0 - (joint[m:] - _average_ranks(nonmembers)) / m
    return member_placements, nonmember_placements


def _component_variance(placements: np.ndarray) -> float:
    return float(placements.var(ddof=1)) / len(placements) if len(placements) > 1 else 0.0


def _hanley_mcneil_variance(auc: float, members: int, nonmembers: int) -> float:
    """Hanley & McNeil (1982): Var(AUC) when the scores are exponentially distributed; at 0.5 it
    equals the exact permutation variance (m + n + 1) / (12 m n) of the Mann–Whitney statistic."""
    return auc * (1 - auc) / (members * nonmembers) * (
        1 + (members - 1) * (1 - auc) / (2 - auc) + (nonmembers - 1) * auc / (1 + auc))


def auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """P(member score > non-member score) + ½ P(tie): the ROC AUC, higher scores meaning members."""
    return float(_placements(member_scores, nonmember_scores)[0].mean())


def auc_interval(member_scores: np.ndarray, nonmember_scores: np.ndarray, *,
                 confidence: float = 0.95) -> Bounds:
    """Two-sided interval for the ROC AUC of members vs non-members: DeLong variance floored at
    Hanley–McNeil's, logit scale (the choice and its coverage: docs/methods.md).
    ``confidence`` (default 0.95): two-sided level."""
    member_placements, nonmember_placements = _placements(member_scores, nonmember_scores)
    m, n = len(member_placements), len(nonmember_placements)
    estimate = float(member_placements.mean())
    # Keep the estimate off 0 and 1 by half a pair so that its logit is finite.
    shrunk = min(max(estimate, 0.5 / (m * n)), 1 - 0.5 / (m * n))
    variance = max(_component_variance(member_placements) + _component_variance(nonmember_placements),
                   _hanley_mcneil_variance(shrunk, m, n))
    half_width = _z(confidence) * math.sqrt(variance) / (shrunk * (1 - shrunk))
    center = float(logit(shrunk))
    return float(expit(center - half_width)), float(expit(center + half_width))


Stratum = tuple[float, np.ndarray, np.ndarray]  # (weight, member placements, non-member placements)
STRATIFIED_AUC_METHOD = "stratified-delong-logit"


def _strata(member_scores: np.ndarray, member_strata: np.ndarray, nonmember_scores: np.ndarray,
            nonmember_strata: np.ndarray) -> list[Stratum]:
    """Per stratum holding members and non-members: the members' share of all such members and the
    within-stratum placements. Members of a stratum without non-members are left out (nothing to
    compare them with)."""
    members, nonmembers = np.asarray(member_scores, dtype=np.float64), np.asarray(nonmember_scores, dtype=np.float64)
    member_strata, nonmember_strata = np.asarray(member_strata), np.asarray(nonmember_strata)
    if member_strata.shape != members.shape or nonmember_strata.shape != nonmembers.shape:
        raise ValueError(f"one stratum per score: members {members.shape} vs {member_strata.shape}, "
                         f"non-members {nonmembers.shape} vs {nonmember_strata.shape}")
    shared = [key for key in np.unique(member_strata) if (nonmember_strata == key).any()]
    if not shared:
        raise ValueError("a stratified AUC needs a stratum with at least one member and one non-member")
    used = sum(int((member_strata == key).sum()) for key in shared)
    return [(float((member_strata == key).sum()) / used,
             *_placements(members[member_strata == key], nonmembers[nonmember_strata == key])) for key in shared]


def stratified_counts(member_strata: np.ndarray, nonmember_strata: np.ndarray) -> tuple[int, int]:
    """Members and non-members a stratified AUC compares: those in strata that hold both."""
    member_strata, nonmember_strata = np.asarray(member_strata), np.asarray(nonmember_strata)
    shared = np.intersect1d(member_strata, nonmember_strata)
    return int(np.isin(member_strata, shared).sum()), int(np.isin(nonmember_strata, shared).sum())


def stratified_null_sd(member_strata: np.ndarray, nonmember_strata: np.ndarray) -> float:
    """The stratified AUC's standard deviation when members and non-members are exchangeable within
    every stratum (true AUC 0.5): √(Σ_s w_s² (m_s + n_s + 1) / (12 m_s n_s)), the Mann–Whitney
    permutation variance of each stratum weighted as ``stratified_auc`` weights it. It depends on the
    counts alone, so a margin built on it is fixed before any score is seen."""
    member_strata, nonmember_strata = np.asarray(member_strata), np.asarray(nonmember_strata)
    shared = [key for key in np.unique(member_strata) if (nonmember_strata == key).any()]
    if not shared:
        raise ValueError("a stratified AUC needs a stratum with at least one member and one non-member")
    m = np.array([(member_strata == key).sum() for key in shared], dtype=np.float64)
    n = np.array([(nonmember_strata == key).sum() for key in shared], dtype=np.float64)
    weights = m / m.sum()
    return float(np.sqrt((weights ** 2 * (m + n + 1) / (12 * m * n)).sum()))


def equivalence_margin(null_sd: float, *, alpha: float = DEFAULT_ALPHA, beta: float = 0.01) -> float:
    """The margin of ``judge_within`` for an AUC whose standard deviation at 0.5 is ``null_sd``:
    (z_{1−α} + z_{1−β/2}) · sd₀. A candidate exchangeable with never-seen samples (an exact
    retrain) has its estimate within z_{1−β/2} · sd₀ of 0.5 with probability 1 − β, and its (1 − 2α)
    interval reaches about z_{1−α} · sd₀ further: it passes with probability ≈ 1 − β.
    ``alpha`` (default 0.05): the test's level; ``beta`` (default 0.01): the rate at which such a
    candidate may be held back."""
    _require_alpha(alpha)
    if not 0.0 < beta < 1.0 or null_sd <= 0:
        raise ValueError(f"beta must lie in (0, 1) and null_sd be > 0 (got beta={beta}, null_sd={null_sd})")
    return float((stats.norm.ppf(1 - alpha) + stats.norm.ppf(1 - beta / 2)) * null_sd)


def judge_within(name: str, estimate: float, interval_at: IntervalAt, margin: float, *, n: int, method: str,
                 alpha: float = DEFAULT_ALPHA, centre: float = 0.5) -> Check:
    """Check "|metric − centre| ≤ margin" by two one-sided tests at level ``alpha`` (module
    docstring, ``within margin of chance``); ``limit`` records the margin, ``interval`` the
    two-sided (1 − 2α) interval. ``centre`` (default 0.5, chance for an AUC)."""
    _require_alpha(alpha)
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin}")
    confidence = 1.0 - 2.0 * alpha
    low, high = interval_at(confidence)
    if low > centre + margin or high < centre - margin:
        verdict = FAIL
    elif centre - margin <= low and high <= centre + margin:
        verdict = PASS
    else:
        verdict = INCONCLUSIVE
    return Check(name, float(estimate), (float(low), float(high)), float(margin), int(n), verdict, alpha, WITHIN,
                 method, confidence)


def stratified_auc(member_scores: np.ndarray, member_strata: np.ndarray, nonmember_scores: np.ndarray,
                   nonmember_strata: np.ndarray) -> float:
    """Σ_s w_s AUC_s, AUC_s the AUC of stratum s's members against its non-members only and w_s its
    share of the members (van Elteren's pooling): a label mix cannot move it."""
    return float(sum(weight * placements.mean()
                     for weight, placements, _ in _strata(member_scores, member_strata, nonmember_scores,
                                                          nonmember_strata)))


def _score_bound(estimate: float, variance_at: Callable[[np.ndarray], np.ndarray], z: float, direction: int) -> float:
    """The bound nearest ``estimate`` in ``direction`` (−1 lower, +1 upper) of {θ : |estimate − θ| ≤
    z · sd(θ)}: a grid walk outward from the estimate, then bisection between the last θ inside and
    the first outside (0 or 1 when none is outside)."""
    def outside(theta: np.ndarray) -> np.ndarray:
        return np.abs(estimate - theta) > z * np.sqrt(variance_at(theta))

    end = 0.0 if direction < 0 else 1.0
    grid = np.linspace(estimate, end, 1001)
    first = np.flatnonzero(outside(grid))
    if len(first) == 0:
        return end
    inside, out = grid[first[0] - 1], grid[first[0]]
    for _ in range(40):
        middle = (inside + out) / 2
        inside, out = (inside, middle) if outside(np.array([middle]))[0] else (middle, out)
    return float((inside + out) / 2)


def stratified_auc_interval(member_scores: np.ndarray, member_strata: np.ndarray, nonmember_scores: np.ndarray,
                            nonmember_strata: np.ndarray, *, confidence: float = 0.95) -> Bounds:
    """Two-sided interval for ``stratified_auc``: the hull of the stratified DeLong-logit interval
    and the score interval of the strata's Hanley–McNeil variances (why the hull: docs/methods.md).
    The DeLong member component is the larger of the strata's and the members' pooled one: a
    stratum of one member has no spread of its own, and a small request leaves many such strata.
    ``confidence`` (default 0.95)."""
    strata = _strata(member_scores, member_strata, nonmember_scores, nonmember_strata)
    weights = np.array([weight for weight, _, _ in strata])
    m = np.array([len(members) for _, members, _ in strata])
    n = np.array([len(nonmembers) for _, _, nonmembers in strata])
    estimate = float(sum(weight * members.mean() for weight, members, _ in strata))
    delong = sum(weight ** 2 * _component_variance(nonmembers) for weight, _, nonmembers in strata) + max(
        sum(weight ** 2 * _component_variance(members) for weight, members, _ in strata),
        _component_variance(np.concatenate([members for _, members, _ in strata])))

    def hanley_mcneil(theta: np.ndarray) -> np.ndarray:
        theta = np.asarray(theta)[..., None]
        return (weights ** 2 * theta * (1 - theta) / (m * n) * (
            1 + (m - 1) * (1 - theta) / (2 - theta) + (n - 1) * theta / (1 + theta))).sum(axis=-1)

    z = _z(confidence)
    half_pair = 0.5 / float((m * n).sum())  # keeps the logit finite
    shrunk = min(max(estimate, half_pair), 1 - half_pair)
    half_width = z * math.sqrt(delong) / (shrunk * (1 - shrunk))
    return (min(float(expit(logit(shrunk) - half_width)), _score_bound(estimate, hanley_mcneil, z, -1)),
            max(float(expit(logit(shrunk) + half_width)), _score_bound(estimate, hanley_mcneil, z, +1)))


def auc_difference(member_scores_a: np.ndarray, nonmember_scores_a: np.ndarray,
                   member_scores_b: np.ndarray, nonmember_scores_b: np.ndarray) -> float:
    """AUC_a − AUC_b."""
    return auc(member_scores_a, nonmember_scores_a) - auc(member_scores_b, nonmember_scores_b)


def auc_difference_interval(member_scores_a: np.ndarray, nonmember_scores_a: np.ndarray,
                            member_scores_b: np.ndarray, nonmember_scores_b: np.ndarray, *, paired: bool,
                            confidence: float = 0.95) -> Bounds:
    """Two-sided interval for AUC_a − AUC_b (DeLong et al. 1988, Wald).

    ``paired`` (no default: say which): True when a and b score the *same* members and the same
    non-members in the same order (two models, one sample set; their covariance is subtracted),
    False when the samples are independent (the variances add). ``confidence`` (default 0.95):
    two-sided level."""
    members_a, nonmembers_a = _placements(member_scores_a, nonmember_scores_a)
    members_b, nonmembers_b = _placements(member_scores_b, nonmember_scores_b)
    gap = float(members_a.mean() - members_b.mean())
    if paired:
        if members_a.shape != members_b.shape or nonmembers_a.shape != nonmembers_b.shape:
            raise ValueError("paired AUCs need the same members and non-members under both models")
        # Variance of the difference = the DeLong variance of the per-sample placement differences.
        variance = (_component_variance(members_a - members_b)
                    + _component_variance(nonmembers_a - nonmembers_b))
    else:
        variance = sum(_component_variance(p) for p in (members_a, nonmembers_a, members_b, nonmembers_b))
    half_width = _z(confidence) * math.sqrt(variance)
    return max(-1.0, gap - half_width), min(1.0, gap + half_width)


# --- verdict rules ------------------------------------------------------------------------------

def _require_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must lie strictly between 0 and 0.5, got {alpha}")


def judge_at_most(name: str, estimate: float, interval_at: IntervalAt, limit: float, *, n: int,
                  method: str, alpha: float = DEFAULT_ALPHA) -> Check:
    """Check "metric ≤ limit": ``fail`` iff the one-sided (1 − α) lower bound exceeds ``limit``,
    ``pass`` iff the one-sided (1 − α) upper bound is within it, else ``inconclusive``
    (false-reject and false-accept rate ≤ α each). ``interval_at(confidence)`` gives the
    metric's two-sided interval at a level; ``n`` and ``method`` are recorded.
    ``alpha`` (default 0.05): the error rate."""
    _require_alpha(alpha)
    confidence = 1.0 - 2.0 * alpha
    low, high = interval_at(confidence)
    verdict = FAIL if low > limit else PASS if high <= limit else INCONCLUSIVE
    return Check(name, float(estimate), (float(low), float(high)), float(limit), int(n), verdict, alpha,
                 AT_MOST, method, confidence)


def judge_abs_at_most(name: str, gap: float, interval_at: IntervalAt, tolerance: float, *, n: int,
                      method: str, alpha: float = DEFAULT_ALPHA) -> Check:
    """Check "|gap| ≤ tolerance" for a signed ``gap``: ``fail`` iff the two-sided (1 − α)
    interval lies entirely outside [−tolerance, tolerance], ``pass`` iff entirely inside, else
    ``inconclusive`` (false-reject rate ≤ α, false-accept rate ≤ α/2).
    ``alpha`` (default 0.05): the error rate."""
    _require_alpha(alpha)
    if tolerance < 0:
        raise ValueError(f"a tolerance must be ≥ 0, got {tolerance}")
    confidence = 1.0 - alpha
    low, high = interval_at(confidence)
    if low > tolerance or high < -tolerance:
        verdict = FAIL
    elif -tolerance <= low and high <= tolerance:
        verdict = PASS
    else:
        verdict = INCONCLUSIVE
    return Check(name, float(gap), (float(low), float(high)), float(tolerance), int(n), verdict, alpha,
                 ABS_AT_MOST, method, confidence)


# --- checks for the metrics the gates use ------------------------------------------------------

def check_proportion(name: str, successes: int, n: int, limit: float, *, alpha: float = DEFAULT_ALPHA,
                     method: ProportionMethod = "clopper-pearson") -> Check:
    """"successes / n ≤ limit" (e.g. the backdoor attack success rate). ``alpha`` (default 0.05);
    ``method`` (default ``"clopper-pearson"``, whose error rates hold exactly)."""
    _require_counts(successes, n)
    return judge_at_most(name, successes / n,
                         lambda level: proportion_interval(successes, n, confidence=level, method=method),
                         limit, n=n, method=method, alpha=alpha)


def check_auc(name: str, member_scores: np.ndarray, nonmember_scores: np.ndarray, limit: float, *,
              alpha: float = DEFAULT_ALPHA) -> Check:
    """"AUC(members vs non-members) ≤ limit" (e.g. a membership attack). ``alpha`` (default 0.05)."""
    return judge_at_most(name, auc(member_scores, nonmember_scores),
                         lambda level: auc_interval(member_scores, nonmember_scores, confidence=level),
                         limit, n=len(member_scores) + len(nonmember_scores), method=AUC_METHOD,
                         alpha=alpha)


def check_stratified_auc(name: str, member_scores: np.ndarray, member_strata: np.ndarray,
                         nonmember_scores: np.ndarray, nonmember_strata: np.ndarray, limit: float, *,
                         alpha: float = DEFAULT_ALPHA) -> Check:
    """"stratified AUC ≤ limit" (``stratified_auc``; e.g. a membership audit per label). ``n``
    counts the members and non-members in strata holding both. ``alpha`` (default 0.05)."""
    args = (member_scores, member_strata, nonmember_scores, nonmember_strata)
    return judge_at_most(name, stratified_auc(*args),
                         lambda level: stratified_auc_interval(*args, confidence=level),
                         limit, n=sum(stratified_counts(member_strata, nonmember_strata)),
                         method=STRATIFIED_AUC_METHOD, alpha=alpha)


def check_proportion_gap(name: str, successes_a: int, n_a: int, successes_b: int, n_b: int,
                         tolerance: float, *, alpha: float = DEFAULT_ALPHA) -> Check:
    """"|p_a − p_b| ≤ tolerance" from counts of two independent samples (or from accuracies ×
    sizes when per-sample outcomes are not kept: conservative for two models on one sample).
    ``alpha`` (default 0.05)."""
    _require_counts(successes_a, n_a)
    _require_counts(successes_b, n_b)
    return judge_abs_at_most(
        name, successes_a / n_a - successes_b / n_b,
        lambda level: proportion_difference_interval(successes_a, n_a, successes_b, n_b, confidence=level),
        tolerance, n=n_a + n_b, method="newcombe-hybrid-score", alpha=alpha)


def check_paired_proportion_gap(name: str, outcomes_a: np.ndarray, outcomes_b: np.ndarray, tolerance: float, *,
                                alpha: float = DEFAULT_ALPHA) -> Check:
    """"|p_a − p_b| ≤ tolerance" for two models' per-sample outcomes on the same samples (e.g.
    test accuracy of the unlearned vs the retrained model). ``alpha`` (default 0.05)."""
    a, b = _paired_outcomes(outcomes_a, outcomes_b)
    return judge_abs_at_most(
        name, float(a.mean() - b.mean()),
        lambda level: paired_proportion_difference_interval(a, b, confidence=level),
        tolerance, n=len(a), method="newcombe-paired", alpha=alpha)


def check_auc_gap(name: str, member_scores_a: np.ndarray, nonmember_scores_a: np.ndarray,
                  member_scores_b: np.ndarray, nonmember_scores_b: np.ndarray, tolerance: float, *,
                  paired: bool, alpha: float = DEFAULT_ALPHA) -> Check:
    """"|AUC_a − AUC_b| ≤ tolerance" (e.g. membership-attack AUC of the unlearned vs the retrained
    model). ``paired``: see ``auc_difference_interval``. ``alpha`` (default 0.05)."""
    n = len(member_scores_a) + len(nonmember_scores_a)
    if not paired:
        n += len(member_scores_b) + len(nonmember_scores_b)
    return judge_abs_at_most(
        name, auc_difference(member_scores_a, nonmember_scores_a, member_scores_b, nonmember_scores_b),
        lambda level: auc_difference_interval(member_scores_a, nonmember_scores_a, member_scores_b,
                                              nonmember_scores_b, paired=paired, confidence=level),
        tolerance, n=n, method="delong-paired" if paired else "delong-independent", alpha=alpha)
