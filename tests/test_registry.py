"""The registry for each setting (stores.registry): a version holds the weights as its setting's
federation holds them — HFL one model; VFL each party's bottom model and the active party's top
model as separate artifacts, so a party fetches its own part alone; DFL the published model, every
node's model and certified DFU's budget — and loading a version back gives exactly those weights.
The models input example is zeros, never a data row."""

import json

import pytest
import torch

from fedunlearn.config import load_params
from fedunlearn.training import load_federation, train
from stores.registry import ModelWeights, Registry
from stores.workspace import reproduce

SCENARIOS = {"hfl": "digits-hfl", "vfl": "wine-vfl", "dfl": "breast_cancer-dfl-ring"}


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    return torch.equal(a, b)


@pytest.mark.parametrize("setting", ["hfl", "vfl", "dfl"])
def test_a_version_loads_back_exactly_the_weights_it_was_registered_with(workspace, setting):
    scenario = SCENARIOS[setting]
    reproduce(workspace, scenario)
    params = load_params(workspace / "params.yaml")
    params.scenarios[scenario].train.rounds = 2
    federation = load_federation(scenario, params, workspace, torch.device("cpu"))
    trained = train(federation)
    budget = {"budget": 1e-3, "entries": []} if setting == "dfl" else None
    weights = ModelWeights(trained.state, trained.node_states, budget)
    registry = Registry(workspace)
    run_id = registry.start_run(scenario, "test", {}, {})
    ref = registry.register(run_id, scenario, setting, weights, federation.model_from(trained.state),
                            tuple(federation.test.x.shape[1:]), {"role": "original", "data_version": "v"},
                            alias="original")
    loaded = registry.load(scenario, alias="original")
    assert loaded.ref.version == ref.version and loaded.tags["setting"] == setting
    assert equal(loaded.state, trained.state)
    if setting == "dfl":
        assert len(loaded.weights.node_states) == len(trained.node_states)
        assert all(equal(a, b) for a, b in zip(loaded.weights.node_states, trained.node_states))
        assert loaded.weights.budget == budget
    example = json.loads(next((workspace / "mlflow").rglob("input_example.json")).read_text())
    assert not any(value for value in json.dumps(example).replace("[", " ").replace("]", " ").replace(",", " ")
                   .split() if value.replace(".", "").replace("-", "").isdigit() and float(value) != 0)
    if setting == "vfl":
        parties = sorted(trained.state)
        active = registry.load_party(scenario, ref.version, parties[-1])
        passive = registry.load_party(scenario, ref.version, parties[0])
        assert sorted(active) == ["bottom", "top"] and sorted(passive) == ["bottom"]
        assert equal({f"bottom.{k}": v for k, v in passive["bottom"].items()}, trained.state[parties[0]])


def test_step_metrics_are_written_in_batches_and_when_the_block_ends_however_it_ends(workspace, monkeypatch):
    """A training's rounds are logged through ``step_metrics``: nothing per round but one write per
    interval, every step with its own number and value in MLflow's history, the last ones written
    even when training fails."""
    registry = Registry(workspace)
    run_id = registry.start_run("digits-hfl", "rounds", {}, {})
    writes = []
    log_batch = registry.client.log_batch
    monkeypatch.setattr(registry.client, "log_batch", lambda *a, **k: writes.append(k) or log_batch(*a, **k))

    with registry.step_metrics(run_id, interval_s=3600) as log_round:
        for step in range(1, 21):
            log_round({"test_acc": step / 100, "train_loss": None}, step)
        assert writes == []  # within the interval: nothing written yet
    assert len(writes) == 1
    history = registry.client.get_metric_history(run_id, "test_acc")
    assert sorted((m.step, m.value) for m in history) == [(s, s / 100) for s in range(1, 21)]
    assert registry.client.get_metric_history(run_id, "train_loss") == []  # None is not logged

    with pytest.raises(RuntimeError), registry.step_metrics(run_id, interval_s=0) as log_round:
        log_round({"train_loss": 0.5}, 1)  # interval 0: written at once
        assert len(writes) == 2
        log_round({"train_loss": 0.25}, 2)
        raise RuntimeError("training failed")
    assert sorted((m.step, m.value) for m in registry.client.get_metric_history(run_id, "train_loss")) == [
        (1, 0.5), (2, 0.25)]
