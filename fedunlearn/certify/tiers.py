"""Two tiers of forgetting: interim at once, exact before each request's deadline.

On a model that does not memorise, no black-box test separates forgetting from a no-op, so a
policy of "escalate until a check passes" retrains every batch. The contract instead:

* **interim** — an approximate version serves as ``current`` at once when the interim judgement
  (``interim_judgement``) allows it: no check fails, utility holds, the certificate is not ``not
  certified``, every inconclusive check is one the source model does not fail either, the
  per-example audit read as equivalence with never-seen samples [1]_ and per forget sample, and
  what could not be measured is said;
* **exact** — every request forgotten only on the interim tier is owed an exact retrain (or a
  ``formal (ε,δ)`` version) before its deadline. One exact retrain on a data version without the
  requests repays every batch since the last one; it is scheduled at the latest safe time
  (``latest_safe_time``), and a batch that finds that time passed repays at once.

``strict`` keeps the earlier behaviour: escalate until the strict verdict (``certify.gates``) is
``pass``, the exact retrain at worst. The interim judgement, whether an attempt may serve
(``serves``), whether it ends a batch's escalation (``stops``) and how the verdict reads on the tier
that decided (``tier_reading``) are decided here, and nowhere else. Pure functions; the flows
schedule and record.

References
----------
.. [1] Schuirmann (1987), "A Comparison of the Two One-Sided Tests Procedure and the Power
   Approach for Assessing the Equivalence of Average Bioavailability", Journal of
   Pharmacokinetics and Biopharmaceutics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import Enum

from fedunlearn.certify.certificate import EXACT_RETRAIN, FORMAL, NOT_CERTIFIED
from fedunlearn.certify.gate_records import AUDIT_CHECK, NO_OP_CHECK, PER_SAMPLE_CHECK, GateCheck, GateOutcome
from fedunlearn.config import ForgettingPolicy
from fedunlearn.evaluation.uncertainty import FAIL, INCONCLUSIVE, PASS, Check


class Tier(str, Enum):
    """The MLflow version tag ``forgetting`` and the receipt field of the same name."""

    interim = "interim"
    exact = "exact"
    formal = "formal"


def tier_of(certificate: str | None) -> Tier:
    """``exact retrain`` is exact, ``formal (ε,δ)`` formal (exact enough for a deadline), the rest interim."""
    return Tier.exact if certificate == EXACT_RETRAIN else Tier.formal if certificate == FORMAL else Tier.interim


def owes_exact(certificate: str | None) -> bool:
    return tier_of(certificate) is Tier.interim


def serves(gate_passed: bool, interim_allowed: bool | None, policy: ForgettingPolicy) -> bool:
    """Whether a gated attempt may become ``current`` under ``policy``."""
    return gate_passed or (policy is ForgettingPolicy.interim and bool(interim_allowed))


def stops(gates: GateOutcome, forgetting: ForgettingPolicy, exact_in_hand: bool = False) -> bool:
    """Whether an attempt ends the escalation: it may serve under the forgetting policy. With an exact
    retrain of the batch's data version already in hand (``process --retrain``), only a pass ends it:
    serving an approximate version would leave owed what is already paid for."""
    if exact_in_hand:
        return gates.passed
    return serves(gates.passed, gates.interim, forgetting)


def tier_reading(verdict: str, interim: bool | None, interim_tier: bool) -> str:
    """What the gates said of an attempt, on the tier that decided: where the interim tier judged it
    (``interim`` not None on an interim-tier batch), whether it serves there beside the strict verdict."""
    if interim_tier and interim is not None:
        return f"interim: {'serves' if interim else 'held back'}; strict: {verdict}"
    return verdict


UTILITY_CHECKS = ("test_acc_drop_vs_source", "remaining_classes_test_acc_drop_vs_source", "abs_gap_test_acc",
                  "abs_gap_remaining_classes_test_acc")


def interim_judgement(outcome: GateOutcome, certificate: str, no_op: GateOutcome,
                      audit_equivalence: Check | None = None, per_sample: Check | None = None) -> GateOutcome:
    """``outcome`` with its interim judgement (module docstring): what holds the version back on
    the interim tier, and what could not be measured. ``no_op``: the source model judged by the
    same checks — a check it fails has power, so the candidate must not be inconclusive there.
    ``audit_equivalence``: the audit read two-sidedly (``AuditResult.equivalence_check``); where
    given, it stands in for the one-sided ``forget_audit`` check on this tier. ``per_sample``: the
    audit per forget sample (``AuditResult.per_sample_check``): a sample shown remembered or
    over-forgotten holds the version back, whatever the forget set's AUC averages; where it passes
    (every sample the source remembered shown back), an inconclusive AUC does not hold it back — only
    an AUC shown outside the band does."""
    source_verdicts = {c.name: c.verdict for c in no_op.checks}
    equivalence = GateCheck.of(audit_equivalence) if audit_equivalence is not None else None
    sample_check = GateCheck.of(per_sample) if per_sample is not None else None
    held_back, unmeasured = [], []
    if certificate == NOT_CERTIFIED:
        held_back.append("certificate 'not certified': an assumption of its claim failed")
    read = outcome.model_copy(update={"audit_equivalence": equivalence, "per_sample": sample_check, "interim": False})
    samples_back = sample_check is not None and sample_check.verdict == PASS
    for check in read.interim_checks():
        reason = _interim_reason(check, source_verdicts.get(check.name))
        if samples_back and check.name == AUDIT_CHECK and check.verdict == INCONCLUSIVE and reason is not None:
            # Each sample the source remembered is shown back among never-seen pairs: finer evidence
            # than the forget set's AUC, whose band at this size cannot settle it either way.
            reason = UNMEASURED + (f"{AUDIT_CHECK} inconclusive; the per-sample evidence shows every sample the "
                                   "source remembered back among never-seen samples")
        if reason is not None:
            (unmeasured if reason.startswith(UNMEASURED) else held_back).append(reason.removeprefix(UNMEASURED))
    return read.model_copy(update={"interim": not held_back, "held_back": held_back, "unmeasured": unmeasured})


UNMEASURED = "unmeasured: "


def _interim_reason(check: GateCheck, source_verdict: str | None) -> str | None:
    """Why ``check`` holds a version back on the interim tier, or what it could not measure
    (prefixed ``UNMEASURED``), or None."""
    if check.name in UTILITY_CHECKS:
        # Retrains differ from the source by their own seed's spread, which a paired interval on a
        # small test set cannot always bound: utility holds back on evidence or an estimate beyond it.
        if check.verdict == INCONCLUSIVE:
            return (f"utility not shown: {check.name} inconclusive, its estimate beyond the limit {check.limit}"
                    if _beyond_limit(check) else None)
        return f"{check.name} fails" if check.verdict == FAIL else None
    if check.name == PER_SAMPLE_CHECK:
        return _per_sample_reason(check)
    if check.verdict == FAIL:
        if check.rule_within:
            side = "above" if check.value > 0.5 else "below"
            what = "remembered" if side == "above" else "over-forgotten: it stands out below never-seen samples"
            return f"{check.name} fails: AUC {check.value:.3f} shown {side} 0.5 ± {check.limit:.3f} ({what})"
        return f"{check.name} fails"
    if check.verdict != INCONCLUSIVE:
        return None
    if source_verdict == FAIL:
        return f"{check.name} inconclusive where the source model fails it (a measurable signal not shown gone)"
    if check.name == NO_OP_CHECK:
        return UNMEASURED + "no measurable membership signal: the source model passes the same checks"
    return UNMEASURED + (f"{check.name} inconclusive; the source model does not fail it either (nothing "
                         "measurable to remove)")


def _per_sample_reason(check: GateCheck) -> str | None:
    """The per-sample check on the interim tier: a flagged sample holds back; where the source
    remembers no sample, there is nothing per sample to show gone (unmeasured)."""
    if check.verdict == FAIL:
        return (f"{PER_SAMPLE_CHECK} fails: {check.value:.0f} of {check.n} forget sample(s) shown remembered or "
                "over-forgotten (each judged against never-seen samples)")
    if check.verdict == INCONCLUSIVE:
        return UNMEASURED + "no forget sample is shown remembered by the source model (nothing per sample to remove)"
    return None


def _beyond_limit(check: GateCheck) -> bool:
    value = check.value if isinstance(check.value, float) else math.nan
    return not math.isfinite(value) or abs(value) > check.limit if check.name.startswith("abs_gap") \
        else not math.isfinite(value) or value > check.limit


def exact_due(deadlines: Iterable[datetime]) -> datetime | None:
    """When exact forgetting is due for a set of requests: the earliest of their deadlines."""
    return min(deadlines, default=None)


def latest_safe_time(due: datetime, retrain_seconds: float, safety_factor: float, margin: timedelta) -> datetime:
    """The latest time an exact retrain may start and still serve before ``due``: the last exact
    retrain's measured duration times ``safety_factor`` before it, less ``margin``."""
    if retrain_seconds < 0 or safety_factor < 1:
        raise ValueError(f"retrain_seconds must be >= 0 and safety_factor >= 1 (got {retrain_seconds}, "
                         f"{safety_factor})")
    try:
        return due - timedelta(seconds=retrain_seconds * safety_factor) - margin
    except OverflowError:  # a deadline in year 1 (accepted before such deadlines were refused): start at once
        return datetime.min.replace(tzinfo=due.tzinfo)


def repay_now(safe_time: datetime | None, now: datetime) -> bool:
    """A batch repays at once when the latest safe time of what is owed has come."""
    return safe_time is not None and now >= safe_time


__all__ = ["ForgettingPolicy", "Tier", "tier_of", "owes_exact", "serves", "stops", "interim_judgement", "tier_reading",
           "exact_due", "latest_safe_time", "repay_now"]
