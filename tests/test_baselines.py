"""Baselines on a tiny real federation (digits, 3 IID clients, MLP, 2 rounds): retrain trains only
on retained IDs and reproduces the original configuration; GA raises the forget loss inside its
projection ball; fine-tuning moves the model without ever seeing a forget ID."""

import math

import numpy as np
import pytest
import torch

from fedunlearn.config import TrainConfig
from fedunlearn.data.datasets import load_source
from fedunlearn.data.partition import assign_iid, holdout_mask
from fedunlearn.federation.fedavg import FedAvg, map_inline
from fedunlearn.federation.local import Tensors
from fedunlearn.unlearning import ForgetSet, FederatedState, get_method, resolve_request
from models import build_model

CPU = torch.device("cpu")
SEED = 0


@pytest.fixture(scope="module")
def fed_state() -> FederatedState:
    data = load_source("digits")
    is_test = holdout_mask(data.sample_ids, SEED, 0.2)
    test = Tensors.from_arrays(data.features[is_test], data.labels[is_test], data.sample_ids[is_test], CPU)
    train = data.subset(~is_test)
    owner = assign_iid(train.sample_ids, 3, SEED)
    clients = [Tensors.from_arrays(train.features[owner == c], train.labels[owner == c],
                                   train.sample_ids[owner == c], CPU) for c in range(3)]

    def model_fn():
        return build_model("mlp", data.input_shape, data.num_classes)

    config = TrainConfig(rounds=2, local_epochs=2, lr=0.2, batch_size=32)  # ≈ 88% test accuracy
    state = FedAvg(model_fn, config, SEED, CPU).fit(clients)
    return FederatedState("hfl", model_fn, state, clients, test, config, SEED, CPU, data.num_classes)


def spying(fed_state: FederatedState) -> tuple[FederatedState, list[tuple[int, np.ndarray]]]:
    """The same federation with a map_updates that records (client, sample IDs) of every job."""
    seen: list[tuple[int, np.ndarray]] = []

    def map_updates(fn, jobs):
        seen.extend((job["client"], job["data"].sample_ids) for job in jobs)
        return map_inline(fn, jobs)

    return FederatedState(**{**vars(fed_state), "map_updates": map_updates}), seen


def all_forget_ids(forget_set: ForgetSet) -> set[str]:
    return set(np.concatenate(list(forget_set.forget_ids.values())).tolist())


def distance(a, b) -> float:
    return math.sqrt(sum(float((a[k] - b[k]).pow(2).sum()) for k in a))


def test_retrain_trains_only_on_retained_ids_with_the_original_configuration(fed_state):
    batch = resolve_request("sample", {"clients": [0, 2], "fraction": 0.2, "seed": 1}, fed_state.clients)
    spy_state, seen = spying(fed_state)
    outcome = get_method("retrain", setting="hfl").unlearn(spy_state, batch)

    rounds = fed_state.train_config.rounds
    assert len(seen) == 3 * rounds
    assert not any(all_forget_ids(batch) & set(ids.tolist()) for _, ids in seen)
    trained_on = set(np.concatenate([ids for _, ids in seen]).tolist())
    retained = set(np.concatenate([c.sample_ids for c in fed_state.clients]).tolist()) - all_forget_ids(batch)
    assert trained_on == retained
    # Same seed, model_fn, TrainConfig and rounds: identical to FedAvg on the retained data.
    expected = FedAvg(fed_state.model_fn, fed_state.train_config, SEED, CPU).fit(fed_state.retained_clients(batch))
    assert all(torch.equal(outcome.state[k], expected[k]) for k in expected)
    assert [h["round"] for h in outcome.history] == list(range(1, rounds + 1))
    assert outcome.cost.wall_seconds > 0 and outcome.cost.flops > 0
    params = sum(v.numel() for v in outcome.state.values())
    assert outcome.cost.comm_bytes == 2 * params * 4 * 3 * rounds


def test_retrain_without_a_removed_client_never_contacts_it(fed_state):
    spy_state, seen = spying(fed_state)
    outcome = get_method("retrain", setting="hfl").unlearn(spy_state, resolve_request("client", 1, fed_state.clients))
    assert {client for client, _ in seen} == {0, 2}
    assert outcome.cost.comm_bytes == 2 * sum(v.numel() for v in outcome.state.values()) * 4 * 2 * 2


def test_gradient_ascent_raises_forget_loss_within_the_projection_ball(fed_state):
    batch = resolve_request("client", 2, fed_state.clients)
    radius = 0.5
    ga = get_method("ga", setting="hfl", lr=0.5, epochs=3, stop_loss=100.0, radius=radius, recovery_rounds=0)
    outcome = ga.unlearn(fed_state, batch)
    numbers = outcome.certificate_inputs

    assert numbers["forget_loss_after"] > numbers["forget_loss_before"]
    assert numbers["ascent_steps"] > 0 and numbers["early_stopped_clients"] == 0
    # The ball binds (the unconstrained ascent would leave it) and the model stays on it.
    reference = ga._reference(fed_state, fed_state.forget_by_client(batch))
    assert distance(outcome.state, reference) <= radius * (1 + 1e-5)
    assert numbers["unlearned_distance"] == pytest.approx(radius, rel=1e-4)
    assert [h["phase"] for h in outcome.history] == ["unlearn"]
    assert outcome.history[0]["forget_acc"] < 1.0


def test_gradient_ascent_stops_early_and_recovers_on_retained_data_only(fed_state):
    batch = resolve_request("sample", {"clients": [0], "fraction": 0.3, "seed": 0}, fed_state.clients)
    spy_state, seen = spying(fed_state)
    outcome = get_method("ga", setting="hfl", lr=1.0, stop_loss=1.0, recovery_rounds=2).unlearn(spy_state, batch)

    numbers = outcome.certificate_inputs
    assert numbers["early_stopped_clients"] == 1
    assert numbers["radius"] > 0  # derived as 1/3 of the distance from w_ref to the initial model
    assert [h["phase"] for h in outcome.history] == ["unlearn", "recovery", "recovery"]
    # Jobs: replayed reference update + ascent on the forget data, then recovery on retained data.
    forget = all_forget_ids(batch)
    assert [set(ids.tolist()) == forget for _, ids in seen[:2]] == [True, True]
    assert not any(forget & set(ids.tolist()) for _, ids in seen[2:])


def test_finetune_changes_the_model_and_never_sees_forget_ids(fed_state):
    batch = resolve_request("class", [3], fed_state.clients, num_classes=fed_state.num_classes)
    spy_state, seen = spying(fed_state)
    outcome = get_method("finetune", rounds=2).unlearn(spy_state, batch)

    assert distance(outcome.state, fed_state.state) > 0
    assert len(seen) == 3 * 2
    assert not any(all_forget_ids(batch) & set(ids.tolist()) for _, ids in seen)
    assert [h["round"] for h in outcome.history] == [1, 2]
    assert outcome.certificate_inputs == {"rounds": 2}
