"""Escalation: what a deletion batch tries, in order, until a version passes its gates — so that
no batch ends with the serving model on deleted data, and no version that kept it is promoted.

    the method (the setting's default or the one chosen) ─▶ the same method, stronger
    ─▶ another method for the setting and request kind ─▶ the setting's last-resort
    approximate methods for the kind ─▶ exact retrain

Exact retrain is the last step of every policy: retrained from scratch on the retained data it
holds nothing of the deleted samples by construction, so it needs no gate. A policy is a list of
``Attempt``s (a form in the Prefect UI); the default one is built by ``default_escalation``. Every
attempt is registered (or logged) and the receipt lists the chain.

"Stronger" (``stronger``) scales what the first attempt chose — its own options, the method's
defaults where it set none — by ``STRONGER_FACTOR`` along each method's forgetting direction, at
more cost, so a user's stronger-than-default choice is made stronger still, never weaker:

* puf-special / puf-regular: the unlearning step η_u and the unlearning epochs;
* ga: the ascent epochs; hf-kcu: the CG steps, and the federation's curvature with no β cap;
* fedora: the iterations and ω;
* certified-dfu: the Newton steps (a smaller residual, so more of the budget is left);
* fedquit: from its closed-form edit to the paper's FedAvg rounds (``solver="steps"``), the last
  resort's stronger attempt, tried after the edit.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fedunlearn.unlearning.registry import available_methods, get_method, get_method_class

EXACT_RETRAIN_METHOD = "retrain"
DEFAULT_METHODS = {"hfl": "puf-special", "vfl": "fedora", "dfl": "certified-dfu"}
# FedORA's sample objective pushes the forget samples to uncertainty: its own setting is a share of
# chosen classes; arbitrary samples of a model that generalises it over-forgets (docs/methods.md).
DEFAULT_BY_KIND = {("vfl", "sample"): "ga"}
STRONGER_FACTOR = 2
STRONGER_SCALES: dict[str, tuple[str, ...]] = {
    "puf-special": ("eta_u", "unlearn_epochs"),
    "puf-regular": ("eta_u", "unlearn_epochs"),
    "ga": ("epochs",),
    "hf-kcu": ("cg_iterations",),
    "fedora": ("iterations", "omega"),
    "certified-dfu": ("newton_steps",),
    "fedquit": (),
}
STRONGER_SWITCHES: dict[str, dict[str, Any]] = {"hf-kcu": {"hessian": "federation", "beta": None},
                                               "fedquit": {"solver": "steps"}}
# The other method tried per setting, first one supporting the request kind wins.
FALLBACKS = {"hfl": ("puf-regular", "ga", "finetune"), "vfl": ("ga",), "dfl": ()}
# Tried after the fallback, each one supporting the request kind, in order: methods that do not
# start from the gradient at the forget samples, so they can remove what the seed methods cannot
# (a memorised sample's gradient is close to zero; docs/methods.md), at the risk of over-forgetting.
LAST_RESORT: dict[str, tuple[str, ...]] = {"hfl": ("fedquit",), "vfl": (), "dfl": ()}


class Attempt(BaseModel):
    """One step of a policy: a registered method name and its hyperparameters."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(description="a registered unlearning method, or 'retrain' (exact retrain: the last step)")
    options: dict[str, Any] = Field(default_factory=dict, description="the method's hyperparameters")

    @property
    def exact(self) -> bool:
        return is_exact_retrain(self.method)


def is_exact_retrain(method: str) -> bool:
    """Whether a method name (an attempt's, a receipt's, a registered version's) is the exact retrain."""
    return method == EXACT_RETRAIN_METHOD


def default_method(setting: str, kind: str | None = None) -> str:
    """The setting's default method, or the one for its request kind where that differs."""
    return DEFAULT_BY_KIND.get((setting, kind), DEFAULT_METHODS[setting])


def default_escalation(setting: str, kind: str, first: Attempt) -> list[Attempt]:
    """``first`` → ``first`` stronger (if the method has a stronger setting) → the setting's
    fallback method supporting ``kind`` → its last-resort methods supporting ``kind`` → exact
    retrain. A method already in the chain is not tried again with its default settings."""
    if first.exact:
        return [first]
    get_method_class(first.method, setting).check_supported(setting, kind)
    attempts = [first, *_stronger_if_any(first, setting)]
    supported = set(available_methods(setting, kind))
    fallback = next((m for m in FALLBACKS[setting] if m in supported and m != first.method), None)
    if fallback is not None:
        attempts.append(Attempt(method=fallback))
    tried = {attempt.method for attempt in attempts}
    for method in LAST_RESORT[setting]:
        if method in supported and method not in tried:
            attempts += [Attempt(method=method), *_stronger_if_any(Attempt(method=method), setting)]
    return attempts + [Attempt(method=EXACT_RETRAIN_METHOD)]


def _stronger_if_any(attempt: Attempt, setting: str) -> list[Attempt]:
    """``[stronger(attempt)]`` where the method has a stronger setting that differs from ``attempt``."""
    if attempt.method not in STRONGER_SCALES:
        return []
    harder = stronger(attempt, setting)
    return [] if harder.options == attempt.options else [harder]


def removal_first(attempts: list[Attempt], setting: str) -> list[Attempt]:
    """``attempts`` with the setting's last-resort methods moved ahead of the others, for a forget set
    the source model remembers: the seed methods move the model along the loss gradient at the forget
    samples, and a memorised sample's gradient is close to zero, so they would be paid for and fail
    before the method that can remove it is tried (docs/methods.md, "Which method first")."""
    first = [attempt for attempt in attempts if attempt.method in LAST_RESORT[setting]]
    return first + [attempt for attempt in attempts if attempt not in first]


def stronger(attempt: Attempt, setting: str) -> Attempt:
    """``attempt`` with each of its method's strength settings (``STRONGER_SCALES``) multiplied by
    ``STRONGER_FACTOR`` from what it chose (the default where it chose nothing), and the method's
    switches (``STRONGER_SWITCHES``) set."""
    chosen = get_method(attempt.method, setting=setting, **attempt.options).get_params()
    options = {**attempt.options, **STRONGER_SWITCHES.get(attempt.method, {})}
    for key in STRONGER_SCALES[attempt.method]:
        options[key] = type(chosen[key])(chosen[key] * STRONGER_FACTOR)
    return Attempt(method=attempt.method, options=options)


def checked_escalation(setting: str, kind: str, attempts: list[Attempt]) -> list[Attempt]:
    """Attempts given in the form: every method exists and supports the setting and kind, and it
    ends with exact retrain (added when missing) — no batch can run out of steps."""
    for attempt in attempts:
        if not attempt.exact:
            get_method_class(attempt.method, setting).check_supported(setting, kind)
    return attempts if attempts and attempts[-1].exact else [*attempts, Attempt(method=EXACT_RETRAIN_METHOD)]
