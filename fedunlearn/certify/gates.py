"""The gates: whether an unlearned model version may become ``current``.

Each metric is judged with its uncertainty (``evaluation.uncertainty``; DESIGN.md §6 and §8), so a
metric over a handful of forgotten samples neither fails on noise nor passes on nothing. A check
answers ``fail`` when the evidence excludes its limit at level ``alpha`` (default 0.05, the
false-reject rate for a model that meets it, e.g. an exact retrain), ``pass`` when it excludes the
other side, else ``inconclusive``; the gate fails when a check fails and passes when all pass. Two
policies, each also requiring a certificate class in ``allowed_certificates``: **vs retrained
reference** — paired gaps of test accuracy, forget accuracy and attack AUC within ``tolerance``;
**without reference** — the source model's test accuracy kept, forget accuracy not far above test
accuracy, attack AUCs near chance, and a pass the source model gets too turned ``inconclusive``.
The worst of the three membership attacks is reported, so each is judged at α/3 [1]_. A
certificate that proves the forgetting needs no statistical evidence: only a ``fail`` holds it back.

This is the strict verdict; ``judge`` records the interim tier's reading of the same checks beside
it, and that rule is ``certify.tiers``' (``interim_judgement``). Every limit, class requests and
backdoors: DESIGN.md §6 and §8.

References
----------
.. [1] Dunn (1961), "Multiple Comparisons Among Means", JASA: the Bonferroni correction.
"""

from __future__ import annotations

from enum import Enum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.certify.certificate import EMPIRICAL_ONLY, EXACT_RETRAIN, FORMAL, GUARANTEES, NOT_CERTIFIED
from fedunlearn.certify.gate_records import (AUDIT_CHECK, NO_OP_CHECK, PER_SAMPLE_CHECK, POPULATION_MIA_CHECK,
                                             WITH_REFERENCE, WITHOUT_REFERENCE, GateCheck, GateOutcome)
from fedunlearn.certify.tiers import interim_judgement
from fedunlearn.evaluation.records import Evaluation
from fedunlearn.evaluation.uncertainty import (DEFAULT_ALPHA, FAIL, INCONCLUSIVE, PASS, Check, check_auc,
                                               check_auc_gap, check_paired_proportion_gap, check_proportion,
                                               judge_at_most, paired_proportion_difference_interval,
                                               proportion_difference_interval)

Guarantee = Enum("Guarantee", {g: g for g in GUARANTEES}, type=str)
PROVEN = (FORMAL, EXACT_RETRAIN)  # certificates that prove the forgetting itself
class Gates(BaseModel):
    """Tolerances on the gaps to the retrained model; ``None`` switches a check off."""

    model_config = ConfigDict(extra="forbid")

    max_test_acc_gap: float | None = Field(0.02, ge=0, description="max |test_acc − retrain test_acc|")
    max_forget_acc_gap: float | None = Field(0.05, ge=0, description="max |forget_acc − retrain forget_acc|")
    max_mia_auc_gap: float | None = Field(0.05, ge=0, description="max |MIA AUC − retrain MIA AUC|")
    max_backdoor_asr: float | None = Field(0.10, ge=0, le=1, description="max backdoor attack success rate "
                                                                          "(when the original carried one)")
    mia_metric: str = Field("mia_auc", description="the MIA figure reported (the worst of the attacks)")
    alpha: float = Field(DEFAULT_ALPHA, gt=0, lt=0.5, description="false-reject rate of every check: the chance "
                                                                 "that a model within the limits fails one")


class PromotionGates(Gates):
    """When an unlearned version may become ``current`` (module docstring): the tolerances against
    a retrained reference, or — without one — the limits against the source model and chance."""

    allowed_certificates: list[Guarantee] = Field(
        default_factory=lambda: [Guarantee(g) for g in GUARANTEES if g != NOT_CERTIFIED],
        description="certificate classes an unlearned version may be promoted with")
    max_test_acc_drop: float | None = Field(0.02, ge=0, description="without reference: max source test_acc − "
                                                                    "test_acc")
    max_forget_acc_excess: float | None = Field(0.05, ge=0, description="without reference: max forget_acc − "
                                                                        "test_acc")
    max_mia_auc_excess: float | None = Field(0.05, ge=0, description="without reference: max MIA AUC − 0.5")
    max_forgotten_class_acc: float | None = Field(0.15, ge=0, le=1, description="class requests: max accuracy on the "
                                                  "removed classes' test samples and forget set (retrain: 0)")


def _unmeasured(name: str, limit: float) -> GateCheck:
    return GateCheck(name=name, value=None, limit=limit, passed=False, verdict=INCONCLUSIVE)


def _worst_attack(name: str, checks: list[Check]) -> GateCheck:
    """One gate check from the per-attack checks: the highest estimate, the worst verdict."""
    worst = max(checks, key=lambda c: c.estimate)
    verdicts = {c.verdict for c in checks}
    verdict = FAIL if FAIL in verdicts else PASS if verdicts == {PASS} else INCONCLUSIVE
    return GateCheck.of(worst).model_copy(update={"name": name, "verdict": verdict, "passed": verdict == PASS})


def _attacks(candidate: Evaluation) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {name: (a.member_scores, a.nonmember_scores) for name, a in candidate.evidence.attacks.items()
            if a.member_scores is not None and len(a.member_scores)}


def with_reference(candidate: Evaluation, reference: Evaluation, gates: Gates) -> list[GateCheck]:
    """The checks against the retrained model on the same samples."""
    mine, theirs = candidate.evidence.correct, reference.evidence.correct
    test = "remaining_classes_test" if "remaining_classes_test" in mine else "test"
    checks = []
    for key, limit in ((test, gates.max_test_acc_gap), ("forget", gates.max_forget_acc_gap)):
        if limit is None:
            continue
        name = f"abs_gap_{key}_acc"
        if len(mine.get(key, [])) and len(theirs.get(key, [])):
            checks.append(GateCheck.of(check_paired_proportion_gap(name, mine[key], theirs[key], limit,
                                                                   alpha=gates.alpha)))
        else:
            checks.append(_unmeasured(name, limit))
    if gates.max_mia_auc_gap is not None:
        name, attacks, reference_attacks = f"abs_gap_{gates.mia_metric}", _attacks(candidate), _attacks(reference)
        shared = [a for a in attacks if a in reference_attacks]
        per_attack = [check_auc_gap(name, *attacks[a], *reference_attacks[a], gates.max_mia_auc_gap, paired=True,
                                    alpha=gates.alpha / len(shared)) for a in shared]
        checks.append(_worst_attack(name, per_attack) if per_attack else _unmeasured(name, gates.max_mia_auc_gap))
    return checks


def without_reference(candidate: Evaluation, source: Evaluation, gates: PromotionGates,
                      atypical: int = 0) -> list[GateCheck]:
    """The checks against the source model and chance (module docstring); with ``atypical`` forget
    samples, no population attack (``judge``)."""
    mine, alpha = candidate.evidence.correct, gates.alpha
    class_removal = "forgotten_classes_test" in mine
    test = "remaining_classes_test" if class_removal else "test"
    checks = []
    if gates.max_test_acc_drop is not None:
        name = f"{test}_acc_drop_vs_source"
        before, after = source.evidence.correct.get(test, np.zeros(0, bool)), mine.get(test, np.zeros(0, bool))
        if len(before) and len(before) == len(after):
            drop = judge_at_most(name, float(before.mean() - after.mean()),
                                 lambda level: paired_proportion_difference_interval(before, after, confidence=level),
                                 gates.max_test_acc_drop, n=len(after), method="newcombe-paired", alpha=alpha)
            checks.append(GateCheck.of(drop))
        else:
            checks.append(_unmeasured(name, gates.max_test_acc_drop))
    if class_removal:
        if gates.max_forgotten_class_acc is not None:
            for key in ("forgotten_classes_test", "forget"):
                hits = mine.get(key, [])
                checks.append(GateCheck.of(check_proportion(f"{key}_acc", int(np.sum(hits)), len(hits),
                                                            gates.max_forgotten_class_acc, alpha=alpha / 2))
                              if len(hits) else _unmeasured(f"{key}_acc", gates.max_forgotten_class_acc))
    elif gates.max_forget_acc_excess is not None:
        name, forget, test_hits = "forget_acc_minus_test_acc", mine.get("forget", []), mine.get("test", [])
        if len(forget) and len(test_hits):
            k_f, n_f, k_t, n_t = int(np.sum(forget)), len(forget), int(np.sum(test_hits)), len(test_hits)
            excess = judge_at_most(name, k_f / n_f - k_t / n_t,
                                   lambda level: proportion_difference_interval(k_f, n_f, k_t, n_t, confidence=level),
                                   gates.max_forget_acc_excess, n=n_f + n_t, method="newcombe-hybrid-score",
                                   alpha=alpha)
            checks.append(GateCheck.of(excess))
        else:
            checks.append(_unmeasured(name, gates.max_forget_acc_excess))
    if gates.max_mia_auc_excess is not None and not atypical:
        name, attacks = POPULATION_MIA_CHECK, _attacks(candidate)
        per_attack = [check_auc(name, *scores, 0.5 + gates.max_mia_auc_excess, alpha=alpha / len(attacks))
                      for scores in attacks.values()]
        check = _worst_attack(name, per_attack) if per_attack else _unmeasured(name, gates.max_mia_auc_excess)
        if per_attack:  # reported as the excess over chance, like its limit
            check = check.model_copy(update={"value": check.value - 0.5, "limit": gates.max_mia_auc_excess,
                                             "interval": [b - 0.5 for b in check.interval]})
        checks.append(check)
    return checks


def above_chance(candidate: Evaluation, gates: Gates) -> list[GateCheck]:
    """Class requests, in both policies and whatever the certificate claims: a forgotten-classes
    split (its test samples, the forget set) predicted as its labels at a rate shown above chance
    1/C — the lower end of its interval above it — fails: the request is not served as forgotten.
    Otherwise the check passes and leaves the judgement to the limits on forgetting itself. It
    refuses on evidence only: a model that no longer recognises the classes scores near chance, so
    ``inconclusive`` there would hold back exactly what the request asks for."""
    mine, classes = candidate.evidence.correct, candidate.evidence.num_classes
    if "forgotten_classes_test" not in mine or not classes:
        return []
    checks = []
    for key in ("forgotten_classes_test", "forget"):
        hits = mine.get(key, [])
        if len(hits):
            check = check_proportion(f"{key}_acc_above_chance", int(np.sum(hits)), len(hits), 1 / classes,
                                     alpha=gates.alpha / 2)
            verdict = FAIL if check.verdict == FAIL else PASS
            checks.append(GateCheck.of(check).model_copy(update={"verdict": verdict, "passed": verdict == PASS}))
    return checks


def backdoor_check(candidate: Evaluation, gates: Gates) -> list[GateCheck]:
    hits = candidate.evidence.backdoor_hits
    if hits is None or gates.max_backdoor_asr is None:
        return []
    return [GateCheck.of(check_proportion("bd_asr", int(hits.sum()), len(hits), gates.max_backdoor_asr,
                                          alpha=gates.alpha))]


def judge(candidate: Evaluation, certificate: str, *, source: Evaluation, reference: Evaluation | None,
          gates: PromotionGates, audit: Check | None = None, source_audit: Check | None = None,
          audit_equivalence: Check | None = None, atypical: int = 0,
          per_sample: Check | None = None) -> GateOutcome:
    """The gate outcome of an unlearned model: against ``reference`` when there is one, else
    against ``source`` and chance; the certificate class and the per-example audit (``audit``:
    pass = forgotten, fail = not forgotten) in both. Without a reference, a pass also needs the
    checks to tell forgetting from none: the source model itself — no unlearning at all, its own
    audit ``source_audit`` — is judged the same way, and if it passes too, the candidate's pass
    shows nothing (the model generalises to the forget set, or the sample is too small to see a
    difference): ``inconclusive``, check ``power_vs_no_op``. The interim judgement
    (``tiers.interim_judgement``) is recorded beside the strict verdict, with ``audit_equivalence``
    and ``per_sample``. ``atypical``: how
    many forget samples carry a label the audit's references reject (``AuditResult.atypical``:
    mislabelled rows, rare shapes); a population attack would compare them with typical non-members,
    so its check stays out of the verdict (the audit compares them with never-seen pairs of their
    difficulty)."""
    outcome = _judged(candidate, certificate, source, reference, gates, audit, atypical)
    no_op = _judged(source, certificate, source, reference if _paired(source, reference) else None, gates,
                    source_audit, atypical)
    if reference is None and outcome.verdict == PASS and not _proven(certificate, gates) and no_op.verdict == PASS:
        powerless = GateCheck(name=NO_OP_CHECK, value="the source model (no unlearning) passes these checks too",
                              limit=None, passed=False, verdict=INCONCLUSIVE)
        outcome = GateOutcome.of(outcome.policy, outcome.checks + [powerless])
    judged = interim_judgement(outcome, certificate, no_op, audit_equivalence, per_sample)
    if atypical and reference is None and gates.max_mia_auc_excess is not None:
        judged.unmeasured.append(f"{POPULATION_MIA_CHECK} left out: {atypical} forget sample(s) carry a label models "
                                 "that never saw them reject, which a population attack compares with typical "
                                 "non-members (the per-example audit compares them with never-seen pairs of their "
                                 "difficulty)")
    return judged


def judge_source(source: Evaluation, *, reference: Evaluation | None, gates: PromotionGates,
                 source_audit: Check | None = None, atypical: int = 0) -> GateOutcome:
    """The source model (no unlearning) judged by the checks a candidate meets: what the batch's
    checks can measure. A check it fails has power; one it passes cannot tell forgetting from none."""
    return _judged(source, EMPIRICAL_ONLY, source, reference if _paired(source, reference) else None, gates,
                   source_audit, atypical)


def _paired(source: Evaluation, reference: Evaluation | None) -> bool:
    """Whether the source and the reference were evaluated on the same samples (the batch's sets)."""
    if reference is None:
        return False
    mine, theirs = source.evidence.correct, reference.evidence.correct
    return all(len(mine.get(key, [])) == len(theirs.get(key, [])) for key in set(mine) | set(theirs))


def _proven(certificate: str, gates: PromotionGates) -> bool:
    return certificate in PROVEN and certificate in [g.value for g in gates.allowed_certificates]


def _judged(candidate: Evaluation, certificate: str, source: Evaluation, reference: Evaluation | None,
            gates: PromotionGates, audit: Check | None, atypical: int = 0) -> GateOutcome:
    allowed = [g.value for g in gates.allowed_certificates]
    checks = [GateCheck(name="certificate", value=certificate, limit=allowed, passed=certificate in allowed,
                        verdict=PASS if certificate in allowed else FAIL)]
    if reference is not None:
        policy, checks = WITH_REFERENCE, checks + with_reference(candidate, reference, gates)
    else:
        policy, checks = WITHOUT_REFERENCE, checks + without_reference(candidate, source, gates, atypical)
    audited = [GateCheck.of(audit).model_copy(update={"name": AUDIT_CHECK})] if audit is not None else []
    return GateOutcome.of(policy, checks + above_chance(candidate, gates) + backdoor_check(candidate, gates) + audited,
                          proven=_proven(certificate, gates))


__all__ = ["Gates", "GateCheck", "GateOutcome", "PromotionGates", "WITH_REFERENCE", "WITHOUT_REFERENCE", "NO_OP_CHECK",
           "AUDIT_CHECK", "PER_SAMPLE_CHECK", "judge", "judge_source"]
