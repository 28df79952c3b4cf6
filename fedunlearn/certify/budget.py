"""Gaussian noise calibration and the residual budget of certified decentralized unlearning.

Used by ``unlearning/certified_dfu.py`` (DESIGN.md §3); pure functions and a serialisable record, no
torch, no I/O. ``gaussian_sigma`` is the classical σ = (Δ/ε)·√(2 ln(1.25/δ)) [1]_, ``gaussian_delta``
the exact δ(ε) of the Gaussian mechanism [2]_, [3]_, and ``classical_delta`` says whether the
classical σ is valid at a given (ε, δ) (the method refuses a pair where it is not).
``ResidualBudget`` keeps the data-dependent calibration [4]_: σ is fixed in advance from (ε, δ) and
a budget B; each batch's measured distance bound r_t = ‖∇L_r(ŵ_t)‖/λ is charged, the sum since the
last retrain may not exceed B, and a batch whose bound would not fit retrains instead and starts a
new sum. Why the sum: every release stays published, and capping Σ r_t ≤ B is a filter on Gaussian
differential privacy [3]_, [5]_, so the k releases since the last retrain together (``composition``)
are as indistinguishable as one release at the budget — not (kε, kδ), nor advanced composition's
[6]_. The derivation, and how a budget kept by the earlier per-batch rule is read: docs/methods.md, "The
residual budget and its composition".

References
----------
.. [1] Dwork and Roth (2014), "The Algorithmic Foundations of Differential Privacy", Theorem A.1.
.. [2] Balle and Wang (2018), "Improving the Gaussian Mechanism for Differential Privacy:
   Analytical Calibration and Optimal Denoising", ICML, Theorem 8:
   δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), μ = Δ/σ.
.. [3] Dong, Roth and Su (2019), "Gaussian Differential Privacy", Corollaries 2.13 (the exact
   profile) and 3.3 (composition in quadrature, μ = √(Σ μ_t²)).
.. [4] Guo, Goldstein, Hannun and van der Maaten (2020), "Certified Data Removal from Machine
   Learning Models", ICML, §3 and Algorithm 1.
.. [5] Smith and Thakurta (2022), "Fully Adaptive Composition for Gaussian Differential Privacy".
.. [6] Dwork, Rothblum and Vadhan (2010), "Boosting and Differential Privacy", FOCS: advanced
   composition, against which the Gaussian composition is compared.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any, Sequence


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


def composition(bounds: Sequence[float], sigma: float, epsilon: float, delta: float,
                budget: float) -> dict[str, Any]:
    """How the releases since the last retrain compose (module docstring): ``bounds`` are their
    residual bounds r_t, σ their noise, (ε, δ) the per-release target, B the budget. Gaussian
    composition under the cumulative cap: (ε, δ(ε) at μ = B/σ) for all of them together, with the
    joint shift √(Σ r_t²) ≤ B; basic composition of k per-release guarantees: (kε, kδ)."""
    k = len(bounds)
    return {"releases_since_retrain": k,
            "composition": "the releases since the last retrain together, Gaussian (GDP) composition: "
                           "μ² = Σ (r_t/σ)² ≤ (B/σ)² as Σ r_t ≤ B; composed_basic: k releases one by one",
            "composed_epsilon": epsilon, "composed_delta": gaussian_delta(budget, sigma, epsilon),
            "joint_residual_bound": math.sqrt(sum(b * b for b in bounds)),
            "composed_basic": {"epsilon": k * epsilon, "delta": k * delta}}


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _check_privacy(epsilon: float, delta: float) -> None:
    if not (0 < epsilon < math.inf):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


class BudgetAction(str, Enum):
    """What a release does to the residual budget: a Newton step charged to the running sum, or an
    exact retrain that starts a new sum (a string in serialised entries)."""

    newton = "newton"
    retrain = "retrain"


@dataclass(frozen=True)
class BudgetEntry:
    """One released batch: its action — "newton" (the unlearning step, charged) or "retrain" (the
    sum restarted) — the bound of the released model, the budget used and left after it, and for
    a retrain the bound that triggered it (None: a retrain not triggered by the budget). The last
    two are None in entries serialised before the cumulative rule."""

    batch_id: str
    action: str
    residual_bound: float
    budget_left: float
    budget_used: float | None = None
    triggering_bound: float | None = None


@dataclass(frozen=True)
class ResidualBudget:
    """Budget B and one entry per batch since the model was first unlearned; the budget used is
    the sum of the bounds since the last retrain (module docstring). Immutable: ``charge``
    returns a new budget."""

    budget: float
    entries: tuple[BudgetEntry, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not (0 < self.budget < math.inf):
            raise ValueError(f"residual budget must be finite and > 0, got {self.budget}")

    @property
    def since_retrain(self) -> tuple[BudgetEntry, ...]:
        """The releases the current sum covers: from the last retrain (included) on."""
        retrains = [i for i, e in enumerate(self.entries) if e.action == BudgetAction.retrain]
        return self.entries[retrains[-1]:] if retrains else self.entries

    @property
    def used(self) -> float:
        return sum(e.residual_bound for e in self.since_retrain)

    @property
    def left(self) -> float:
        return max(0.0, self.budget - self.used)

    @property
    def retrains(self) -> int:
        return sum(e.action == BudgetAction.retrain for e in self.entries)

    def admits(self, residual_bound: float) -> bool:
        """Whether a release this far (at most) from the retrained optimum fits in what is left."""
        return self.used + residual_bound <= self.budget

    def charge(self, batch_id: str, residual_bound: float, action: BudgetAction,
               triggering_bound: float | None = None) -> "ResidualBudget":
        """Record a release. "newton" adds its bound to the sum, and must fit; "retrain" starts a
        new sum with it, ``triggering_bound`` the bound that did not fit."""
        bound = float(residual_bound)
        if action == BudgetAction.newton:
            if not self.admits(bound):
                raise ValueError(f"a bound of {bound:.3g} does not fit in the {self.left:.3g} left of the residual "
                                 "budget: retrain instead")
            if triggering_bound is not None:
                raise ValueError("only a retrain has a triggering bound")
            used = self.used + bound
        elif action == BudgetAction.retrain:
            used = bound
        else:
            raise ValueError(f"unknown budget action {action!r}")
        entry = BudgetEntry(batch_id, BudgetAction(action).value, bound, max(0.0, self.budget - used), used,
                            None if triggering_bound is None else float(triggering_bound))
        return replace(self, entries=(*self.entries, entry))

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "used": self.used, "left": self.left, "retrains": self.retrains,
                "releases_since_retrain": len(self.since_retrain), "entries": [asdict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ResidualBudget":
        """Reads what ``to_dict`` wrote, and budgets written before the cumulative rule."""
        known = {f.name for f in fields(BudgetEntry)}
        return cls(float(data["budget"]),
                   tuple(BudgetEntry(**{k: v for k, v in e.items() if k in known}) for e in data.get("entries", [])))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ResidualBudget":
        return cls.from_dict(json.loads(text))
