"""The unlearning interface: registry, request resolution, FederatedState helpers, support checks."""

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.config import TrainConfig
from fedunlearn.federation.local import Tensors
from fedunlearn.unlearning import (ForgetSet, FederatedState, FineTune, GradientAscent, Outcome, Retrain,
                                   UnlearningMethod, available_methods, get_method, register, registry,
                                   resolve_request)

CPU = torch.device("cpu")


def make_clients(sizes=(4, 5, 3), num_classes=3) -> list[Tensors]:
    clients, offset = [], 0
    for size in sizes:
        ids = np.array([f"s-{offset + i:03d}" for i in range(size)])
        labels = np.arange(offset, offset + size) % num_classes
        clients.append(Tensors.from_arrays(np.random.default_rng(offset).normal(size=(size, 2)), labels, ids, CPU))
        offset += size
    return clients


def make_fed_state(setting="hfl") -> FederatedState:
    clients = make_clients()
    return FederatedState(setting, lambda: nn.Linear(2, 3), {}, clients, clients[0], TrainConfig(rounds=1),
                          seed=0, device=CPU, num_classes=3)


@pytest.fixture
def isolated_registry(monkeypatch):
    monkeypatch.setattr(registry, "_METHODS", {k: list(v) for k, v in registry._METHODS.items()})


# --- registry -------------------------------------------------------------------------------------

def test_builtin_methods_are_registered_and_built_with_hyperparameters():
    assert {"retrain", "ga", "finetune"} <= set(available_methods())
    assert isinstance(get_method("retrain", setting="hfl"), Retrain)
    ga = get_method("ga", setting="hfl", radius=1.5, recovery_rounds=0)
    assert isinstance(ga, GradientAscent)
    assert ga.get_params()["radius"] == 1.5 and ga.get_params()["recovery_rounds"] == 0
    assert get_method("finetune", rounds=3).rounds == 3


def test_unknown_method_lists_known_names():
    with pytest.raises(ValueError, match="unknown unlearning method 'nope'.*finetune.*ga.*retrain"):
        get_method("nope")


def test_unknown_or_invalid_hyperparameter_is_a_clear_error():
    with pytest.raises(ValueError, match="no hyperparameter.*'radiuss'.*accepts: lr"):
        get_method("ga", setting="hfl", radiuss=1.0)
    with pytest.raises(ValueError, match="finetune: rounds must be an integer >= 1, got 0"):
        FineTune(rounds=0)
    with pytest.raises(ValueError, match="ga: radius must be > 0"):
        get_method("ga", setting="hfl", radius=-1.0)


def test_unsupported_setting_or_kind_names_what_is_supported():
    with pytest.raises(ValueError, match=r"'finetune' does not support setting 'vfl'; it supports: hfl"):
        get_method("finetune", setting="vfl", kind="client")
    with pytest.raises(ValueError, match=r"'retrain' does not support.*kind 'client'.*kinds \['class', 'sample'\]"):
        get_method("retrain", setting="vfl", kind="client")
    with pytest.raises(ValueError, match="unknown setting 'xfl'; choose one of hfl, vfl, dfl"):
        get_method("retrain", setting="xfl")
    with pytest.raises(ValueError, match="unknown kind 'user'"):
        available_methods(kind="user")


def test_one_name_may_serve_disjoint_settings(isolated_registry):
    registry._METHODS["retrain"] = [c for c in registry._METHODS["retrain"] if "vfl" not in c.settings]

    @register
    class VerticalRetrainStub(UnlearningMethod):
        name = "retrain"
        settings = frozenset({"vfl"})
        request_kinds = frozenset({"sample", "class"})
        guarantee = "exact retrain"

        def _unlearn(self, fed_state, batch, monitor):
            return Outcome(state={})

    assert isinstance(get_method("retrain", setting="vfl"), VerticalRetrainStub)
    assert isinstance(get_method("retrain", setting="hfl"), Retrain)
    with pytest.raises(ValueError, match="exists for several settings.*name the setting"):
        get_method("retrain")
    with pytest.raises(ValueError, match="already registered by Retrain for settings \\['hfl'\\]"):
        register(type("Clash", (VerticalRetrainStub,), {"name": "retrain", "settings": frozenset({"hfl"})}))


def test_available_methods_filters_by_setting_and_kind(isolated_registry):
    @register
    class LabelOnlyVFL(UnlearningMethod):
        name = "vfl_label_only"
        settings = frozenset({"vfl"})
        request_kinds = frozenset({"class"})
        guarantee = "constraint satisfied"

        def _unlearn(self, fed_state, batch, monitor):
            return Outcome(fed_state.state)

    assert "vfl_label_only" in available_methods("vfl")
    assert "vfl_label_only" not in available_methods("vfl", "sample")
    assert "vfl_label_only" not in available_methods("hfl")
    assert "vfl_label_only" in available_methods(kind="class")
    assert set(available_methods("hfl", "client")) >= {"retrain", "ga", "finetune"}


def test_register_rejects_invalid_declarations(isolated_registry):
    class BadGuarantee(UnlearningMethod):
        name, settings, request_kinds, guarantee = "bad", frozenset({"hfl"}), frozenset({"client"}), "certified"

        def _unlearn(self, fed_state, batch, monitor):
            raise NotImplementedError

    with pytest.raises(TypeError, match="guarantee 'certified' is not one of"):
        register(BadGuarantee)

    class Clash(BadGuarantee):
        name, guarantee = "retrain", "empirical only"

    with pytest.raises(ValueError, match="'retrain' is already registered"):
        register(Clash)


def test_unlearn_checks_the_setting_before_doing_anything():
    batch = ForgetSet.for_clients([1], make_clients())
    with pytest.raises(ValueError, match=r"'retrain' does not support setting 'vfl', kind 'client'"):
        Retrain().unlearn(make_fed_state("vfl"), batch)


# --- deletion requests ----------------------------------------------------------------------------

def test_client_request_forgets_every_sample_of_the_client():
    clients = make_clients()
    batch = resolve_request("client", 1, clients)
    assert batch.kind == "client" and batch.clients == [1] and batch.affected_clients == [1]
    assert batch.forget_ids[1].tolist() == clients[1].sample_ids.tolist()


def test_class_request_collects_the_class_at_every_client():
    clients = make_clients()
    batch = resolve_request("class", [2], clients, num_classes=3)
    assert batch.labels == [2]
    forgotten = np.concatenate(list(batch.forget_ids.values()))
    expected = np.concatenate([c.sample_ids[c.y.numpy() == 2] for c in clients])
    assert sorted(forgotten.tolist()) == sorted(expected.tolist())


def test_sample_request_by_ids_and_by_seeded_fraction():
    clients = make_clients()
    batch = resolve_request("sample", ["s-001", "s-006"], clients)
    assert {c: ids.tolist() for c, ids in batch.forget_ids.items()} == {0: ["s-001"], 1: ["s-006"]}
    subject = {"clients": [0, 2], "fraction": 0.5, "seed": 7}
    first, again = resolve_request("sample", subject, clients), resolve_request("sample", subject, clients)
    assert {c: len(ids) for c, ids in first.forget_ids.items()} == {0: 2, 2: 2}
    assert first.batch_id == again.batch_id
    assert all(np.array_equal(first.forget_ids[c], again.forget_ids[c]) for c in first.forget_ids)


@pytest.mark.parametrize("kind, subject, message", [
    ("client", 3, "unknown client 3: clients are 0..2"),
    ("client", [], "empty client subject"),
    ("class", 3, r"class label\(s\) \[3\] out of range: labels are 0..2"),
    ("class", [], "empty class subject"),
    ("sample", ["s-001", "ghost"], r"1 sample ID\(s\) not held by any client, e.g. \['ghost'\]"),
    ("sample", [], "empty sample subject"),
    ("sample", {"clients": [0], "fraction": 1.5}, r"fraction must be in \(0, 1\]"),
    ("sample", {"clients": [0]}, "a fraction subject is"),
    ("user", 1, "unknown request kind 'user'"),
])
def test_bad_requests_are_clear_errors(kind, subject, message):
    with pytest.raises(ValueError, match=message):
        resolve_request(kind, subject, make_clients(), num_classes=3)


def test_batch_round_trips_through_a_dict():
    batch = resolve_request("class", 0, make_clients(), num_classes=3)
    again = ForgetSet.from_dict(batch.to_dict())
    assert again.batch_id == batch.batch_id and again.labels == [0]
    assert {c: ids.tolist() for c, ids in again.forget_ids.items()} == \
        {c: ids.tolist() for c, ids in batch.forget_ids.items()}


# --- FederatedState helpers -----------------------------------------------------------------------

def test_retained_clients_and_forget_data():
    fed_state = make_fed_state()
    batch = ForgetSet("sample", {0: np.array(["s-000"]), 1: fed_state.clients[1].sample_ids}, batch_id="b1")
    retained = fed_state.retained_clients(batch)
    assert [len(c) for c in retained] == [3, 0, 3]
    assert "s-000" not in retained[0].sample_ids and retained[2] is fed_state.clients[2]
    forget = fed_state.forget_data(batch)
    assert forget.sample_ids.tolist() == ["s-000", "s-004", "s-005", "s-006", "s-007", "s-008"]
    assert forget.x.shape == (6, 2) and len(forget.y) == 6


def test_a_batch_naming_ids_a_client_does_not_hold_is_rejected():
    batch = ForgetSet("sample", {0: np.array(["s-010"])})
    with pytest.raises(ValueError, match=r"client 0 does not hold sample ID\(s\) \['s-010'\]"):
        make_fed_state().retained_clients(batch)
