"""Per-example forgetting audit without retraining per deletion batch (DESIGN.md §6).

``audit_forgetting`` scores each forget sample by offline LiRA [2]_: z = (φ_target − μ_out)/σ_out,
φ the logit-scaled confidence on its label, μ_out the mean φ of K reference models that never saw
it, σ_out one pooled standard deviation. The references (``train_audit_set``) train once per data
version on pool A of the held-out split; pool B gives the non-members, as (row, label) pairs: each row
with its own label and with every other. Nobody tells the audit which samples are memorised. The
forget set's z are compared with those pairs stratum by stratum — the label, or, for a sample whose
label the references reject (mean φ < 0), its bin of difficulty, relabelled pairs joining only where
pool B has too few of its own — as a stratified AUC with its interval [4]_:
``not forgotten`` iff the one-sided (1 − α) lower bound exceeds 0.5 + tolerance, ``forgotten`` iff
the upper bound is within it, else ``inconclusive`` (the strict tier's reading);
``AuditResult.equivalence_check`` reads the same AUC two-sidedly (the interim tier's). Why:
population attacks overestimate forgetting [3]_, and the power is in calibrating each sample by
models that never saw it [1]_, [2]_; references trained on held-out rows make every later forget
sample "out", so nothing is retrained per batch, and an exact retrain is called ``not forgotten``
with probability ≤ α whatever the references. The derivations, the margin, the conformal p-values
and the marked non-members (canaries, backdoors): docs/methods.md, "The statistics behind the gates
and the audit"; the per-sample evidence: ``per_sample``.

References
----------
.. [1] Watson et al. (2022), "On the Importance of Difficulty Calibration in Membership Inference
   Attacks", ICLR: subtract what reference models predict for the sample.
.. [2] Carlini et al. (2022), "Membership Inference Attacks From First Principles", IEEE S&P:
   LiRA; the offline variant uses "out" references only, with one variance pooled over examples
   below about 64 references.
.. [3] Hayes et al. (2024), "Inexact Unlearning Needs More Careful Evaluations to Avoid a False
   Sense of Privacy" (U-LiRA): audit unlearning per example.
.. [4] van Elteren (1960), "On the Combination of Independent Two-Sample Tests of Wilcoxon":
   within-stratum statistics pooled with weights.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedunlearn.config import PER_EXAMPLE_VARIANCE_MIN_REFERENCES, AuditConfig
from fedunlearn.evaluation.backdoor import triggered
from fedunlearn.evaluation.mia import (MIN_STD, label_matched_nonmembers, logit_scaled_confidence,
                                       logit_scaled_confidences)
from fedunlearn.evaluation.uncertainty import (AT_MOST, AUC_METHOD, FAIL, INCONCLUSIVE, PASS, STRATIFIED_AUC_METHOD,
                                               VACUOUS_MARGIN,
                                               Check, check_stratified_auc, equivalence_margin, judge_within,
                                               stratified_null_sd)
from fedunlearn.evaluation.per_sample import (OVER_FORGOTTEN, REMEMBERED, WITHIN_RANGE, NeverSeen, SampleEvidence,
                                              sample_evidence)
from fedunlearn.federation.local import Tensors, predict_logits, sgd_epochs

# INCONCLUSIVE is shared with the gate checks; the other two verdicts are the audit's words for pass/fail.
FORGOTTEN, NOT_FORGOTTEN = "forgotten", "not forgotten"
_AUDIT_VERDICT = {PASS: FORGOTTEN, FAIL: NOT_FORGOTTEN, INCONCLUSIVE: INCONCLUSIVE}
_CHECK_VERDICT = {audit: check for check, audit in _AUDIT_VERDICT.items()}
# Carlini et al.: below about 64 reference models a per-example variance is mostly noise.
CHECK_NAME = "forget_audit_auc"
EQUIVALENCE_CHECK = "forget_audit_equivalence"
PER_SAMPLE_CHECK = "forget_audit_per_sample"
PER_SAMPLE_METHOD = "difficulty-matched-robust-t"
# Added to a label to make the stratum of pairs whose label the references reject (mean φ < 0, a
# probability under one half): a mislabelled or atypical sample meets never-seen pairs of its kind.
ATYPICAL_STRATUM = 1 << 20


@dataclass(eq=False)
class AuditSet:
    """K reference models and their non-member pool. ``train_ids[k]``: the sample IDs reference
    k trained on (all in pool A, ``pool_a_ids``); ``pool``: pool B; ``pool_phi``: (K, |pool|)
    the references' φ on pool B, kept so that an audit scores only the forget set under them;
    ``seconds``: wall time of the training. Nothing in it says which samples are memorised: the
    audit finds them from the samples' own scores."""

    models: list[nn.Module]
    train_ids: list[np.ndarray]
    pool_a_ids: np.ndarray
    pool: Tensors
    pool_phi: np.ndarray
    config: AuditConfig
    seconds: float

    def __len__(self) -> int:
        return len(self.models)

    def trained_on(self, sample_ids: Iterable[Any]) -> list[int]:
        """Indices of the references whose training subset holds any of ``sample_ids``."""
        ids = np.asarray(list(sample_ids))
        return [k for k, seen in enumerate(self.train_ids) if np.isin(ids, seen).any()]

    def calibration_rows(self, heldout: Tensors) -> Tensors:
        """The rows of ``heldout`` in pool A: never-seen samples a method may size its strength to
        (``FederatedState.calibration``) without reading the audit's non-members (pool B)."""
        return heldout.select(np.isin(heldout.sample_ids, self.pool_a_ids))

    def without(self, sample_ids: Iterable[Any]) -> "AuditSet":
        """The set after a request named held-out rows: references that trained on any of them are
        retired and the rows leave pool B. Fewer than 2 references left: retrain the set."""
        ids = np.asarray(list(sample_ids))
        retired = self.trained_on(ids)
        keep = [k for k in range(len(self)) if k not in retired]
        if len(keep) < 2:
            raise ValueError(f"{len(self) - len(keep)} of {len(self)} references trained on deleted rows; fewer "
                             "than 2 remain: train a new reference set on the current held-out split")
        in_pool = ~np.isin(self.pool.sample_ids, ids)
        return AuditSet([self.models[k] for k in keep], [self.train_ids[k] for k in keep],
                            self.pool_a_ids[~np.isin(self.pool_a_ids, ids)], self.pool.select(in_pool),
                            self.pool_phi[keep][:, in_pool], self.config, self.seconds)


def train_audit_set(heldout: Tensors, model_fn: Callable[[], nn.Module], *, config: AuditConfig | None = None,
                     seed: int = 0, on_reference: Callable[[int, int], None] | None = None) -> AuditSet:
    """Split ``heldout`` (the held-out split, never production training data) into pools A and B
    and train ``config.num_references`` models on seeded random subsets of pool A.

    ``model_fn``: builds a fresh model (called after ``torch.manual_seed``, so its initial
    weights are seeded); models are moved to the device of ``heldout``. ``config`` (default
    ``AuditConfig()``): sizes and the central SGD (``sgd_epochs``) settings. ``seed`` (default
    0): the pools, subsets, initial weights and batch orders. ``on_reference(k, n)``: called once the
    k-th of the n references is trained."""
    config = config or AuditConfig()
    rng = np.random.default_rng([seed, 0xA0D1])
    order = rng.permutation(len(heldout))
    in_pool_a = np.zeros(len(heldout), dtype=bool)
    in_pool_a[order[:int(round(config.reference_pool_fraction * len(heldout)))]] = True
    pool_a, pool_b = heldout.select(in_pool_a), heldout.select(~in_pool_a)
    subset_size = int(round(config.subset_fraction * len(pool_a)))
    if subset_size < 1 or len(pool_b) < 1:
        raise ValueError(f"a held-out split of {len(heldout)} samples is too small for pool A subsets of "
                         f"{config.subset_fraction:.0%} and a non-empty pool B")
    started = time.perf_counter()
    models, train_ids = [], []
    for model_seed in rng.integers(0, 2**31 - 1, size=config.num_references):
        subset = np.zeros(len(pool_a), dtype=bool)
        subset[rng.permutation(len(pool_a))[:subset_size]] = True
        data = pool_a.select(subset)
        torch.manual_seed(int(model_seed))
        model = model_fn().to(heldout.x.device)
        sgd_epochs(model, data, epochs=config.epochs, lr=config.lr, batch_size=config.batch_size,
                   momentum=config.momentum, generator=torch.Generator().manual_seed(int(model_seed)))
        models.append(model)
        train_ids.append(data.sample_ids.copy())
        if on_reference is not None:
            on_reference(len(models), config.num_references)
    pool_phi = np.stack([logit_scaled_confidence(model, pool_b) for model in models])
    return AuditSet(models, train_ids, pool_a.sample_ids.copy(), pool_b, pool_phi, config,
                        time.perf_counter() - started)


def restore_references(models: list[nn.Module], train_ids: list[np.ndarray], pool_a_ids: np.ndarray,
                       heldout: Tensors, pool_ids: np.ndarray, config: AuditConfig) -> AuditSet:
    """A reference set stored earlier (``models`` with their weights, the IDs it was built from),
    its pool B read from ``heldout`` — the held-out split of the current data version, so rows a
    request deleted since are gone from it — and its scores on pool B computed again."""
    pool = heldout.select(np.isin(heldout.sample_ids, pool_ids))
    pool_phi = np.stack([logit_scaled_confidence(model, pool) for model in models])
    return AuditSet(models, train_ids, pool_a_ids, pool, pool_phi, config, 0.0)


def _uses_fixed_variance(config: AuditConfig, num_references: int) -> bool:
    if config.fixed_variance is not None:
        return config.fixed_variance
    return num_references < PER_EXAMPLE_VARIANCE_MIN_REFERENCES


def _calibrated(target_phi: np.ndarray, reference_phi: np.ndarray, pooled_std: float | None) -> np.ndarray:
    """z = (φ_target − μ_out) / σ_out with ``pooled_std`` or, if None, the per-example σ."""
    mean = reference_phi.mean(axis=0)
    std = pooled_std if pooled_std is not None else reference_phi.std(axis=0, ddof=1)
    return (target_phi - mean) / np.maximum(std, MIN_STD)


def _pooled_std(reference_phi: np.ndarray) -> float:
    """σ pooled over examples: the mean of the per-example variances (K − 1 degrees of freedom each)."""
    return float(np.sqrt(reference_phi.var(axis=0, ddof=1).mean()))


def matched_nonmember_rows(member_labels: np.ndarray, pool_labels: np.ndarray, seed: int) -> np.ndarray:
    """Distinct pool rows whose label histogram is r × the members' (r ≥ 1 as large as the pool
    allows without repeating a row): more non-members narrow the AUC's interval. Where a label is
    short of even one per member, the shortfall is not filled with repeats (a repeated non-member
    would count as independent evidence twice) and that label is under-represented."""
    member_labels, pool_labels = np.asarray(member_labels), np.asarray(pool_labels)
    labels, member_counts = np.unique(member_labels, return_counts=True)
    pool_counts = np.array([(pool_labels == label).sum() for label in labels])
    ratio = max(1, int((pool_counts // member_counts).min()))
    return np.unique(label_matched_nonmembers(np.repeat(member_labels, ratio), pool_labels, seed))


def _conformal_p_values(forget_z: np.ndarray, forget_strata: np.ndarray, pool_z: np.ndarray,
                        pool_strata: np.ndarray) -> np.ndarray:
    """(1 + #{same-stratum pool z ≥ z_i}) / (1 + #{same-stratum pool}): the +1s make it valid, not
    just approximately so, for a sample exchangeable with the pool's."""
    p_values = np.empty(len(forget_z))
    for i, (z, stratum) in enumerate(zip(forget_z, forget_strata)):
        same = pool_z[pool_strata == stratum]
        p_values[i] = (1 + (same >= z).sum()) / (1 + len(same))
    return p_values


def _plain(value: Any) -> Any:
    """numpy scalars become Python ones, for JSON."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass
class AuditResult:
    """One audit. ``interval``: the two-sided (1 − 2α) interval of ``auc`` (one-sided (1 − α)
    bounds, see the module docstring); ``limit`` = 0.5 + tolerance; ``references``: K;
    ``samples``: per forget sample ``{"sample_id", "label", "z", "p_value"}``; ``nonmember_z``:
    the non-members' scores the forget set was compared with (for the plot); ``seconds``: the
    audit's wall time, ``reference_seconds`` the one-off training of the references it used;
    ``method``: the AUC and its interval (``stratified-delong-logit``: per label against all of
    pool B; ``delong-logit``: records of the earlier audit against one matched subset);
    ``n_compared``: forget samples whose stratum pool B holds (the others have nothing to be
    compared with; None in earlier records); ``canaries``: forget samples an earlier audit was told
    were canaries (0 since the audit is told nothing); ``atypical``: forget samples whose label the
    references reject (mean φ < 0), audited against never-seen pairs of that kind;
    ``margin``: the equivalence margin of the interim tier's reading (``equivalence_check``), sized
    to the counts compared (None in earlier records)."""

    verdict: str
    auc: float
    interval: tuple[float, float]
    limit: float
    alpha: float
    n_forget: int
    n_nonmembers: int
    references: int
    fixed_variance: bool
    samples: list[dict[str, Any]]
    nonmember_z: list[float]
    seconds: float
    reference_seconds: float
    method: str = AUC_METHOD
    n_compared: int | None = None
    canaries: int = 0
    margin: float | None = None
    per_sample_alpha: float | None = None
    atypical: int = 0

    def as_check(self) -> Check:
        """The audit as a gate check ("AUC ≤ limit"; ``pass`` = forgotten, ``fail`` = not forgotten)."""
        return Check(CHECK_NAME, self.auc, self.interval, self.limit, self.n_forget + self.n_nonmembers,
                     _CHECK_VERDICT[self.verdict], self.alpha, AT_MOST, self.method, 1.0 - 2.0 * self.alpha)

    def equivalence_check(self) -> Check | None:
        """The audit read as equivalence (the interim tier's question): ``pass`` iff the interval lies
        within ``margin`` of 0.5 on both sides, ``fail`` iff it lies wholly above (the forget set
        remembered) or wholly below (over-forgotten: it stands out as *less* member-like than
        never-seen samples), else ``inconclusive`` — always where the margin is ``VACUOUS_MARGIN`` or
        more (a band that holds every AUC shows nothing). None for a record without a margin."""
        if self.margin is None:
            return None
        check = judge_within(EQUIVALENCE_CHECK, self.auc, lambda level: self.interval, self.margin,
                             n=self.n_forget + self.n_nonmembers, method=self.method, alpha=self.alpha)
        # A margin of 0.5 or more holds every AUC: at this size the band decides nothing, either way.
        return replace(check, verdict=INCONCLUSIVE) if self.margin >= VACUOUS_MARGIN else check

    def remembered(self) -> bool:
        """Whether the forget set, or any one sample of it, is shown remembered: a sample the per-sample
        evidence calls remembered, or the equivalence reading's ``fail`` on the remembering side (the
        interval wholly above 0.5 + ``margin``). False for a record with neither."""
        return bool(self.shown(REMEMBERED)) or (self.margin is not None and self.interval[0] > 0.5 + self.margin)

    def removal_wanted(self) -> bool:
        """Whether a batch should try the methods that remove what was memorised first: the forget
        set or a sample shown remembered (``remembered``), or a forget set of which half or more are
        removal targets (``removal_targets``: at p ≤ α/2, or predicted with a label the references
        reject). The order is no verdict (every candidate meets the same gates), so it takes a
        suspicion a verdict could not: one memorised row of a small request is often short of α/2 on
        its own. Half, not any: a model predicts some hard rows of any large set (a client's) with
        labels weaker references reject, and such a set keeps the policy's order. ``remembered`` for
        a record without per-sample evidence."""
        if self.per_sample_alpha is None:
            return self.remembered()
        return self.remembered() or 2 * len(self.removal_targets()) >= self.n_forget

    def shown(self, reading: str) -> list[Any]:
        """The sample IDs whose per-sample reading is ``reading`` (``per_sample.REMEMBERED``, …)."""
        return [row["sample_id"] for row in self.samples if row.get("reading") == reading]

    def per_sample_check(self, source: "AuditResult | None" = None) -> Check | None:
        """The per-sample evidence as one check (``pass`` = nothing remembered or over-forgotten):
        ``fail`` where any sample is shown remembered or over-forgotten (Holm, α/2 a side); ``pass``
        where none is and the ``source`` model's own evidence showed some sample remembered (brought
        back within the range of never-seen samples); else ``inconclusive`` — the source remembers no
        sample, so there is nothing per sample to show gone. None for a record without the evidence."""
        if self.per_sample_alpha is None:
            return None
        flagged = len(self.shown(REMEMBERED)) + len(self.shown(OVER_FORGOTTEN))
        source_remembers = source is not None and bool(source.shown(REMEMBERED))
        verdict = FAIL if flagged else PASS if source_remembers else INCONCLUSIVE
        return Check(PER_SAMPLE_CHECK, float(flagged), (float(flagged), float(flagged)), 0.0, self.n_forget, verdict,
                     self.per_sample_alpha, AT_MOST, PER_SAMPLE_METHOD, 1.0 - self.per_sample_alpha)

    def removal_targets(self) -> list[Any]:
        """The sample IDs a removal method should treat as remembered: each sample whose own one-sided
        p-value of being remembered is at most α/2, without the family-wise correction — a remembered
        sample left in place costs its subject's privacy, an ordinary one treated as remembered only a
        few points of its accuracy — and each sample the model predicts with a label the references,
        which never saw it, reject (``atypical_hit``: a learnt wrong label, a learnt outlier). All of
        them for a record without per-sample evidence."""
        if self.per_sample_alpha is None:
            return [row["sample_id"] for row in self.samples]
        return [row["sample_id"] for row in self.samples
                if row["p_remembered"] <= self.per_sample_alpha / 2.0 or row.get("atypical_hit")]

    def per_sample_summary(self) -> str:
        """One line: how many samples each reading holds."""
        counts = {reading: len(self.shown(reading)) for reading in (REMEMBERED, OVER_FORGOTTEN, WITHIN_RANGE)}
        return (f"{counts[REMEMBERED]} remembered, {counts[OVER_FORGOTTEN]} over-forgotten, {counts[WITHIN_RANGE]} "
                f"within the range of never-seen samples, of {self.n_forget}")

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["interval"] = list(self.interval)
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "AuditResult":
        return cls(**{**record, "interval": tuple(record["interval"])})


def _reference_phi(references: AuditSet, data: Tensors) -> np.ndarray:
    return np.stack([logit_scaled_confidence(model, data) for model in references.models])


def _require_outside_pools(forget: Tensors, references: AuditSet) -> None:
    if len(forget) == 0:
        raise ValueError("the audit needs at least one forget sample")
    overlap = np.isin(forget.sample_ids, np.concatenate([references.pool_a_ids, references.pool.sample_ids]))
    if overlap.any():
        raise ValueError(f"{int(overlap.sum())} forget sample(s) belong to the references' held-out pools "
                         f"(e.g. {forget.sample_ids[overlap][0]!r}); retire them with AuditSet.without")


@torch.no_grad()
def _predicts_label(model: nn.Module, data: Tensors) -> np.ndarray:
    if len(data) == 0:
        return np.zeros(0, dtype=bool)
    return (predict_logits(model, data.x).argmax(1) == data.y.to(next(model.parameters()).device)).cpu().numpy()


@dataclass(frozen=True)
class _Pairs:
    """Never-seen (row, label) pairs of pool B under the candidate and the references: each row with
    the label the data gives it, then with every other label (``relabelled``)."""

    z: np.ndarray
    difficulty: np.ndarray
    labels: np.ndarray
    hits: np.ndarray
    relabelled: np.ndarray

    def never_seen(self) -> NeverSeen:
        return NeverSeen(self.z, self.difficulty, self.hits, self.relabelled)

    def strata(self) -> np.ndarray:
        return _strata(self.labels, self.difficulty)

    def compared(self) -> np.ndarray:
        """The pairs the AUC compares with: pool B's own, and relabelled ones only in the strata where
        pool B holds fewer than ``DENSE_STRATUM`` of its own (where its rows are exchangeable with a
        random training sample, they are the yardstick; wrong labels stand in where they are too few)."""
        strata = self.strata()
        kinds, counts = np.unique(strata[~self.relabelled], return_counts=True)
        dense = kinds[counts >= DENSE_STRATUM]
        return ~self.relabelled | ~np.isin(strata, dense)


# A stratum with this many of pool B's own pairs compares with those alone.
DENSE_STRATUM = 20
# The width (φ units) of the difficulty bins that stratify samples whose label the references reject.
ATYPICAL_BIN = 2.0


def _strata(labels: np.ndarray, difficulty: np.ndarray) -> np.ndarray:
    """The AUC's strata: the label; for a sample whose label the references reject (mean φ < 0),
    its bin of difficulty instead, so that it meets never-seen pairs as hard as itself."""
    difficulty = np.asarray(difficulty, float)
    bins = np.floor(np.maximum(difficulty, -1e6) / ATYPICAL_BIN).astype(np.int64)
    return np.where(difficulty < 0, ATYPICAL_STRATUM + bins, np.asarray(labels))


def _held_strata(forget_strata: np.ndarray, pool_strata: np.ndarray) -> np.ndarray:
    """``forget_strata`` with each atypical stratum pool B's pairs do not hold moved to the nearest one
    they do: a sample harder than any never-seen pair is compared with the hardest (without this, a
    one-sample request in an empty bin has no AUC at all)."""
    # Atypical strata lie within 1e6 / ATYPICAL_BIN below ATYPICAL_STRATUM; labels are far below half of it.
    held = np.unique(pool_strata[pool_strata >= ATYPICAL_STRATUM // 2])
    if not len(held):
        return forget_strata
    moved = forget_strata.copy()
    for i, stratum in enumerate(forget_strata):
        if stratum >= ATYPICAL_STRATUM // 2 and stratum not in held:
            moved[i] = held[np.argmin(np.abs(held - stratum))]
    return moved


def _never_seen_pairs(target: nn.Module, references: AuditSet, pool: Tensors, pooled_std: float | None) -> _Pairs:
    """Every (row, label) pair of ``pool``: the candidate's φ and the references' on each label from
    one pass each (``logit_scaled_confidences``), so relabelling costs no extra forward pass."""
    candidate = logit_scaled_confidences(target, pool)
    reference = np.stack([logit_scaled_confidences(model, pool) for model in references.models])
    rows, classes = candidate.shape
    given = pool.y.cpu().numpy()
    labels = np.tile(np.arange(classes), rows)
    row_of = np.repeat(np.arange(rows), classes)
    if pooled_std is None:
        scale = np.maximum(reference.std(axis=0, ddof=1), MIN_STD).ravel()
    else:
        scale = np.full(rows * classes, max(pooled_std, MIN_STD))
    difficulty = reference.mean(axis=0).ravel()
    z = (candidate.ravel() - difficulty) / scale
    with torch.no_grad():
        predicted = predict_logits(target, pool.x).argmax(1).cpu().numpy()
    return _Pairs(z, difficulty, labels, predicted[row_of] == labels, labels != given[row_of])


def auc_scores(z: np.ndarray, hits: np.ndarray, difficulty: np.ndarray) -> np.ndarray:
    """The scores the AUC ranks: z, except for a pair whose label the references reject and the
    candidate does not predict either, which ranks below every predicted pair of its stratum and ties
    with the others. Its stratum's never-seen pairs are mostly relabelled rows the candidate rejects
    confidently; a row unlike any of them (noise, an outlier) that a model never saw is rejected less
    confidently, so its z alone would read as remembered (the per-sample rule's reason, per_sample.py)."""
    return np.where(np.asarray(hits, bool) | (np.asarray(difficulty, float) >= 0), z, -np.inf)


def audit_forgetting(target: nn.Module, forget: Tensors, references: AuditSet, *,
                     config: AuditConfig | None = None, seed: int = 0,
                     clean_forget_labels: np.ndarray | None = None) -> AuditResult:
    """Audit whether ``target`` still carries the ``forget`` samples (module docstring: score,
    rule, error rate). ``forget`` must hold none of the references' held-out rows (they would be
    "in" for a reference or their own non-members). ``config`` (default: the references'
    config): ``alpha``, ``tolerance`` and ``fixed_variance`` are read from it. ``seed``: unused
    since the audit compares with every pool-B pair (nothing is drawn); kept for callers.
    ``clean_forget_labels``: given when the forget samples carry the backdoor trigger and its label,
    their labels before poisoning; pool B is then stratified on them and triggered the same way.
    No argument says which forget samples are memorised: each is judged by its own score against
    never-seen pairs of its difficulty (``per_sample``)."""
    config = config or references.config
    started = time.perf_counter()
    _require_outside_pools(forget, references)
    pool, pool_phi, forget_labels = references.pool, references.pool_phi, forget.y.cpu().numpy()
    if clean_forget_labels is not None:
        forget_labels, pool = np.asarray(clean_forget_labels), triggered(pool)
        pool_phi = _reference_phi(references, pool)
    fixed = _uses_fixed_variance(config, len(references))
    pooled_std = _pooled_std(pool_phi) if fixed else None
    forget_ref_phi = _reference_phi(references, forget)
    forget_z = _calibrated(logit_scaled_confidence(target, forget), forget_ref_phi, pooled_std)
    forget_difficulty = forget_ref_phi.mean(axis=0)
    pairs = _never_seen_pairs(target, references, pool, pooled_std)
    kept = pairs.compared()
    pool_z, pool_strata = pairs.z[kept], pairs.strata()[kept]
    # Scored on the label it carries (a backdoor's target, if triggered), stratified by its difficulty there.
    forget_strata = _held_strata(_strata(forget.y.cpu().numpy(), forget_difficulty), pool_strata)
    hits = _predicts_label(target, forget)
    check = check_stratified_auc(CHECK_NAME, auc_scores(forget_z, hits, forget_difficulty), forget_strata,
                                 auc_scores(pairs.z, pairs.hits, pairs.difficulty)[kept], pool_strata,
                                 0.5 + config.tolerance, alpha=config.alpha)
    compared = np.isin(pool_strata, forget_strata)
    margin = equivalence_margin(stratified_null_sd(forget_strata, pool_strata), alpha=config.alpha,
                                beta=config.equivalence_beta)
    p_values = _conformal_p_values(forget_z, forget_strata, pool_z, pool_strata)
    evidence = sample_evidence(forget_z, forget_difficulty, hits, pairs.never_seen(), config.alpha)
    samples = _sample_rows(forget.sample_ids, forget_labels, forget_z, p_values, evidence, hits & (forget_difficulty < 0))
    return AuditResult(_AUDIT_VERDICT[check.verdict], check.estimate, check.interval, check.limit, config.alpha,
                       len(forget), int(compared.sum()), len(references), fixed, samples,
                       [float(z) for z in pool_z[compared]], time.perf_counter() - started, references.seconds,
                       STRATIFIED_AUC_METHOD, int(np.isin(forget_strata, pool_strata).sum()), 0,
                       margin, config.alpha, int((forget_difficulty < 0).sum()))


def _sample_rows(sample_ids: np.ndarray, labels: np.ndarray, z: np.ndarray, p_values: np.ndarray,
                 evidence: SampleEvidence, atypical_hits: np.ndarray) -> list[dict[str, Any]]:
    """Per forget sample: its score, conformal p-value and per-sample reading (t and its p-values;
    None where its stratum has no never-seen sample), and whether the model predicts a label the
    references reject (``atypical_hit``)."""
    finite = lambda value: float(value) if np.isfinite(value) else None
    return [{"sample_id": _plain(sample_id), "label": int(label), "z": float(score), "p_value": float(p),
             "t": finite(t), "p_remembered": float(high), "p_over": float(low), "reading": reading,
             "atypical_hit": bool(odd)}
            for sample_id, label, score, p, t, high, low, reading, odd in zip(
                sample_ids, labels, z, p_values, evidence.t, evidence.p_remembered, evidence.p_over,
                evidence.labels(), atypical_hits)]


def plot_audit(result: AuditResult, path: str | Path, *, bins: int = 30) -> Path:
    """Histograms (densities, shared bins) of the forget samples' and the matched non-members'
    z, titled with the verdict, written as a PNG to ``path``. ``bins`` (default 30)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    forget_z = np.array([row["z"] for row in result.samples])
    nonmember_z = np.asarray(result.nonmember_z)
    edges = np.histogram_bin_edges(np.concatenate([forget_z, nonmember_z]), bins=bins)
    figure = Figure(figsize=(6.0, 3.6))
    axes = figure.subplots()
    # Filled step outlines and fixed margins draw the same figure as ``hist`` and ``tight_layout``
    # faster (a bar per bin is an artist), and a batch draws several.
    for z, label in ((nonmember_z, f"never seen (n={result.n_nonmembers})"),
                     (forget_z, f"forget set (n={result.n_forget})")):
        axes.stairs(np.histogram(z, bins=edges, density=True)[0], edges, fill=True, alpha=0.6, label=label)
    axes.set_xlabel("calibrated score z (offline LiRA)")
    axes.set_ylabel("density")
    low, high = result.interval
    axes.set_title(f"{result.verdict}: AUC {result.auc:.3f} [{low:.3f}, {high:.3f}], "
                   f"limit {result.limit:.2f}, {result.references} references", fontsize=9)
    axes.legend(fontsize=8)
    figure.subplots_adjust(left=0.1, right=0.97, top=0.92, bottom=0.14)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=100)
    return path
