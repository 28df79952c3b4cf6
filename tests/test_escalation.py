"""The escalation is read from what each method's class declares (``roles``, ``rank``,
``stronger_scales``, ``stronger_switches``): the default chains, and a method registered from the
test suite alone taking its place with nothing else edited."""

from __future__ import annotations

from typing import ClassVar

import pytest

from fedunlearn.certify.certificate import EMPIRICAL_ONLY
from fedunlearn.unlearning import registry
from fedunlearn.unlearning.base import UnlearningMethod
from fedunlearn.unlearning.escalation import (Attempt, batch_order, default_escalation, default_method,
                                              methods_in_role, planned_attempts, removal_first, stronger_settings)


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


def order(attempts: list[Attempt], setting: str, **kwargs) -> list[Attempt]:
    return batch_order(attempts, setting, **{"exact_only": False, "removal_wanted": False, "chosen_by_user": False,
                                             **kwargs})


def test_a_batch_the_removal_method_is_wanted_for_tries_it_first_unless_the_user_chose():
    hfl = default_escalation("hfl", "sample", Attempt(method="puf-special"))
    assert [a.method for a in hfl][:2] == ["puf-special", "puf-special"]  # the default order starts with the seed

    remembered = order(hfl, "hfl", removal_wanted=True)
    assert [a.method for a in remembered] == ["fedquit", "fedquit", "puf-special", "puf-special", "puf-regular",
                                              "retrain"]
    assert [a.options for a in remembered[:2]] == [{}, {"solver": "steps"}]  # the edit, then the paper's rounds
    assert sorted(map(repr, remembered)) == sorted(map(repr, hfl))  # reordered: nothing added or lost
    assert order(hfl, "hfl") == hfl
    assert order(hfl, "hfl", removal_wanted=True, chosen_by_user=True) == hfl
    vfl = default_escalation("vfl", "class", Attempt(method="fedora"))  # no last-resort method: the order stays
    assert order(vfl, "vfl", removal_wanted=True) == vfl


def test_a_batch_whose_features_moved_retrains_exactly_whatever_was_asked():
    asked = [Attempt(method="ga"), Attempt(method="retrain")]
    assert [a.method for a in order(asked, "hfl", exact_only=True, removal_wanted=True)] == ["retrain"]
    assert order(asked, "hfl") is asked


def test_the_chain_is_the_users_checked_or_the_default_from_the_first_attempt():
    given = [Attempt(method="ga")]
    assert [a.method for a in planned_attempts("hfl", "sample", Attempt(method="ga"), given)] == ["ga", "retrain"]
    assert planned_attempts("hfl", "sample", Attempt(method="ga")) == default_escalation("hfl", "sample",
                                                                                        Attempt(method="ga"))
    with pytest.raises(ValueError, match="fedquit"):
        planned_attempts("hfl", "class", Attempt(method="ga"), [Attempt(method="fedquit")])
