"""Gaussian noise calibration and the residual budget ledger of certified decentralized
unlearning (``unlearning/certified_dfu.py``; DESIGN.md §3). Pure functions and a serialisable
record: no torch, no I/O.

Gaussian mechanism. If two outputs differ by at most Δ in L2 norm, adding N(0, σ²I) with

    σ = (Δ/ε)·√(2 ln(1.25/δ))                                     (Dwork & Roth 2014, Thm A.1)

makes them (ε, δ)-indistinguishable in both directions. Theorem A.1 is stated for ε < 1; the
exact privacy profile of the Gaussian mechanism (Balle & Wang 2018, Thm 8; Dong, Roth & Su 2019,
Cor. 2.13), with μ = Δ/σ,

    δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ),

settles every ε: the classical σ is valid exactly when δ(ε) ≤ δ at μ = ε/√(2 ln(1.25/δ)),
which depends on (ε, δ) only. ``classical_delta`` computes it (ε = 1, δ = 1e-5: 4·10⁻⁸, valid;
ε = 10, δ = 1e-5: 2·10⁻⁵, not), and the method refuses an (ε, δ) where it fails.

Residual budget (the data-dependent calibration, after Guo, Goldstein, Hannun and van der
Maaten 2020, "Certified Data Removal from Machine Learning Models", §3). σ is fixed in advance
from (ε, δ) and a budget B by the formula above with Δ = B. After every batch the unlearning
step's distance to the exact retrained optimum is bounded by a measured residual,
r = ‖∇L_r(ŵ)‖/λ; the released model is certified when r ≤ B, and the method retrains (and says
so) when it is not. The ledger records, per batch, the bound measured, the action taken and the
budget it leaves.

What is charged. Guo et al. add up per-removal bounds because each of their bounds covers only
that removal's own step; what earlier steps left behind is carried along implicitly. Here the
residual is measured on the whole current retained objective at the model itself, so it
already contains whatever earlier batches left (and the earlier noise, which the next Newton
step corrects): it bounds the TOTAL distance. Adding it to the previous bounds would count the
carried part twice. So the budget used after a batch is that batch's measured bound, and
``left = budget − used``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any


def gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = (Δ/ε)·√(2 ln(1.25/δ))."""
    _check_privacy(epsilon, delta)
    if sensitivity < 0:
        raise ValueError(f"sensitivity must be >= 0, got {sensitivity}")
    return sensitivity / epsilon * math.sqrt(2.0 * math.log(1.25 / delta))


def gaussian_delta(sensitivity: float, sigma: float, epsilon: float) -> float:
    """The exact δ(ε) of adding N(0, σ²I) to outputs at most ``sensitivity`` apart (Balle & Wang)."""
    if sensitivity == 0:
        return 0.0
    if sigma <= 0:
        return 1.0
    mu = sensitivity / sigma
    return max(0.0, _phi(mu / 2 - epsilon / mu) - math.exp(epsilon) * _phi(-mu / 2 - epsilon / mu))


def classical_delta(epsilon: float, delta: float) -> float:
    """The exact δ(ε) at the classical calibration (independent of Δ: only Δ/σ matters)."""
    return gaussian_delta(1.0, gaussian_sigma(1.0, epsilon, delta), epsilon)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _check_privacy(epsilon: float, delta: float) -> None:
    if not (0 < epsilon < math.inf):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


@dataclass(frozen=True)
class LedgerEntry:
    batch_id: str
    action: str          # "newton" (the unlearning step) or "retrain" (budget exceeded)
    residual_bound: float
    budget_left: float


@dataclass(frozen=True)
class ResidualLedger:
    """Budget B and one entry per batch since the model was first unlearned. Immutable:
    ``charge`` returns a new ledger."""

    budget: float
    entries: tuple[LedgerEntry, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not (0 < self.budget < math.inf):
            raise ValueError(f"residual budget must be finite and > 0, got {self.budget}")

    @property
    def used(self) -> float:
        """The current distance bound to the exact retrained optimum (0 before any batch)."""
        return self.entries[-1].residual_bound if self.entries else 0.0

    @property
    def left(self) -> float:
        return self.budget - self.used

    @property
    def retrains(self) -> int:
        return sum(e.action == "retrain" for e in self.entries)

    def admits(self, residual_bound: float) -> bool:
        """Whether a model this far (at most) from the retrained optimum may be certified."""
        return residual_bound <= self.budget

    def charge(self, batch_id: str, residual_bound: float, action: str) -> "ResidualLedger":
        if action not in ("newton", "retrain"):
            raise ValueError(f"unknown ledger action {action!r}")
        entry = LedgerEntry(batch_id, action, float(residual_bound), self.budget - float(residual_bound))
        return replace(self, entries=(*self.entries, entry))

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "used": self.used, "left": self.left, "retrains": self.retrains,
                "entries": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ResidualLedger":
        return cls(float(data["budget"]), tuple(LedgerEntry(**e) for e in data.get("entries", [])))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ResidualLedger":
        return cls.from_dict(json.loads(text))
