"""The split-NN engine on wine-vfl (3 parties, columns split 4/5/4): parties hold only their own
slice, only embeddings and embedding gradients cross, the byte counter, ID alignment, the
auditor's view, and the VFL baselines (retrain, ga) registered under the shared names."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.config import TrainConfig
from fedunlearn.data.store import PARTITIONS_DIR, read_manifest
from fedunlearn.federation.vertical import ActiveParty, Party, VerticalFederation, VerticalState, load_vertical
from fedunlearn.unlearning import (VerticalGradientAscent, VerticalRetrain, available_methods, get_method,
                                   resolve_request)
from models.vfl import BottomModel, TopModel

CPU = torch.device("cpu")
CONFIG = TrainConfig(rounds=20, lr=0.05, batch_size=16)  # ≈ 97% test accuracy on wine-vfl
EMBEDDING = 16


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    from stores.workspace import PROJECT_ROOT, init_workspace, reproduce

    workspace = init_workspace(tmp_path_factory.mktemp("vfl") / "workspace", template=PROJECT_ROOT)
    reproduce(workspace, "wine-vfl")
    return workspace


@pytest.fixture(scope="module")
def trained(root):
    federation = load_vertical("wine-vfl", root, CPU, config=CONFIG, seed=0)
    return federation, federation.fit().state


def recorded(federation: VerticalFederation) -> list:
    messages = []
    federation.channel.observers.append(messages.append)
    return messages


def widths(root) -> list[int]:
    return [b - a for a, b in (p["slice"]["columns"] for p in read_manifest("wine-vfl", root)["parties"])]


def arrays_in(obj, seen=None):
    """Every tensor / array reachable from an object's attributes (dicts and lists followed),
    except inside nn.Modules (a party's weights are not data)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, nn.Module):
        return
    seen.add(id(obj))
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from arrays_in(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from arrays_in(value, seen)
    elif hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            yield from arrays_in(value, seen)


def test_every_party_holds_only_its_own_feature_slice(root, trained):
    federation, _ = trained
    n_train, n_test = federation.num_samples, federation.active.num_rows("test")
    for party, width in zip(federation.parties, widths(root)):
        per_sample = [a for a in arrays_in(party) if a.ndim >= 1 and len(a) in (n_train, n_test)]
        features = [a for a in per_sample if a.ndim >= 2]
        assert len(features) == 2  # its train and test slices, nothing else row-per-sample and 2-D
        assert all(a.shape[1:] == (width,) for a in features)
        assert all(a.ndim == 1 for a in per_sample if a.ndim < 2)  # IDs, row map, (labels)
        assert hasattr(party, "labels") == isinstance(party, ActiveParty)
    # The coordinator itself holds no per-sample 2-D array: it never sees features.
    coordinator = {k: v for k, v in vars(federation).items() if k not in ("parties", "active")}
    assert not [a for a in arrays_in(coordinator) if a.ndim >= 2 and len(a) in (n_train, n_test)]


def test_only_embeddings_and_their_gradients_cross_and_bytes_are_counted(trained):
    federation, state = trained
    messages = recorded(federation)
    before = federation.channel.bytes_sent
    federation.fit(state=state, epochs=1, first_epoch=50)
    federation.accuracy(split="test")
    federation.channel.observers.clear()

    active = federation.active.index
    assert {m.kind for m in messages} == {"embedding", "gradient"}
    for m in messages:  # (batch, embedding) tensors, to the active party and back from it
        assert m.tensor.ndim == 2 and m.tensor.shape[1] == EMBEDDING
        assert (m.receiver if m.kind == "embedding" else m.sender) == active
    crossing = [m for m in messages if m.sender != m.receiver]
    assert federation.channel.bytes_sent - before == sum(m.num_bytes for m in crossing)
    # One epoch: every training sample's embedding and its gradient, from each of the 2 passive
    # parties; then the test embeddings. 4 bytes per float32.
    n_train, n_test = federation.num_samples, federation.active.num_rows("test")
    assert federation.channel.bytes_sent - before == 2 * 4 * EMBEDDING * (2 * n_train + n_test)


def test_samples_are_aligned_by_the_intersection_of_ids():
    rng = np.random.default_rng(0)
    x, ids = rng.normal(size=(12, 5)).astype(np.float32), np.array([f"s-{i:02d}" for i in range(12)])
    y = np.arange(12) % 3
    torch.manual_seed(0)
    bottoms = [BottomModel((2,)), BottomModel((3,))]
    reverse = np.arange(12)[::-1]
    passive = Party(0, np.vstack([x[reverse, :2], [[9.0, 9.0]]]), np.append(ids[reverse], "extra"),
                    x[:4, :2], nn.ModuleDict({"bottom": bottoms[0]}), CPU)
    active = ActiveParty(1, x[1:, 2:], ids[1:], x[:4, 2:], nn.ModuleDict({"bottom": bottoms[1], "top": TopModel(2, 3)}),
                         CPU, labels=y[1:], test_labels=y[:4])
    federation = VerticalFederation([passive, active], slices=[{"columns": [0, 2]}, {"columns": [2, 5]}],
                                    input_shape=(5,), num_classes=3, config=CONFIG, seed=0)
    assert federation.sample_ids.tolist() == ids[1:].tolist()  # s-00 and "extra" are not shared
    view = federation.audit_view("train")
    assert torch.equal(view.x, torch.as_tensor(x[1:])) and view.y.tolist() == y[1:].tolist()
    logits = federation.logits(split="train")
    assert torch.allclose(logits, federation.as_module()(torch.as_tensor(x[1:])), atol=1e-6)
    with pytest.raises(ValueError, match="not shared by all parties.*'s-00'"):
        federation.positions_of(["s-00"])


def test_load_reads_the_partition_and_training_is_seeded(root, trained):
    federation, state = trained
    manifest = read_manifest("wine-vfl", root)
    assert [p.role for p in federation.parties] == ["passive", "passive", "active"]
    assert federation.num_samples == manifest["train"]["num_samples"]
    again = load_vertical("wine-vfl", root, CPU, config=CONFIG, seed=0).fit().state
    assert all(torch.equal(state[p][k], again[p][k]) for p in state for k in state[p])
    assert federation.evaluate(state) >= 0.9
    test_full = np.load(root / PARTITIONS_DIR / "wine-vfl" / "test" / "features.npy")
    auditor = federation.as_module(state)
    assert torch.equal(federation.audit_view("test").x, torch.as_tensor(test_full))
    assert torch.allclose(auditor(torch.as_tensor(test_full)), federation.logits(split="test"), atol=1e-5)


def test_vertical_state_resolves_class_and_sample_requests_under_key_0(trained):
    federation, state = trained
    fed_state = VerticalState.from_federation(federation, state)
    batch = resolve_request("class", [0], fed_state.clients, num_classes=3)
    assert list(batch.forget_ids) == [0]
    assert set(fed_state.forget_data(batch).y.tolist()) == {0}
    assert 0 not in fed_state.retained_clients(batch)[0].y.tolist()
    forget, retained = fed_state.positions(batch)
    assert len(forget) + len(retained) == federation.num_samples
    half = resolve_request("sample", {"clients": [0], "fraction": 0.5, "seed": 0}, fed_state.clients)
    assert batch.num_forget > 0 and half.num_forget == round(0.5 * federation.num_samples)
    ids = fed_state.class_fraction_ids([1, 2], 0.5, seed=3)
    labels = fed_state.samples.y[federation.positions_of(ids)]
    assert set(labels.tolist()) == {1, 2} and len(ids) == sum(
        round(0.5 * int((fed_state.samples.y == c).sum())) for c in (1, 2))


def test_vfl_methods_share_the_names_retrain_and_ga():
    assert {"retrain", "ga", "fedora"} <= set(available_methods("vfl", "class"))
    assert isinstance(get_method("retrain", setting="vfl"), VerticalRetrain)
    assert isinstance(get_method("ga", setting="vfl", kind="sample"), VerticalGradientAscent)
    message = r"'retrain' does not support setting 'vfl', kind 'client'.*kinds \['class', 'sample'\]"
    with pytest.raises(ValueError, match=message):
        get_method("retrain", setting="vfl", kind="client")


def test_vertical_retrain_is_the_original_training_on_retained_ids_only(root, trained):
    federation, state = trained
    fed_state = VerticalState.from_federation(federation, state)
    batch = resolve_request("class", [2], fed_state.clients, num_classes=3)
    forget, retained = fed_state.positions(batch)
    seen = []
    backprop = federation.backprop
    federation.backprop = lambda positions, *args: seen.append(positions) or backprop(positions, *args)
    try:
        outcome = get_method("retrain", setting="vfl").unlearn(fed_state, batch)
    finally:
        del federation.backprop
    trained_on = torch.cat(seen)
    assert not torch.isin(trained_on, forget).any() and set(trained_on.tolist()) == set(retained.tolist())
    expected = load_vertical("wine-vfl", root, CPU, config=CONFIG, seed=0).fit(retained).state
    assert all(torch.equal(outcome.state[p][k], expected[p][k]) for p in expected for k in expected[p])
    assert [h["round"] for h in outcome.history] == list(range(1, CONFIG.rounds + 1))
    assert outcome.history[-1]["forget_acc"] == 0.0  # never trained on class 2
    assert outcome.cost.comm_bytes == 2 * 2 * 4 * EMBEDDING * len(retained) * CONFIG.rounds
    assert outcome.cost.flops > 0 and outcome.cost.wall_seconds > 0


def test_vertical_ga_raises_the_forget_loss_then_recovers_on_retained_data(trained):
    federation, state = trained
    fed_state = VerticalState.from_federation(federation, state)
    batch = resolve_request("class", [1], fed_state.clients, num_classes=3)
    outcome = get_method("ga", setting="vfl", recovery_epochs=1).unlearn(fed_state, batch)
    numbers = outcome.certificate_inputs
    assert numbers["forget_loss_after"] > numbers["forget_loss_before"]
    assert numbers["early_stopped"] and numbers["stop_loss"] == pytest.approx(math.log(3))
    assert [h["phase"] for h in outcome.history] == ["unlearn", "recovery"]
    assert outcome.history[-1]["forget_acc"] < 0.5
