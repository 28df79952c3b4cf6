"""Two tiers of forgetting: interim at once, exact before each request's deadline.

On a model that does not memorise, no black-box test separates forgetting from a no-op, so a
policy of "escalate until a check passes" retrains every batch. The contract instead:

* **interim** — an approximate version serves as ``current`` at once when the gates' interim
  judgement allows it (``certify.gates.interim_judgement``: nothing fails, utility holds, the
  certificate is not ``not certified``, and what could not be measured is said);
* **exact** — every request forgotten only on the interim tier is owed an exact retrain (or a
  ``formal (ε,δ)`` version) before its deadline. One exact retrain on a data version without the
  requests repays every batch since the last one; it is scheduled at the latest safe time
  (``latest_safe_time``), and a batch that finds that time passed repays at once.

``strict`` keeps the earlier behaviour: escalate until the strict verdict is ``pass``, the exact
retrain at worst. Whether an attempt may serve (``serves``) and whether it ends a batch's escalation
(``stops``) are decided here. Pure functions; the flows schedule and record.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING

from fedunlearn.certify.certificate import EXACT_RETRAIN, FORMAL
from fedunlearn.config import ForgettingPolicy

if TYPE_CHECKING:  # gates reads the tiers; the tiers read a gate's outcome only
    from fedunlearn.certify.gates import GateOutcome


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


__all__ = ["ForgettingPolicy", "Tier", "tier_of", "owes_exact", "serves", "exact_due", "latest_safe_time",
           "repay_now"]
