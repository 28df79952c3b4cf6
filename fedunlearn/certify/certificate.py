"""Certificates: which guarantee an unlearning run gives, with the numbers behind it.

A certificate never says a bare "certified". It names one guarantee class (DESIGN.md §5):

* ``formal (ε,δ)`` — a noisy Newton removal whose (ε, δ) bound holds under stated assumptions
  (certified decentralized unlearning: λ-strongly convex, L-Lipschitz, M-Lipschitz Hessian);
* ``constraint satisfied`` — FedORA: the final forget loss meets γ, dual variables reported;
* ``bounded approximation`` — HF-KCU: CG residual, damping and a condition estimate bound the step;
* ``empirical only`` — PUF and the baselines: only the evaluation against retrain speaks for it;
* ``exact retrain`` — the gold standard: retrained from scratch on the retained data only;
* ``not certified`` — what a claim is downgraded to when an assumption it rests on fails.

Never overclaim: a claim that rests on assumptions (every class but ``empirical only``) is issued
only if every assumption listed for the run holds, and ``formal (ε,δ)`` only if at least one is
listed at all; otherwise the certificate says ``not certified`` and why.

Whether an unlearned model version may be promoted is the gates' question (``certify.gates``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol

FORMAL = "formal (ε,δ)"
CONSTRAINT_SATISFIED = "constraint satisfied"
BOUNDED_APPROXIMATION = "bounded approximation"
EMPIRICAL_ONLY = "empirical only"
EXACT_RETRAIN = "exact retrain"
NOT_CERTIFIED = "not certified"
GUARANTEES = (FORMAL, CONSTRAINT_SATISFIED, BOUNDED_APPROXIMATION, EMPIRICAL_ONLY, EXACT_RETRAIN,
              NOT_CERTIFIED)

# Classes that do not rest on assumptions, so a failing assumption cannot make them an overclaim.
_ASSUMPTION_FREE = (EMPIRICAL_ONLY, NOT_CERTIFIED)


class Certified(Protocol):
    """What a certificate reads of a method (an ``UnlearningMethod`` class or instance)."""

    name: ClassVar[str]
    guarantee: ClassVar[str]


class CertificateInputs(Protocol):
    """What a certificate reads of a run (an ``Outcome``): the numbers its method recorded."""

    certificate_inputs: dict[str, Any]


@dataclass
class Certificate:
    """One per unlearning run. ``claimed`` is the method's class, ``guarantee`` what was issued."""

    method: str
    guarantee: str
    claimed: str
    scenario: str = ""
    request: dict[str, Any] = field(default_factory=dict)
    batch_id: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)
    assumptions: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("guarantee", "claimed"):
            if getattr(self, name) not in GUARANTEES:
                raise ValueError(f"unknown guarantee class {getattr(self, name)!r}; "
                                 f"choose one of {', '.join(GUARANTEES)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> "Certificate":
        return cls(**json.loads(text))


def certificate_for(method: type[Certified] | Certified, outcome: CertificateInputs, *,
                    scenario: str = "", request: dict[str, Any] | None = None, batch_id: str = "",
                    assumptions: dict[str, bool] | None = None) -> Certificate:
    """The certificate for one run of ``method`` (a registered class or an instance; a name is
    looked up with ``unlearning.get_method_class``).

    Numbers come from ``outcome.certificate_inputs``; its ``"assumptions"`` entry (a dict of
    name → bool checked by the method) is merged with ``assumptions`` checked by the caller
    (the caller's value wins). The method's guarantee class is downgraded if they do not hold.
    """
    cls = method if isinstance(method, type) else type(method)
    inputs = dict(outcome.certificate_inputs)
    checked = {**inputs.pop("assumptions", {}), **(assumptions or {})}
    checked = {name: bool(ok) for name, ok in checked.items()}
    guarantee, notes = _issued_guarantee(cls.guarantee, checked)
    return Certificate(method=cls.name, guarantee=guarantee, claimed=cls.guarantee, scenario=scenario,
                       request=_jsonable(request or {}), batch_id=batch_id, numbers=_jsonable(inputs),
                       assumptions=checked, notes=notes)


def _issued_guarantee(claimed: str, assumptions: dict[str, bool]) -> tuple[str, list[str]]:
    if claimed in _ASSUMPTION_FREE:
        return claimed, []
    failed = sorted(name for name, ok in assumptions.items() if not ok)
    if failed:
        return NOT_CERTIFIED, [f"claimed {claimed!r} downgraded to {NOT_CERTIFIED!r}: "
                               f"assumption(s) not satisfied: {', '.join(failed)}"]
    if claimed == FORMAL and not assumptions:
        return NOT_CERTIFIED, [f"claimed {FORMAL!r} downgraded to {NOT_CERTIFIED!r}: "
                               "no assumptions were checked for this run"]
    return claimed, []


def _jsonable(value: Any) -> Any:
    """numpy / torch scalars and arrays become plain Python, so certificates serialise as JSON."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return value
