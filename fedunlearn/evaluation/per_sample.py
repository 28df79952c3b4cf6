"""Per-sample forgetting evidence: each forget sample judged against never-seen samples of its kind.

Two questions per forget sample, both answered against what the same candidate does on samples no
model of the federation trained on (pool B of the held-out split, relabelled alike for canaries),
so that the candidate's own scale and accuracy cancel:

* **remembered** — the candidate predicts the sample's training label where never-seen samples of
  its kind almost never get theirs predicted. A sample's p-value is the conformal rate
  (1 + hits)/(1 + N) of never-seen samples whose label the candidate predicts [1]_, over its rate
  group: all canaries together (a planted label is an arbitrary wrong class), an ordinary sample's
  label otherwise. A prediction at a rate above α/2 — an ordinary sample a generalising model gets
  right, as never-seen samples — is no evidence of memory: such a sample is *unmeasured*. The forget
  set's strong hits are counted against the Poisson-binomial law of those rates (the evidence
  combined into one test whose level holds at every request size, one sample included);
* **over-forgotten** — the candidate marks the sample *below* never-seen samples [2]_: its misses
  counted against the never-seen miss rates of their labels (Poisson-binomial), and its calibrated
  score z (offline LiRA [3]_) far under its stratum's never-seen scores (a robust, lower-side scale,
  Student's t tails, Holm's step-down [4]_ over the forget samples).

Each of the three tests runs at a share of α (α/2 remembered, α/4 each over-forgetting test), so a
candidate that never saw the samples — an exact retrain — is flagged with probability at most α.
Why these statistics and their measured rates: docs/methods.md, "Per-sample evidence".

References
----------
.. [1] Vovk, Gammerman and Shafer (2005), "Algorithmic Learning in a Random World": conformal p-values.
.. [2] Hayes et al. (2024), "Inexact Unlearning Needs More Careful Evaluations to Avoid a False
   Sense of Privacy" (U-LiRA): audit unlearning per example, both ways.
.. [3] Carlini et al. (2022), "Membership Inference Attacks From First Principles", IEEE S&P.
.. [4] Holm (1979), "A Simple Sequentially Rejective Multiple Test Procedure", Scandinavian
   Journal of Statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

# Chosen before the reported draws, on principle: never-seen scores have heavier tails than a
# normal's, and an over-forgotten sample sits far beyond them, so heavier tails cost little power.
TAIL_DF = 5
MAD_TO_SD = 1.4826
MIN_SCALE = 1e-6
REMEMBERED, OVER_FORGOTTEN, WITHIN_RANGE, UNMEASURED = "remembered", "over-forgotten", "within range", "unmeasured"


@dataclass(frozen=True)
class NeverSeen:
    """What the candidate does on never-seen samples: calibrated scores ``z``, their ``strata``
    (label; canary strata apart), ``rate_keys`` (the rate group: one key for every canary stratum,
    the label otherwise) and ``hits`` (whether it predicts their label)."""

    z: np.ndarray
    strata: np.ndarray
    rate_keys: np.ndarray
    hits: np.ndarray


@dataclass(frozen=True)
class SampleEvidence:
    """Per forget sample: ``t`` (calibrated score from its stratum's never-seen centre, NaN where it
    has none), ``p_remembered`` (the conformal rate of its hit; 1 for a miss) and ``p_over`` (the
    lower tail of ``t``), and the decisions: ``remembered``, ``over_forgotten``, ``measurable`` (its
    hit would be evidence of memory)."""

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


def hit_rates(rate_keys: np.ndarray, never_seen: NeverSeen) -> np.ndarray:
    """Per forget sample, the conformal rate (1 + hits)/(1 + N) of never-seen samples of its rate
    group whose label the candidate predicts; 1 where the group holds none."""
    rates = np.ones(len(rate_keys))
    for key in np.unique(rate_keys):
        group = never_seen.rate_keys == key
        if group.any():
            rates[rate_keys == key] = (1 + never_seen.hits[group].sum()) / (1 + group.sum())
    return rates


def miss_rates(rate_keys: np.ndarray, never_seen: NeverSeen) -> np.ndarray:
    """Per forget sample, the conformal rate of never-seen samples of its rate group the candidate misses."""
    flipped = NeverSeen(never_seen.z, never_seen.strata, never_seen.rate_keys, ~never_seen.hits)
    return hit_rates(rate_keys, flipped)


def lower_tail_scores(forget_z: np.ndarray, forget_strata: np.ndarray, never_seen: NeverSeen,
                      forget_groups: np.ndarray, pool_groups: np.ndarray) -> np.ndarray:
    """t per forget sample: its distance below its stratum's never-seen median, in a robust scale of
    the never-seen scores below their medians, pooled per kind of stratum (``*_groups``), widened
    for the median's own error. NaN where its stratum holds no never-seen sample."""
    strata = np.unique(never_seen.strata)
    centre = {s: float(np.median(never_seen.z[never_seen.strata == s])) for s in strata}
    count = {s: int((never_seen.strata == s).sum()) for s in strata}
    residuals = never_seen.z - np.array([centre[s] for s in never_seen.strata]) if len(never_seen.z) \
        else never_seen.z
    scale = {}
    for g in np.unique(pool_groups):
        below = -residuals[(pool_groups == g) & (residuals < 0)]
        scale[g] = max(MAD_TO_SD * float(np.median(below)), MIN_SCALE) if len(below) else math.nan
    t = np.full(len(forget_z), math.nan)
    for i, (z, s, g) in enumerate(zip(forget_z, forget_strata, forget_groups)):
        if s in centre and math.isfinite(scale.get(g, math.nan)):
            # The centre is a median of count[s] samples: its variance is about π/2 · σ² / n.
            t[i] = (z - centre[s]) / (scale[g] * math.sqrt(1.0 + math.pi / (2.0 * count[s])))
    return t


def sample_evidence(forget_hits: np.ndarray, forget_rate_keys: np.ndarray, t: np.ndarray, never_seen: NeverSeen,
                    alpha: float) -> SampleEvidence:
    """The three tests of the module docstring on one forget set, and each sample's reading."""
    forget_hits = np.asarray(forget_hits, dtype=bool)
    hit, miss = hit_rates(forget_rate_keys, never_seen), miss_rates(forget_rate_keys, never_seen)
    measurable = hit <= alpha / 2.0
    strong = forget_hits & measurable
    remembered = strong if poisson_binomial_tail(hit[measurable], int(strong.sum())) <= alpha / 2.0 else \
        np.zeros(len(t), dtype=bool)
    missed = ~forget_hits & (miss < 1.0)
    over = missed if missed.any() and poisson_binomial_tail(miss[miss < 1.0], int(missed.sum())) <= alpha / 4.0 \
        else np.zeros(len(t), dtype=bool)
    finite = np.isfinite(t)
    p_low = np.ones(len(t))
    p_low[finite] = stats.t.cdf(t[finite], TAIL_DF)
    if finite.any():
        over[finite] |= holm(p_low[finite], alpha / 4.0)
    p_high = np.where(forget_hits, hit, 1.0)
    return SampleEvidence(t, p_high, p_low, remembered, over & ~remembered, measurable, alpha)


__all__ = ["NeverSeen", "SampleEvidence", "holm", "poisson_binomial_tail", "hit_rates", "lower_tail_scores",
           "sample_evidence", "REMEMBERED", "OVER_FORGOTTEN", "WITHIN_RANGE", "UNMEASURED", "TAIL_DF"]
