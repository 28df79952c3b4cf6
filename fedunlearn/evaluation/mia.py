"""Membership inference on the forget set (DESIGN.md §4).

Population attacks, one score per sample thresholded over the whole population:
``confidence_attack`` [1]_ (softmax confidence on the true label), ``loss_attack`` [2]_
(−cross-entropy; Yeom's decision rule is ``loss_threshold``) and ``shadow_attack`` [3]_ (a classifier
trained on a shadow model's outputs for its own training data, "in", and unseen data, "out", then
applied to the target model). Per example, ``ulira_audit``: the likelihood-ratio attack [4]_ in the
unlearning form of [5]_ (U-LiRA), which compares each example with models that did and did not see
*that* example; population attacks cannot, and overestimate forgetting. Members (label 1) are the
forget set, non-members (label 0) held-out samples never trained on, drawn with the members' label
histogram (``label_matched_nonmembers``): under label skew an attack against the whole test set
measures the label mix, not membership. A higher score means "more likely a member". Why both the
confidence and the loss attack are reported: DESIGN.md §4.

References
----------
.. [1] Song and Mittal (2021), "Systematic Evaluation of Privacy Risks of Machine Learning
   Models", USENIX Security.
.. [2] Yeom, Giacomelli, Fredrikson and Jha (2018), "Privacy Risk in Machine Learning: Analyzing
   the Connection to Overfitting", IEEE CSF.
.. [3] Shokri, Stronati, Song and Shmatikov (2017), "Membership Inference Attacks Against Machine
   Learning Models", IEEE S&P.
.. [4] Carlini et al. (2022), "Membership Inference Attacks From First Principles", IEEE S&P.
.. [5] Hayes et al. (2024), "Inexact Unlearning Needs More Careful Evaluations to Avoid a False
   Sense of Privacy".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn

from fedunlearn.federation.local import Tensors, predict_logits

LOW_FPR = 0.01
# Floor on the per-example standard deviation of U-LiRA's Gaussians: shadow models that agree
# exactly (e.g. deterministic training) would otherwise give a zero variance.
MIN_STD = 1e-3

ShadowSetup = tuple[nn.Module, Tensors, Tensors]
TrainFn = Callable[[np.ndarray, int], nn.Module]


@dataclass(eq=False)
class AttackResult:
    """One attack's outcome. ``accuracy`` is balanced (mean of TPR and TNR), so it reads the same
    whatever the member/non-member ratio; ``fpr``/``tpr`` are the ROC curve, for plots."""

    name: str
    accuracy: float
    auc: float
    tpr_at_1fpr: float
    fpr: np.ndarray
    tpr: np.ndarray
    member_scores: np.ndarray | None = None  # what the AUC's confidence interval is computed from
    nonmember_scores: np.ndarray | None = None

    def summary(self) -> dict[str, float]:
        return {"accuracy": self.accuracy, "auc": self.auc, "tpr_at_1fpr": self.tpr_at_1fpr}


def label_matched_nonmembers(member_labels: np.ndarray, pool_labels: np.ndarray,
                             seed: int | np.random.Generator) -> np.ndarray:
    """Indices into the pool of non-members, one per member, with the member's label:
    ``pool_labels[result] == member_labels``. Per label, pool samples are drawn without
    replacement while there are enough, and the shortfall with replacement."""
    member_labels, pool_labels = np.asarray(member_labels), np.asarray(pool_labels)
    if member_labels.ndim != 1 or pool_labels.ndim != 1:
        raise ValueError("member_labels and pool_labels must be 1-D label arrays")
    rng = np.random.default_rng(seed)
    chosen = np.empty(len(member_labels), dtype=np.int64)
    for label in np.unique(member_labels):
        slots = np.flatnonzero(member_labels == label)
        candidates = np.flatnonzero(pool_labels == label)
        if len(candidates) == 0:
            raise ValueError(f"the non-member pool has no sample with label {label}; "
                             f"label-matched non-members cannot be drawn")
        distinct = rng.permutation(candidates)[:len(slots)]
        shortfall = rng.choice(candidates, size=len(slots) - len(distinct), replace=True)
        chosen[slots] = np.concatenate([distinct, shortfall])
    return chosen


def result_from_scores(name: str, member_scores: np.ndarray, nonmember_scores: np.ndarray,
                       accuracy: float | None = None) -> AttackResult:
    """ROC, AUC and TPR at 1% FPR of membership scores. Without ``accuracy``, the attack accuracy
    is the best balanced accuracy over all thresholds — chosen on the evaluated samples, so an
    upper bound on what an attacker who must fix the threshold beforehand achieves."""
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        raise ValueError("a membership attack needs at least one member and one non-member")
    scores = np.concatenate([member_scores, nonmember_scores])
    is_member = np.concatenate([np.ones(len(member_scores)), np.zeros(len(nonmember_scores))])
    fpr, tpr, _ = roc_curve(is_member, scores, drop_intermediate=False)
    if accuracy is None:
        accuracy = float(((tpr + 1.0 - fpr) / 2.0).max())
    return AttackResult(name, accuracy, float(roc_auc_score(is_member, scores)),
                        float(tpr[fpr <= LOW_FPR].max()), fpr, tpr, np.asarray(member_scores),
                        np.asarray(nonmember_scores))


def _balanced_accuracy(members_flagged: np.ndarray, nonmembers_flagged: np.ndarray) -> float:
    return float((members_flagged.mean() + (1.0 - nonmembers_flagged.mean())) / 2.0)


def _require_samples(**splits: Tensors) -> None:
    for name, data in splits.items():
        if len(data) == 0:
            raise ValueError(f"{name} is empty; a membership attack needs samples on both sides")


def logit_scaled_confidence(model: nn.Module, data: Tensors) -> np.ndarray:
    """φ = log(p_y / (1 − p_y)) per sample, computed from the logits as z_y − logsumexp_{j≠y} z_j
    in float64. p_y itself rounds to exactly 1 for confidently memorised samples (float32 at a
    logit margin of about 17), which would tie the very members an attack should rank first."""
    logits = predict_logits(model, data.x).double()
    labels = data.y.to(logits.device).view(-1, 1)
    true_logit = logits.gather(1, labels).squeeze(1)
    other_logits = logits.scatter(1, labels, float("-inf")).logsumexp(1)
    return (true_logit - other_logits).cpu().numpy()


def logit_scaled_confidences(model: nn.Module, data: Tensors) -> np.ndarray:
    """(N, C): φ of every sample on every label, z_c − logsumexp_{j≠c} z_j in float64, from one
    forward pass (``logit_scaled_confidence`` reads the column of each sample's own label)."""
    logits = predict_logits(model, data.x).double()
    classes = logits.shape[1]
    eye = torch.eye(classes, dtype=torch.bool, device=logits.device)
    others = logits[:, None, :].expand(-1, classes, -1).masked_fill(eye, float("-inf")).logsumexp(2)
    return (logits - others).cpu().numpy()


def true_label_log_probs(model: nn.Module, data: Tensors) -> np.ndarray:
    """log p_y per sample (= −per-sample cross-entropy), as −log(1 + e^−φ) from
    ``logit_scaled_confidence``: resolved down to losses of 1e-300 instead of rounding to 0."""
    return -np.logaddexp(0.0, -logit_scaled_confidence(model, data))


def attack_features(model: nn.Module, data: Tensors) -> np.ndarray:
    """Shadow-attack features per sample: the softmax vector sorted in decreasing order (so one
    classifier serves all classes) followed by the confidence on the true label."""
    probs = predict_logits(model, data.x).softmax(1)
    labels = data.y.to(probs.device).view(-1, 1)
    sorted_probs = probs.sort(dim=1, descending=True).values
    return torch.cat([sorted_probs, probs.gather(1, labels)], dim=1).cpu().numpy()


def confidence_attack(model: nn.Module, members: Tensors, nonmembers: Tensors) -> AttackResult:
    """Song & Mittal: score = softmax confidence on the true label, ranked through its logit
    φ = log(p_y / (1 − p_y)) (monotone in p_y, so the same ROC, but without ties at p_y = 1)."""
    _require_samples(members=members, nonmembers=nonmembers)
    return result_from_scores("confidence", logit_scaled_confidence(model, members),
                              logit_scaled_confidence(model, nonmembers))


def loss_attack(model: nn.Module, members: Tensors, nonmembers: Tensors,
                loss_threshold: float | None = None) -> AttackResult:
    """Yeom et al.: score = −per-sample cross-entropy. With ``loss_threshold`` (Yeom: the model's
    mean training cross-entropy) the accuracy is that of "member iff loss < threshold"; without it,
    the best threshold's."""
    _require_samples(members=members, nonmembers=nonmembers)
    member_scores = true_label_log_probs(model, members)
    nonmember_scores = true_label_log_probs(model, nonmembers)
    accuracy = None
    if loss_threshold is not None:
        accuracy = _balanced_accuracy(-member_scores < loss_threshold, -nonmember_scores < loss_threshold)
    return result_from_scores("loss", member_scores, nonmember_scores, accuracy)


def shadow_attack(model: nn.Module, members: Tensors, nonmembers: Tensors, shadow_model: nn.Module,
                  shadow_in: Tensors, shadow_out: Tensors) -> AttackResult:
    """Shokri et al.: fit a standardised logistic-regression attack classifier on the shadow
    model's features (``attack_features``) for ``shadow_in`` (its training data) vs ``shadow_out``
    (data it never saw), then score the target model's members and non-members. The accuracy is
    the classifier's own decision (log-odds > 0), nothing tuned on the target samples."""
    _require_samples(members=members, nonmembers=nonmembers, shadow_in=shadow_in, shadow_out=shadow_out)
    train_features = np.concatenate([attack_features(shadow_model, shadow_in),
                                     attack_features(shadow_model, shadow_out)])
    train_is_member = np.concatenate([np.ones(len(shadow_in)), np.zeros(len(shadow_out))])
    member_features = attack_features(model, members)
    if member_features.shape[1] != train_features.shape[1]:
        raise ValueError(f"shadow model has {train_features.shape[1] - 1} classes, target model "
                         f"{member_features.shape[1] - 1}; they must share the output space")
    classifier = make_pipeline(StandardScaler(),
                               LogisticRegression(max_iter=1000, class_weight="balanced"))
    classifier.fit(train_features, train_is_member)
    # Log-odds rather than probabilities: probabilities round to 1 for the clearest members and
    # would tie them at the low-FPR end of the ROC.
    member_scores = classifier.decision_function(member_features)
    nonmember_scores = classifier.decision_function(attack_features(model, nonmembers))
    return result_from_scores("shadow", member_scores, nonmember_scores,
                              _balanced_accuracy(member_scores > 0, nonmember_scores > 0))


def run_population_attacks(model: nn.Module, members: Tensors, nonmembers: Tensors,
                           shadow: ShadowSetup | None = None, *,
                           loss_threshold: float | None = None) -> dict[str, AttackResult]:
    """Confidence and loss attacks, plus the shadow attack when ``shadow`` = (shadow model,
    shadow-in data, shadow-out data) is given. Keyed by attack name."""
    results = {"confidence": confidence_attack(model, members, nonmembers),
               "loss": loss_attack(model, members, nonmembers, loss_threshold)}
    if shadow is not None:
        shadow_model, shadow_in, shadow_out = shadow
        results["shadow"] = shadow_attack(model, members, nonmembers, shadow_model, shadow_in, shadow_out)
    return results


def worst_case_auc(results: Mapping[str, AttackResult]) -> float:
    """Highest AUC over the attacks: the worst case for privacy. (An AUC below 0.5 means the
    attack's direction does not fit this model, e.g. a label-mix confound, not extra privacy.)"""
    if not results:
        raise ValueError("worst_case_auc needs at least one attack result")
    return max(result.auc for result in results.values())


def attack_metrics(results: Mapping[str, AttackResult]) -> dict[str, float]:
    """Flat metrics for a results row: ``mia_<attack>_<accuracy|auc|tpr_at_1fpr>`` and
    ``mia_auc`` (the worst case, the key ``gaps_to_reference`` compares by default)."""
    metrics = {f"mia_{name}_{key}": value for name, result in results.items()
               for key, value in result.summary().items()}
    metrics["mia_auc"] = worst_case_auc(results)
    return metrics


def lira_scores(target_phi: np.ndarray, shadow_phi: np.ndarray, shadow_included: np.ndarray, *,
                fixed_variance: bool = True) -> np.ndarray:
    """Per-example log-likelihood ratio log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²).

    ``target_phi``: (n,) logit-scaled confidences of the audited model; ``shadow_phi``: (M, n)
    the same under M shadow models; ``shadow_included``: (M, n) whether shadow m had example i
    "in". Every example needs at least one "in" and one "out" shadow. ``fixed_variance`` pools
    each side's variance over all examples while keeping per-example means; Carlini et al.
    recommend it below about 64 shadows, and with a handful a per-example variance is mostly
    noise (docs/methods.md, "The statistics behind the gates and the audit")."""
    shadow_phi = np.asarray(shadow_phi, dtype=np.float64)
    included = np.asarray(shadow_included, dtype=bool)
    if shadow_phi.shape != included.shape or shadow_phi.shape[1:] != np.shape(target_phi):
        raise ValueError(f"shape mismatch: target {np.shape(target_phi)}, shadow φ {shadow_phi.shape}, "
                         f"membership {included.shape}")

    def log_density(side: np.ndarray) -> np.ndarray:
        count = side.sum(axis=0)
        if (count == 0).any():
            raise ValueError("every example needs at least one 'in' and one 'out' shadow model")
        mean = (shadow_phi * side).sum(axis=0) / count
        squared_deviation = ((shadow_phi - mean) ** 2 * side).sum(axis=0)
        if fixed_variance:
            variance = np.full_like(mean, squared_deviation.sum() / max(count.sum() - len(count), 1))
        else:
            variance = squared_deviation / np.maximum(count - 1, 1)
        std = np.maximum(np.sqrt(variance), MIN_STD)
        # The Gaussian's constant −½log(2π) cancels in the ratio.
        return -0.5 * ((target_phi - mean) / std) ** 2 - np.log(std)

    return log_density(included) - log_density(~included)


def ulira_audit(train_fn: TrainFn, candidates: Tensors, num_pairs: int, *, seed: int = 0,
                fixed_variance: bool = True) -> AttackResult:
    """U-LiRA audit over ``candidates``.

    ``train_fn(include_mask, seed)`` must return the model the pipeline under audit produces when
    ``candidates[include_mask]`` were trained on *and then unlearned*, while the other candidates
    were never trained on; everything else is fixed except the training randomness, which
    ``seed`` sets (shadow models must differ in it as well as in membership). For an audit of
    plain training (LiRA), let it train on the included candidates and not unlearn them.

    ``2 · num_pairs`` models are trained on complementary random halves of the candidates, so each
    candidate is "in" for exactly ``num_pairs`` of them. Each model in turn is the audited target
    and the models of the other pairs its shadows, so every candidate is scored against exactly
    ``num_pairs − 1`` "in" and ``num_pairs − 1`` "out" shadows. (Leaving only the target out, as
    Carlini et al. do with many shadows, would give the target's own side one shadow fewer; with
    few shadows that asymmetry alone pushes the AUC of a perfect unlearner well below 0.5.) The
    result pools ``2 · num_pairs · len(candidates)`` decisions, half unlearned and half never
    seen; AUC ≈ 0.5 means the unlearned examples are indistinguishable from unseen ones.
    Cost: ``2 · num_pairs`` runs of ``train_fn``. ``fixed_variance``: see ``lira_scores``.
    """
    if num_pairs < 2:
        raise ValueError("ulira_audit needs num_pairs >= 2 so that every candidate keeps an 'in' and "
                         "an 'out' shadow model when one pair holds the target")
    if len(candidates) < 2:
        raise ValueError("ulira_audit needs at least two candidates to split into halves")
    rng = np.random.default_rng(seed)
    masks = []
    for _ in range(num_pairs):
        half = np.zeros(len(candidates), dtype=bool)
        half[rng.permutation(len(candidates))[:len(candidates) // 2]] = True
        masks += [half, ~half]
    included = np.stack(masks)
    model_seeds = rng.integers(0, 2**31 - 1, size=len(included))
    phi = np.stack([logit_scaled_confidence(train_fn(mask.copy(), int(model_seed)), candidates)
                    for mask, model_seed in zip(included, model_seeds)])
    target_scores, target_included = [], []
    pair_of_model = np.arange(len(included)) // 2
    for target in range(len(included)):
        shadows = pair_of_model != pair_of_model[target]
        target_scores.append(lira_scores(phi[target], phi[shadows], included[shadows],
                                         fixed_variance=fixed_variance))
        target_included.append(included[target])
    scores, was_included = np.concatenate(target_scores), np.concatenate(target_included)
    return result_from_scores("ulira", scores[was_included], scores[~was_included])
