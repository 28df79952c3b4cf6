import numpy as np
import pytest
import torch

from fedunlearn.config import TrainConfig
from fedunlearn.data.datasets import load_source
from fedunlearn.federation.fedavg import ClientUpdate, FedAvg, aggregate
from fedunlearn.federation.local import Tensors, objective
from models import build_model


def test_aggregation_is_the_sample_weighted_pseudo_gradient_step():
    w = {"a": torch.tensor([1.0, 2.0]), "steps": torch.tensor(3)}
    updates = [ClientUpdate(0, {"a": torch.tensor([3.0, 2.0]), "steps": torch.tensor(4)}, 30, 0.0),
               ClientUpdate(1, {"a": torch.tensor([1.0, 6.0]), "steps": torch.tensor(4)}, 10, 0.0)]
    # Δ = 0.75·(2, 0) + 0.25·(0, 4) = (1.5, 1.0)
    assert torch.allclose(aggregate(w, updates)["a"], torch.tensor([2.5, 3.0]))
    assert torch.allclose(aggregate(w, updates, server_lr=2.0)["a"], torch.tensor([4.0, 4.0]))
    assert aggregate(w, updates)["steps"].item() == 4


def test_fedavg_of_equal_clients_is_their_plain_average():
    w = {"a": torch.zeros(3)}
    updates = [ClientUpdate(i, {"a": torch.full((3,), float(i))}, 5, 0.0) for i in range(4)]
    assert torch.allclose(aggregate(w, updates)["a"], torch.full((3,), 1.5))


def digits_clients(n_clients: int = 3) -> tuple[list[Tensors], Tensors]:
    data = load_source("digits")
    x, y, ids = data.features[:600], data.labels[:600], data.sample_ids[:600]
    clients = [Tensors.from_arrays(x[i::n_clients], y[i::n_clients], ids[i::n_clients], torch.device("cpu"))
               for i in range(n_clients)]
    test = Tensors.from_arrays(data.features[1500:], data.labels[1500:], data.sample_ids[1500:], torch.device("cpu"))
    return clients, test


def make_engine(seed: int = 0, **overrides) -> FedAvg:
    config = TrainConfig(rounds=2, local_epochs=3, lr=0.1, batch_size=16).model_copy(update=overrides)
    return FedAvg(lambda: build_model("cnn", (1, 8, 8), 10), config, seed, torch.device("cpu"))


def test_same_seed_gives_identical_weights_and_training_learns():
    clients, test = digits_clients()
    first = make_engine(seed=0).fit(clients)
    second = make_engine(seed=0).fit(clients)
    other = make_engine(seed=1).fit(clients)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)
    engine = make_engine()
    assert engine.test_accuracy(first, test) > engine.test_accuracy(engine.initial_state(), test) + 0.2


def test_client_fraction_samples_a_seeded_subset():
    clients, _ = digits_clients(n_clients=6)
    engine = make_engine(client_fraction=0.5)
    chosen = engine.select_clients(0, clients)
    assert len(chosen) == 3 and chosen == engine.select_clients(0, clients)
    assert len({tuple(engine.select_clients(r, clients)) for r in range(10)}) > 1


def test_clients_without_data_are_skipped():
    clients, _ = digits_clients()
    empty = clients[0].select(np.zeros(len(clients[0]), dtype=bool))
    assert make_engine().select_clients(0, [empty, *clients[1:]]) == [1, 2]


def test_logistic_regression_objective_includes_the_l2_term():
    model = build_model("logreg", (4,), 3, l2=0.5)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    plain = torch.nn.functional.cross_entropy(model(x), y)
    l2 = 0.25 * sum((p ** 2).sum() for p in model.parameters())
    assert torch.allclose(objective(model, x, y), plain + l2)


@pytest.mark.parametrize("name,shape", [("mlp", (30,)), ("cnn", (1, 28, 28)), ("cnn", (1, 8, 8)),
                                        ("resnet18", (1, 8, 8)), ("logreg", (13,))])
def test_models_build_and_produce_logits(name, shape):
    model = build_model(name, shape, 10, seed=0)
    assert model(torch.zeros(2, *shape)).shape == (2, 10)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("transformer", shape, 10)
