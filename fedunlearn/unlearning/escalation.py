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

from fedunlearn.unlearning.base import UnlearningMethod
from fedunlearn.unlearning.registry import available_methods, get_method, get_method_class

EXACT_RETRAIN_METHOD = "retrain"
STRONGER_FACTOR = 2
# The roles a method declares (``UnlearningMethod.roles``): the first attempt; the other method tried
# per setting, the first of rank order supporting the request kind; tried after it, each one
# supporting the kind, methods that do not start from the gradient at the forget samples, so they
# can remove what the seed methods cannot (a memorised sample's gradient is close to zero;
# docs/methods.md), at the risk of over-forgetting.
DEFAULT, FALLBACK, LAST_RESORT = "default", "fallback", "last-resort"


def _declared(cls: type[UnlearningMethod], attribute: str, empty: Any) -> Any:
    """A class attribute as the class itself declares it: a subclass (a method's variant) inherits
    no place in the escalation and no stronger attempt."""
    return vars(cls).get(attribute, empty)


def role_of(cls: type[UnlearningMethod], setting: str, kind: str | None = None) -> str | None:
    """The role ``cls`` declares for ``setting`` (for ``kind``, where it declares one of its own)."""
    roles = _declared(cls, "roles", {})
    if kind is not None and (setting, kind) in roles:
        return roles[(setting, kind)]
    return roles.get(setting)


def _classes(setting: str) -> list[type[UnlearningMethod]]:
    return [get_method_class(name, setting) for name in available_methods(setting)]


def methods_in_role(setting: str, role: str, kind: str | None = None) -> tuple[str, ...]:
    """The registered methods of ``setting`` declaring ``role``, in rank order (then by name)."""
    chosen = sorted((c for c in _classes(setting) if role_of(c, setting, kind) == role), key=lambda c: (c.rank, c.name))
    return tuple(c.name for c in chosen)


def stronger_settings(method: str, setting: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """What ``method``'s stronger attempt multiplies and sets (``UnlearningMethod.stronger_scales`` and
    ``stronger_switches``, as its class declares them)."""
    cls = get_method_class(method, setting)
    return tuple(_declared(cls, "stronger_scales", ())), dict(_declared(cls, "stronger_switches", {}))


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
    """The setting's default method, or the one for its request kind where that differs: the method
    declaring the role ``default`` for (setting, kind), else the one declaring it for the setting
    (exactly one must)."""
    classes = _classes(setting)
    for key in ([(setting, kind)] if kind is not None else []) + [setting]:
        found = sorted(c.name for c in classes if _declared(c, "roles", {}).get(key) == DEFAULT)
        if len(found) > 1:
            raise ValueError(f"{len(found)} methods declare roles {{{key!r}: {DEFAULT!r}}}: {', '.join(found)}; one may")
        if found:
            return found[0]
    raise ValueError(f"no method declares roles {{{setting!r}: {DEFAULT!r}}}")


def default_escalation(setting: str, kind: str, first: Attempt) -> list[Attempt]:
    """``first`` → ``first`` stronger (if the method has a stronger setting) → the setting's
    fallback method supporting ``kind`` → its last-resort methods supporting ``kind`` → exact
    retrain. A method already in the chain is not tried again with its default settings."""
    if first.exact:
        return [first]
    get_method_class(first.method, setting).check_supported(setting, kind)
    attempts = [first, *_stronger_if_any(first, setting)]
    supported = set(available_methods(setting, kind))
    fallback = next((m for m in methods_in_role(setting, FALLBACK) if m in supported and m != first.method), None)
    if fallback is not None:
        attempts.append(Attempt(method=fallback))
    tried = {attempt.method for attempt in attempts}
    for method in methods_in_role(setting, LAST_RESORT):
        if method in supported and method not in tried:
            attempts += [Attempt(method=method), *_stronger_if_any(Attempt(method=method), setting)]
    return attempts + [Attempt(method=EXACT_RETRAIN_METHOD)]


def _stronger_if_any(attempt: Attempt, setting: str) -> list[Attempt]:
    """``[stronger(attempt)]`` where the method has a stronger setting that differs from ``attempt``."""
    if is_exact_retrain(attempt.method) or stronger_settings(attempt.method, setting) == ((), {}):
        return []
    harder = stronger(attempt, setting)
    return [] if harder.options == attempt.options else [harder]


def planned_attempts(setting: str, kind: str, first: Attempt, given: list[Attempt] | None = None) -> list[Attempt]:
    """A batch's chain: the attempts the user gave (``checked_escalation``), else the default one from
    ``first`` (``default_escalation``)."""
    return checked_escalation(setting, kind, given) if given else default_escalation(setting, kind, first)


def batch_order(attempts: list[Attempt], setting: str, *, exact_only: bool, removal_wanted: bool,
                chosen_by_user: bool) -> list[Attempt]:
    """The order a batch tries its attempts in. ``exact_only`` (its route: deleting held-out samples
    moved every sample's features): only an exact retrain fits the new data version, whatever was
    asked. Where the source model's audit wants a removal method first (``removal_wanted``:
    ``AuditResult.removal_wanted``) and the user left the method to the default, the methods that can
    remove what was memorised go first (``removal_first``); otherwise the policy's own order. The
    source's audit is taken before any candidate exists, so the order depends on no candidate's score,
    and every candidate is judged by the same gates."""
    if exact_only:
        return [Attempt(method=EXACT_RETRAIN_METHOD)]
    if chosen_by_user or not removal_wanted:
        return attempts
    return removal_first(attempts, setting)


def removal_first(attempts: list[Attempt], setting: str) -> list[Attempt]:
    """``attempts`` with the setting's last-resort methods moved ahead of the others, for a forget set
    the source model remembers: the seed methods move the model along the loss gradient at the forget
    samples, and a memorised sample's gradient is close to zero, so they would be paid for and fail
    before the method that can remove it is tried (docs/methods.md, "Which method first")."""
    last_resort = methods_in_role(setting, LAST_RESORT)
    first = [attempt for attempt in attempts if attempt.method in last_resort]
    return first + [attempt for attempt in attempts if attempt not in first]


def stronger(attempt: Attempt, setting: str) -> Attempt:
    """``attempt`` with each of its method's strength settings (``UnlearningMethod.stronger_scales``) multiplied by
    ``STRONGER_FACTOR`` from what it chose (the default where it chose nothing), and the method's
    switches (``stronger_switches``) set."""
    chosen = get_method(attempt.method, setting=setting, **attempt.options).get_params()
    scales, switches = stronger_settings(attempt.method, setting)
    options = {**attempt.options, **switches}
    for key in scales:
        options[key] = type(chosen[key])(chosen[key] * STRONGER_FACTOR)
    return Attempt(method=attempt.method, options=options)


def checked_escalation(setting: str, kind: str, attempts: list[Attempt]) -> list[Attempt]:
    """Attempts given in the form: every method exists and supports the setting and kind, and it
    ends with exact retrain (added when missing) — no batch can run out of steps."""
    for attempt in attempts:
        if not attempt.exact:
            get_method_class(attempt.method, setting).check_supported(setting, kind)
    return attempts if attempts and attempts[-1].exact else [*attempts, Attempt(method=EXACT_RETRAIN_METHOD)]
