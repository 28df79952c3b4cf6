"""Per-sample forgetting evidence: each forget sample's own score judged against never-seen pairs of
like difficulty, with nobody telling the audit which samples are memorised.

A forget sample (x, y) has a calibrated score z = (φ_cand(x, y) − μ_out(x, y)) / σ_out under the
candidate (offline LiRA [1]_) and a *difficulty* μ_out(x, y): the references' mean φ on its label —
how strongly models that never saw x believe y (difficulty calibration [2]_). A memorised atypical
sample — a mislabelled row, a rare shape — has a low difficulty and, under a model that learnt it, a
z above never-seen pairs of that difficulty; under a model that never saw it, a z among them. The
candidate's own strength (a retrain is more confident than the references on labels they believe and
less on those they reject) is read from never-seen pairs under the same candidate, so it cancels.

The never-seen pairs are pool B of the held-out split twice over: with the labels the data gives its
rows (*its own* pairs: the user's mislabelled or atypical rows among them, at the data's own rate) and
with every other label (*relabelled*: what a wrong label looks like to each model). A forget sample is
judged against its ``NEIGHBOURS`` nearest pairs in difficulty and, where at least ``DENSE`` of pool
B's own pairs lie within ``BANDWIDTH`` of its difficulty, against those as well; each side's p-value
is the larger of the two. Pool B's own pairs are exchangeable with a random training sample of that
difficulty; where they are too few (far harder than any held-out row) relabelled pairs stand in, which
is right for a wrong label and errs towards "remembered" for a hard right one — the safe side for the
data subject: the batch escalates towards the exact retrain. Two questions per sample:

* **remembered** — the candidate predicts the sample's label and scores it *above* the neighbours it
  also predicts with theirs: its conformal p-value (1 + #{predicted neighbours with z at least as
  high}) / (1 + m); a sample whose label it does not predict has p = 1. A memorised sample is
  predicted with its label; a sample a candidate never saw and is unsure of (near-uniform on a row
  unlike any held-out row) scores a high z against pairs it confidently rejects, but its label is not
  predicted, so that score does not make it remembered (what is left of it is the forget set's AUC's
  to see). The strong samples (p ≤ α/2) are counted against their binomial law, one test at every
  request size, one sample included, and beside it any sample at p ≤ α/(2n) (Bonferroni: one
  memorised sample among a few); a sample whose neighbours are too few to reach α/2 is *unmeasured*;
* **over-forgotten** — the candidate marks the sample *below* never-seen pairs [3]_: its misses counted
  against its neighbours' miss rates (Poisson-binomial), and z far under its neighbours' median in their
  lower robust scale (Student's t tails, Holm's step-down [4]_), at α/4 each.

So a candidate that never saw the samples — an exact retrain — is flagged with probability about α at
most, where its forget samples resemble pool B's pairs of their difficulty. Measured rates, and where
they do not hold: docs/BENCHMARKS.md, "The interim decision at every request size".

References
----------
.. [1] Carlini et al. (2022), "Membership Inference Attacks From First Principles", IEEE S&P.
.. [2] Watson et al. (2022), "On the Importance of Difficulty Calibration in Membership Inference
   Attacks", ICLR.
.. [3] Hayes et al. (2024), "Inexact Unlearning Needs More Careful Evaluations to Avoid a False
   Sense of Privacy" (U-LiRA): audit unlearning per example, both ways.
.. [4] Holm (1979), "A Simple Sequentially Rejective Multiple Test Procedure", Scandinavian
   Journal of Statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

# Chosen on principle before any draw was reported: never-seen scores have heavier tails than a
# normal's, and a memorised or over-forgotten sample sits far beyond them.
TAIL_DF = 5
MAD_TO_SD = 1.4826
MIN_SCALE = 1e-6
# Never-seen pairs a forget sample is compared with: its NEIGHBOURS nearest pairs of both kinds and,
# where at least DENSE of pool B's own pairs (the data's labels) lie within BANDWIDTH of its
# difficulty, those too; each side's p-value is the larger of the two (chosen on tuning draws,
# docs/methods.md). Fewer pairs in all than MIN_NEIGHBOURS: no yardstick.
NEIGHBOURS = 200
DENSE = 40
BANDWIDTH = 3.0
MIN_NEIGHBOURS = 20
OVER_SHARE = 1 / 4
REMEMBERED, OVER_FORGOTTEN, WITHIN_RANGE, UNMEASURED = "remembered", "over-forgotten", "within range", "unmeasured"


@dataclass(frozen=True)
class NeverSeen:
    """Never-seen (sample, label) pairs under the candidate: ``z`` their calibrated scores,
    ``difficulty`` the references' mean φ on the pair's label, ``hits`` whether the candidate
    predicts that label, ``relabelled`` True for a pair whose label is not the one the data gives."""

    z: np.ndarray
    difficulty: np.ndarray
    hits: np.ndarray
    relabelled: np.ndarray


@dataclass(frozen=True)
class SampleEvidence:
    """Per forget sample: ``t`` (its z from its neighbours' median in their lower robust scale; NaN
    without neighbours), ``p_remembered`` (the conformal rate of neighbours scoring at least as high)
    and ``p_over`` (the lower tail of ``t``), and the decisions ``remembered``, ``over_forgotten``
    and ``measurable`` (it has neighbours to be judged against)."""

    t: np.ndarray
    p_remembered: np.ndarray
    p_over: np.ndarray
    remembered: np.ndarray
    over_forgotten: np.ndarray
    measurable: np.ndarray
    alpha: float

    def labels(self) -> list[str]:
        """Each sample's reading: remembered, over-forgotten, within range or unmeasured."""
        return [REMEMBERED if r else OVER_FORGOTTEN if o else WITHIN_RANGE if m else UNMEASURED
                for r, o, m in zip(self.remembered, self.over_forgotten, self.measurable)]


def holm(p_values: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's step-down rejections at family-wise level ``alpha``: sorted ascending, p_(i) is
    rejected while p_(j) ≤ α / (m − j) for every j ≤ i."""
    p_values = np.asarray(p_values, dtype=float)
    order = np.argsort(p_values, kind="stable")
    passing = p_values[order] <= alpha / (len(p_values) - np.arange(len(p_values)))
    count = len(passing) if passing.all() else int(np.argmin(passing))
    rejected = np.zeros(len(p_values), dtype=bool)
    rejected[order[:count]] = True
    return rejected


def poisson_binomial_tail(rates: np.ndarray, k: int) -> float:
    """P(Σ Bernoulli(rates) ≥ k), by convolution."""
    if k <= 0:
        return 1.0
    law = np.zeros(len(rates) + 1)
    law[0] = 1.0
    for n, rate in enumerate(rates, start=1):
        law[1:n + 1] = law[1:n + 1] * (1 - rate) + law[:n] * rate
        law[0] *= 1 - rate
    return float(min(1.0, law[k:].sum()))


def nearest(difficulty: np.ndarray, pool_difficulty: np.ndarray, size: int) -> np.ndarray:
    """(n, size) indices into ``pool_difficulty`` of each sample's ``size`` nearest pairs."""
    size = min(size, len(pool_difficulty))
    distance = np.abs(np.asarray(difficulty, float)[:, None] - pool_difficulty[None, :])
    return np.argpartition(distance, size - 1, axis=1)[:, :size]


def neighbourhoods(difficulty: np.ndarray, never_seen: NeverSeen, size: int = NEIGHBOURS) -> list[list[np.ndarray]]:
    """Per forget sample, the index sets of never-seen pairs it is judged against: its nearest pairs
    of both kinds, and pool B's own within ``BANDWIDTH`` where they are dense enough."""
    given = np.flatnonzero(~never_seen.relabelled)
    union = nearest(np.asarray(difficulty, float), never_seen.difficulty, size)
    chosen = []
    for value, rows in zip(np.asarray(difficulty, float), union):
        near = given[np.abs(never_seen.difficulty[given] - value) <= BANDWIDTH]
        own = [near[np.argsort(np.abs(never_seen.difficulty[near] - value))[:size]]] if len(near) >= DENSE else []
        chosen.append([rows] + own)
    return chosen


def _lower_scale(residual: np.ndarray) -> float:
    """MAD_TO_SD × the median distance of the residuals below the centre, MIN_SCALE at the least."""
    # The median of the values below the centre is np.nanmedian of them NaN-padded, without its
    # masked-array path (which, called once a sample, was most of an audit's per-sample time).
    below = -residual[residual < 0]
    return max(MAD_TO_SD * float(np.median(below)), MIN_SCALE) if len(below) else MIN_SCALE


def sample_evidence(z: np.ndarray, difficulty: np.ndarray, hits: np.ndarray, never_seen: NeverSeen,
                    alpha: float, size: int = NEIGHBOURS) -> SampleEvidence:
    """The tests of the module docstring on one forget set, and each sample's reading."""
    z, difficulty, hits = np.asarray(z, float), np.asarray(difficulty, float), np.asarray(hits, bool)
    n = len(z)
    if len(never_seen.z) < MIN_NEIGHBOURS:
        none = np.zeros(n, dtype=bool)
        return SampleEvidence(np.full(n, math.nan), np.ones(n), np.ones(n), none, none, none, alpha)
    p_high, p_low, t, miss = np.ones(n), np.ones(n), np.full(n, math.nan), np.ones(n)
    measurable = np.zeros(n, dtype=bool)
    for i, sets in enumerate(neighbourhoods(difficulty, never_seen, size)):
        readings = [_reading(z[i], hits[i], never_seen, rows) for rows in sets]
        p_high[i], p_low[i], miss[i] = (max(r[k] for r in readings) for k in range(3))
        t[i] = max(r[3] for r in readings)  # the t of the larger lower-tail p-value
        # Too few neighbours to reach α/2: a hit could not be evidence of memory.
        measurable[i] = min(len(rows) for rows in sets) + 1 >= 2.0 / alpha
    remembered = _remembered(p_high, alpha)
    over = _over_forgotten(p_low, miss, hits, alpha)
    return SampleEvidence(t, p_high, p_low, remembered, over & ~remembered, measurable, alpha)


def _reading(z: float, hit: bool, never_seen: NeverSeen, rows: np.ndarray) -> tuple[float, float, float, float]:
    """Against the pairs ``rows``: the conformal upper p-value of (hit, z), the lower tail of its
    robust t, the conformal miss rate of those pairs, and t."""
    scores, m, hits = never_seen.z[rows], len(rows), never_seen.hits[rows]
    centre = float(np.median(scores))
    # The centre is a median of m pairs: its variance is about π/2 · σ² / m.
    t = (z - centre) / (_lower_scale(scores - centre) * math.sqrt(1.0 + math.pi / (2.0 * m)))
    # stdtr is what stats.t.cdf computes, without its per-call argument handling.
    return ((1 + _at_least(z, hit, scores, hits)) / (1 + m), float(special.stdtr(TAIL_DF, t)),
            (1 + (~hits).sum()) / (1 + m), t)


def _at_least(z: float, hit: bool, scores: np.ndarray, hits: np.ndarray) -> int:
    """Never-seen pairs at least as remembered-looking as (hit, z): for a sample the candidate
    predicts with its label, the pairs it predicts with theirs and scores at least as high; for one
    it does not, every pair (p = 1: a sample whose label is not predicted is not shown remembered)."""
    if not hit:
        return len(scores)
    return int((hits & (scores >= z)).sum())


def _remembered(p_high: np.ndarray, alpha: float) -> np.ndarray:
    """The strong samples (p ≤ α/2) when their count is improbable for never-seen ones (≤ α/2), and
    any sample at p ≤ α/(2n) (Bonferroni: one memorised sample among a few, which a count of one
    cannot show past n = 1; at n = 1 both rules are one)."""
    strong = p_high <= alpha / 2.0
    single = p_high <= alpha / (2.0 * max(len(p_high), 1))
    if poisson_binomial_tail(np.full(len(p_high), alpha / 2.0), int(strong.sum())) <= alpha / 2.0:
        return strong
    return single


def _over_forgotten(p_low: np.ndarray, miss: np.ndarray, hits: np.ndarray, alpha: float) -> np.ndarray:
    """Misses improbable in number for the neighbours' miss rates, and scores far below them (Holm)."""
    level = OVER_SHARE * alpha
    missed = ~hits & (miss < 1.0)
    counted = missed if missed.any() and poisson_binomial_tail(miss[miss < 1.0], int(missed.sum())) <= level \
        else np.zeros(len(hits), dtype=bool)
    return counted | holm(p_low, level)


__all__ = ["NeverSeen", "SampleEvidence", "holm", "poisson_binomial_tail", "nearest", "neighbourhoods",
           "sample_evidence", "REMEMBERED", "OVER_FORGOTTEN", "WITHIN_RANGE", "UNMEASURED", "TAIL_DF", "NEIGHBOURS"]
