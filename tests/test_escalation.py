"""The escalation is read from what each method's class declares (``roles``, ``rank``,
``stronger_scales``, ``stronger_switches``): the default chains, and a method registered from the
test suite alone taking its place with nothing else edited."""

from __future__ import annotations

from typing import ClassVar

import pytest

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.unlearning import registry
from fedunlearn.unlearning.base import UnlearningMethod
from fedunlearn.unlearning.escalation import (Attempt, default_escalation, default_method, methods_in_role,
                                              removal_first, stronger_settings)


def chain(setting: str, kind: str) -> list[tuple[str, dict]]:
    first = Attempt(method=default_method(setting, kind))
    return [(a.method, a.options) for a in default_escalation(setting, kind, first)]


def test_the_default_chains_are_read_from_the_methods_classes():
    assert chain("hfl", "sample") == [("puf-special", {}), ("puf-special", {"eta_u": 4.0, "unlearn_epochs": 2}),
                                      ("puf-regular", {}), ("fedquit", {}), ("fedquit", {"solver": "steps"}),
                                      ("retrain", {})]
    assert [m for m, _ in chain("hfl", "class")] == ["puf-special", "puf-special", "puf-regular", "retrain"]
    assert default_method("vfl", "sample") == "ga" and default_method("vfl", "class") == "fedora"
    assert [m for m, _ in chain("vfl", "class")] == ["fedora", "fedora", "ga", "retrain"]
    assert [m for m, _ in chain("dfl", "sample")] == ["certified-dfu", "certified-dfu", "retrain"]
    assert methods_in_role("hfl", "fallback") == ("puf-regular", "ga", "finetune")
    assert methods_in_role("hfl", "last-resort") == ("fedquit",)


def test_a_variant_inherits_no_place_and_no_stronger_attempt():
    assert stronger_settings("certified-dfu", "dfl") == (("newton_steps",), {})
    assert stronger_settings("certified-dfu-paper", "dfl") == ((), {})
    assert [a.method for a in default_escalation("dfl", "sample", Attempt(method="certified-dfu-paper"))] == \
        ["certified-dfu-paper", "retrain"]


class _Quiet(UnlearningMethod):
    """A test method: it declares itself the first HFL fallback with a stronger setting."""

    name = "test-quiet"
    settings = frozenset({"hfl"})
    request_kinds = frozenset({"sample", "client"})
    guarantee = EMPIRICAL_ONLY
    roles: ClassVar = {"hfl": "fallback"}
    rank = -1
    stronger_scales = ("epochs",)

    def __init__(self, *, epochs: int = 3):
        self.epochs = epochs

    def _unlearn(self, fed_state, batch):  # pragma: no cover - never run here
        raise NotImplementedError


@pytest.fixture
def quiet_registered(monkeypatch):
    """``_Quiet`` registered for this test only (the registry restored after)."""
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    registry.register(_Quiet)
    return _Quiet


def test_a_method_registered_from_the_test_suite_alone_takes_its_declared_place(quiet_registered):
    assert methods_in_role("hfl", "fallback")[0] == "test-quiet"
    assert [m for m, _ in chain("hfl", "sample")] == ["puf-special", "puf-special", "test-quiet", "fedquit", "fedquit",
                                                      "retrain"]
    # Its own stronger attempt where it is the first; the last resort still moves ahead for a remembered set.
    own = default_escalation("hfl", "sample", Attempt(method="test-quiet"))
    assert [(a.method, a.options) for a in own[:3]] == [("test-quiet", {}), ("test-quiet", {"epochs": 6}),
                                                        ("puf-regular", {})]
    assert removal_first(own, "hfl")[0].method == "fedquit"
    # A request kind it does not support keeps the chain it had.
    assert "test-quiet" not in [m for m, _ in chain("hfl", "class")]


def test_a_setting_with_two_default_methods_is_an_error_naming_them(monkeypatch):
    class _Second(_Quiet):
        name = "test-second-default"
        roles: ClassVar = {"hfl": "default"}

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    registry.register(_Second)
    with pytest.raises(ValueError, match="2 methods declare roles .*puf-special, test-second-default"):
        default_method("hfl", "sample")
