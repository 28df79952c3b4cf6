"""A gate outcome as the receipt, the registry and the status record it: every check with its
verdict, and the interim tier's reading beside the strict one. The strict checks are
``certify.gates``'; whether a version serves on either tier, and the interim judgement, are
``certify.tiers``'."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from fedunlearn.evaluation.uncertainty import FAIL, INCONCLUSIVE, PASS, WITHIN, Check

WITH_REFERENCE = "vs retrained reference"
WITHOUT_REFERENCE = "without reference"
POPULATION_MIA_CHECK = "mia_auc_minus_chance"
NO_OP_CHECK = "power_vs_no_op"
AUDIT_CHECK = "forget_audit"
PER_SAMPLE_CHECK = "forget_audit_per_sample"


class GateCheck(BaseModel):
    """One check as the receipt records it; ``passed`` is ``verdict == "pass"``."""

    name: str
    value: float | str | None
    limit: float | list[str] | None
    passed: bool
    verdict: str = PASS
    interval: list[float] | None = None
    n: int | None = None
    alpha: float | None = None
    rule_within: bool = Field(False, description="the check is |AUC − 0.5| ≤ limit (two-sided equivalence)")

    @classmethod
    def of(cls, check: Check) -> "GateCheck":
        value = None if math.isnan(check.estimate) else check.estimate
        return cls(name=check.name, value=value, limit=check.limit, passed=check.passed, verdict=check.verdict,
                   interval=list(check.interval), n=check.n, alpha=check.alpha, rule_within=check.rule == WITHIN)


class GateOutcome(BaseModel):
    passed: bool
    policy: str = Field(description=f"{WITH_REFERENCE!r} or {WITHOUT_REFERENCE!r}")
    checks: list[GateCheck]
    verdict: str = PASS
    interim: bool | None = Field(None, description="may serve on the interim tier (module docstring); None: "
                                                   "not judged")
    unmeasured: list[str] = Field(default_factory=list, description="what could not be measured, and why")
    held_back: list[str] = Field(default_factory=list, description="why the interim tier refused the version")
    audit_equivalence: GateCheck | None = Field(None, description="the audit as the interim tier read it: "
                                                "|AUC − 0.5| within a margin sized to its counts")
    per_sample: GateCheck | None = Field(None, description="the audit per forget sample, as the interim tier read "
                                         "it: no sample shown remembered or over-forgotten")

    def interim_checks(self) -> list[GateCheck]:
        """The checks as the interim tier read them — the reading that decided there: the audit as
        equivalence in place of the one-sided reading, and the per-sample evidence after it."""
        checks = [self.audit_equivalence.model_copy(update={"name": AUDIT_CHECK})
                  if c.name == AUDIT_CHECK and self.audit_equivalence is not None else c for c in self.checks]
        return checks + ([self.per_sample] if self.per_sample is not None else [])

    def deciding_checks(self, interim_tier: bool) -> list[GateCheck]:
        """The checks that decided: the interim tier's reading where it judged (``interim_tier``), else
        the strict one."""
        return self.interim_checks() if interim_tier and self.interim is not None else self.checks

    @classmethod
    def of(cls, policy: str, checks: list[GateCheck], proven: bool = False) -> "GateOutcome":
        """``proven``: the certificate proves the forgetting, so only a ``fail`` holds the version back."""
        verdicts = {c.verdict for c in checks}
        verdict = FAIL if FAIL in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts and not proven else PASS
        if proven and INCONCLUSIVE in verdicts and verdict == PASS:
            policy += " (forgetting proven by the certificate: inconclusive checks do not hold it back)"
        return cls(passed=verdict == PASS, policy=policy, checks=checks, verdict=verdict)


__all__ = ["AUDIT_CHECK", "NO_OP_CHECK", "PER_SAMPLE_CHECK", "POPULATION_MIA_CHECK", "WITH_REFERENCE",
           "WITHOUT_REFERENCE", "GateCheck", "GateOutcome"]
