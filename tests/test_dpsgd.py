"""D-PSGD: the update equation, determinism, consensus, departed nodes, cost; D-PSGD retraining
registered as the DFL ``retrain``; the partition stage's PCA / unit-norm feature transform."""

import hashlib

import numpy as np
import pytest
import torch

from fedunlearn.config import Params, TrainConfig
from fedunlearn.data.datasets import load_source
from fedunlearn.data.partition import assign_iid, holdout_mask
from fedunlearn.data.store import (PARTITIONS_DIR, load_horizontal, partition_scenario, prepare_dataset,
                                   refits_on_holdout_deletion)
from fedunlearn.federation.cost import communication_bytes
from fedunlearn.federation.dpsgd import DPSGD, average_state
from fedunlearn.federation.local import Tensors, objective
from fedunlearn.federation.topology import Topology, ring
from fedunlearn.unlearning import ForgetSet, FederatedState, Retrain, get_method
from fedunlearn.unlearning.dfl_retrain import DecentralizedRetrain, DecentralizedState
from models import build_model

CPU = torch.device("cpu")


def breast_cancer(num_clients: int = 4) -> tuple[list[Tensors], Tensors]:
    """Standardised, unit-norm breast_cancer split IID over ``num_clients`` (the DFL test scenario)."""
    data = load_source("breast_cancer")
    is_test = holdout_mask(data.sample_ids, 0, 0.2)
    x = (data.features - data.features[~is_test].mean(0)) / data.features[~is_test].std(0)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    owner = assign_iid(data.sample_ids[~is_test], num_clients, 0)
    train = [Tensors.from_arrays(x[~is_test][owner == c], data.labels[~is_test][owner == c],
                                 data.sample_ids[~is_test][owner == c], CPU) for c in range(num_clients)]
    return train, Tensors.from_arrays(x[is_test], data.labels[is_test], data.sample_ids[is_test], CPU)


def logreg_fn(features: int = 30, classes: int = 2, l2: float = 0.01):
    return lambda: build_model("logreg", (features,), classes, l2=l2)


CONFIG = TrainConfig(rounds=30, local_epochs=1, lr=0.5, batch_size=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_iteration_is_mix_then_own_gradient(dtype):
    """x_i ← Σ_j Q_ij x_j − γ ∇F_i(x_i): with the batch = a node's whole data, exactly — in the
    model's dtype (a float32 mixing matrix once failed on a float64 model)."""
    rng = np.random.default_rng(0)
    clients = [Tensors(torch.as_tensor(rng.normal(size=(4, 2)), dtype=dtype), torch.as_tensor(rng.integers(0, 3, 4)),
                       np.array([f"{c}-{i}" for i in range(4)])) for c in range(3)]
    fn = lambda: build_model("logreg", (2,), 3, l2=0.1).to(dtype)  # noqa: E731
    config = TrainConfig(rounds=1, lr=0.3, batch_size=4)
    torch.manual_seed(1)
    starts = [{k: v.clone() for k, v in fn().state_dict().items()} for _ in range(3)]
    engine = DPSGD(fn, config, ring(3), seed=0, device=CPU)
    result = engine.fit(clients, state=starts)
    q = ring(3).mixing()
    for i in range(3):
        model = engine.model_from(starts[i])
        objective(model, clients[i].x, clients[i].y).backward()
        for name, p in model.named_parameters():
            mixed = sum(q[i, j] * starts[j][name] for j in range(3))
            assert result[i][name].dtype == dtype
            assert torch.allclose(result[i][name], (mixed - 0.3 * p.grad).to(dtype), atol=1e-6)


def test_dpsgd_is_seeded_learns_and_reaches_consensus():
    clients, test = breast_cancer()
    engine = DPSGD(logreg_fn(), CONFIG, ring(4), seed=0, device=CPU)
    rounds = []
    first = engine.fit(clients, on_round=rounds.append)
    second = DPSGD(logreg_fn(), CONFIG, ring(4), seed=0, device=CPU).fit(clients)
    other = DPSGD(logreg_fn(), CONFIG, ring(4), seed=1, device=CPU).fit(clients)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(first, second) for k in a)
    assert any(not torch.equal(a[k], b[k]) for a, b in zip(first, other) for k in a)
    average = average_state(first)
    assert engine.test_accuracy(average, test) > 0.9
    spread = max(float((s["linear.weight"] - average["linear.weight"]).norm()) for s in first)
    assert spread < 0.1 * float(average["linear.weight"].norm())
    # Cost: every iteration, a model copy each way over each of the ring's 4 links.
    steps = engine.steps_per_round(clients)
    assert steps == int(np.ceil(max(len(c) for c in clients) / 16))
    assert rounds[0].comm_bytes == communication_bytes(62, 4, rounds=steps) == steps * 2 * 4 * 62 * 4
    assert rounds[0].samples == steps * 16 * 4 and len(rounds) == 30


def test_a_node_without_data_leaves_the_graph():
    clients, _ = breast_cancer()
    empty = clients[2].select(np.zeros(len(clients[2]), dtype=bool))
    nodes = DPSGD(logreg_fn(), CONFIG.model_copy(update={"rounds": 2}), ring(4), seed=0,
                  device=CPU).fit([clients[0], clients[1], empty, clients[3]])
    assert nodes[2] is None and all(nodes[i] is not None for i in (0, 1, 3))
    line = Topology("line", np.eye(4, k=1, dtype=bool) | np.eye(4, k=-1, dtype=bool))
    with pytest.raises(ValueError, match=r"disconnected, components \[\[0, 1\], \[3\]\]"):
        DPSGD(logreg_fn(), CONFIG, line, seed=0, device=CPU).fit([clients[0], clients[1], empty, clients[3]])


def test_fedavg_only_settings_are_refused():
    with pytest.raises(ValueError, match="momentum=0.9 must keep its default"):
        DPSGD(logreg_fn(), TrainConfig(momentum=0.9), ring(3), seed=0, device=CPU)


def test_dfl_retrain_is_dpsgd_from_scratch_on_the_retained_data():
    clients, test = breast_cancer()
    config = CONFIG.model_copy(update={"rounds": 5})
    nodes = DPSGD(logreg_fn(), config, ring(4), seed=0, device=CPU).fit(clients)
    fed_state = DecentralizedState("dfl", logreg_fn(), average_state(nodes), clients, test, config, 0, CPU, 2,
                                   topology=ring(4), node_states=nodes)
    method = get_method("retrain", setting="dfl", kind="client")
    assert isinstance(method, DecentralizedRetrain) and isinstance(get_method("retrain", setting="hfl"), Retrain)
    batch = ForgetSet.for_clients([1], clients)
    outcome = method.unlearn(fed_state, batch)
    expected = DPSGD(logreg_fn(), config, ring(4), seed=0, device=CPU).fit(fed_state.retained_clients(batch))
    assert outcome.node_states[1] is None
    assert all(torch.equal(outcome.node_states[i][k], expected[i][k]) for i in (0, 2, 3) for k in expected[0])
    assert torch.equal(outcome.state["linear.weight"], average_state(expected)["linear.weight"])
    assert [h["round"] for h in outcome.history] == [1, 2, 3, 4, 5]
    assert outcome.cost.comm_bytes == 5 * communication_bytes(62, 2, rounds=DPSGD(
        logreg_fn(), config, ring(4), 0, CPU).steps_per_round(fed_state.retained_clients(batch)))
    after = fed_state.advanced(batch, outcome)
    assert len(after.clients[1]) == 0 and after.nodes()[1] is None


def test_partition_stage_applies_pca_and_unit_norm_fit_on_the_held_out_split(tmp_path):
    """... so that deleting training samples moves no other sample's features; and a DFL
    federation is built from the partition and its trained local models."""
    params = Params.model_validate({"seed": 0, "scenarios": {"digits-dfl": {
        "dataset": "digits", "setting": "dfl", "model": "logreg",
        "partition": {"scheme": "iid", "num_clients": 3, "features": "pca10", "unit_norm": True}}}})
    prepare_dataset("digits", params, tmp_path, set())
    out = partition_scenario("digits-dfl", params, tmp_path)
    digest = {p.name + p.parent.name: hashlib.md5(p.read_bytes()).hexdigest() for p in out.rglob("*.npy")}
    assert digest == {p.name + p.parent.name: hashlib.md5(p.read_bytes()).hexdigest()
                      for p in partition_scenario("digits-dfl", params, tmp_path).rglob("*.npy")}
    part = load_horizontal("digits-dfl", tmp_path)
    assert part.input_shape == (10,) and part.manifest["unit_norm"] is True
    assert part.manifest["features"]["transform"] == "pca10" and 0 < part.manifest["features"]["explained_variance"] < 1
    assert refits_on_holdout_deletion(part.manifest)
    everything = np.concatenate([c.features for c in part.clients] + [part.test.features])
    assert np.allclose(np.linalg.norm(everything, axis=1), 1, atol=1e-5)
    # Fit on the held-out rows only: every training row is their projection.
    source = load_source("digits")
    flat, held_out = source.features.reshape(len(source.features), -1), holdout_mask(source.sample_ids, 0, 0.2)
    from sklearn.decomposition import PCA

    projected = PCA(10, svd_solver="full").fit(flat[held_out]).transform(flat[~held_out])
    projected /= np.linalg.norm(projected, axis=1, keepdims=True)
    ids = np.concatenate([c.sample_ids for c in part.clients])
    order = {sid: i for i, sid in enumerate(source.sample_ids[~held_out])}
    assert np.allclose(np.concatenate([c.features for c in part.clients]), projected[[order[s] for s in ids]],
                       atol=1e-5)

    def features_by_id(gone: set[str]) -> dict[str, np.ndarray]:
        prepare_dataset("digits", params, tmp_path, gone)
        partition_scenario("digits-dfl", params, tmp_path)
        again = load_horizontal("digits-dfl", tmp_path)
        return {sid: x for c in [*again.clients, again.test] for sid, x in zip(c.sample_ids.tolist(), c.features)}

    before = features_by_id(set())
    trained_gone = set(ids[:25].tolist())
    after_training_deletion = features_by_id(trained_gone)
    assert set(after_training_deletion) == set(before) - trained_gone
    assert all(np.array_equal(x, before[sid]) for sid, x in after_training_deletion.items())
    held_out_gone = {part.test.sample_ids[0]}
    after_held_out_deletion = features_by_id(held_out_gone)
    assert not np.allclose(after_held_out_deletion[ids[0]], before[ids[0]], atol=1e-6)
    prepare_dataset("digits", params, tmp_path, set())
    partition_scenario("digits-dfl", params, tmp_path)
    assert (tmp_path / PARTITIONS_DIR / "digits-dfl" / "client_002").is_dir()
    model_fn = lambda: build_model("logreg", part.input_shape, part.num_classes, l2=0.01)  # noqa: E731
    config = TrainConfig(rounds=2, lr=0.5)
    clients = [Tensors.from_arrays(c.features, c.labels, c.sample_ids, CPU) for c in part.clients]
    nodes = DPSGD(model_fn, config, ring(3), 0, CPU).fit(clients)
    fed_state = DecentralizedState.from_training(part, model_fn=model_fn, node_states=nodes, topology=ring(3),
                                                 train_config=config, seed=0, device=CPU)
    assert fed_state.setting == "dfl" and fed_state.node_states == nodes and fed_state.nodes() == nodes
    assert torch.equal(fed_state.state["linear.bias"], average_state(nodes)["linear.bias"])
    untrained = DecentralizedState.from_federation(FederatedState.from_partition(
        part, model_fn=model_fn, state={}, train_config=config, seed=0, device=CPU, setting="dfl"), ring(3))
    assert untrained.node_states is None and untrained.state == {} and len(untrained.topology) == 3


def test_tabular_standardisation_is_fit_on_the_held_out_split(tmp_path):
    """Deleting training rows leaves every other row's standardised features byte-identical."""
    params = Params.model_validate({"seed": 0, "scenarios": {"bc": {
        "dataset": "breast_cancer", "setting": "dfl", "model": "logreg",
        "partition": {"scheme": "iid", "num_clients": 2, "unit_norm": True}}}})

    def features_by_id(gone: set[str]) -> dict[str, np.ndarray]:
        prepare_dataset("breast_cancer", params, tmp_path, gone)
        partition_scenario("bc", params, tmp_path)
        part = load_horizontal("bc", tmp_path)
        assert refits_on_holdout_deletion(part.manifest)
        return {sid: x for c in [*part.clients, part.test] for sid, x in zip(c.sample_ids.tolist(), c.features)}

    before = features_by_id(set())
    trained = [sid for sid in load_horizontal("bc", tmp_path).clients[0].sample_ids.tolist()][:30]
    after = features_by_id(set(trained))
    assert set(after) == set(before) - set(trained)
    assert all(np.array_equal(x, before[sid]) for sid, x in after.items())
