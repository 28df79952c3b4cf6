"""End to end: the train flow on digits-hfl (3 clients × 2 rounds) through a real temporary
Prefect server, a real DVC repository and a real sqlite MLflow registry: trained once with mapped
client tasks, then once inline (arranged once for the module: ``trained``; its tests only read it).
Then the CLI's ``ids`` and the device a sub-flow takes."""

from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest

from flows.results import TrainResult
from stores.registry import RegisteredModel, Registry, tracking_uri
from workspaces import Printed, call_cli, copy_workspace

SCENARIO = "digits-hfl"


def registry(workspace) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))


@dataclass(frozen=True)
class Trained:
    """The module's training: the mapped-task run's result and registered weights, then the inline run's."""

    workspace: Path
    result: TrainResult        # train_federated with client tasks (the default)
    original: str              # the version alias `original` named right after it
    registered: RegisteredModel  # that version loaded from the registry, weights included
    inline: TrainResult        # train_federated(client_tasks=False), after it
    inline_state: dict         # the weights the inline run registered as `original`


@pytest.fixture(scope="module")
def trained(fresh_workspace_template, prefect_server, tmp_path_factory) -> Trained:
    """A fresh workspace; the train flow with mapped client tasks, then with the clients inline."""
    from flows.train import train_federated

    # arrange
    workspace = copy_workspace(fresh_workspace_template, tmp_path_factory.mktemp("train") / "workspace")

    # act
    result = train_federated(scenario=SCENARIO, root=str(workspace))
    original = str(registry(workspace).get_model_version_by_alias(SCENARIO, "original").version)
    registered = Registry(workspace).load(SCENARIO, alias="original")
    inline = train_federated(scenario=SCENARIO, root=str(workspace), client_tasks=False)
    inline_state = Registry(workspace).load(SCENARIO, alias="original").state
    return Trained(workspace, result, original, registered, inline, inline_state)


def test_train_flow_registers_the_original_model(trained):
    # assert
    assert trained.result.model_version == "1" and trained.original == "1"
    version = registry(trained.workspace).get_model_version(SCENARIO, trained.original)
    assert version.tags["role"] == "original"
    assert version.tags["scenario"] == SCENARIO
    assert version.tags["data_version"] == trained.result.data_version


def test_train_flow_logs_test_accuracy_and_training_loss_per_round(trained):
    # assert
    client = registry(trained.workspace)
    history = client.get_metric_history(trained.result.run_id, "test_acc")
    assert [m.step for m in history] == [1, 2]
    assert len(client.get_metric_history(trained.result.run_id, "train_loss")) == 2


def test_the_original_model_loads_from_the_registry_with_its_weights(trained):
    # assert
    registered = trained.registered
    assert registered.tags["role"] == "original" and "classifier.2.weight" in registered.state


def test_the_inline_path_gives_the_same_model_as_the_mapped_task_runs(trained):
    """Deterministic client updates: the inline run registers the same weights, as version 2, now `original`."""
    # assert
    assert trained.inline.model_version == "2"
    assert str(registry(trained.workspace).get_model_version_by_alias(SCENARIO, "original").version) == "2"
    state = trained.registered.state
    assert all((state[k] == trained.inline_state[k]).all() for k in state)


@dataclass(frozen=True)
class Prepared:
    workspace: Path


@pytest.fixture(scope="module")
def prepared(fresh_workspace_template, tmp_path_factory) -> Prepared:
    """A fresh workspace with digits-hfl's data prepared (`fedunlearn prepare`); its tests only read it."""
    workspace = copy_workspace(fresh_workspace_template, tmp_path_factory.mktemp("ids") / "workspace")
    printed = call_cli(workspace, "prepare", "--scenario", SCENARIO)
    assert printed.status == 0, printed.err
    return Prepared(workspace)


def test_cli_ids_prints_the_current_sample_ids(prepared):
    # act
    printed: Printed = call_cli(prepared.workspace, "ids", "--scenario", SCENARIO, "--client", "2", "--limit", "4")

    # assert
    ids = printed.out.split()
    assert printed.status == 0, printed.err
    assert len(ids) == 4 and all(i.startswith("digits-") for i in ids)


def test_cli_ids_refuses_an_unknown_client(prepared):
    # act
    printed = call_cli(prepared.workspace, "ids", "--scenario", SCENARIO, "--client", "7")

    # assert
    assert printed.status == 2
    assert "unknown client 7" in printed.err


@pytest.fixture
def resolved(monkeypatch) -> list[str]:
    """Every device name ``tasks.data.resolve_device`` is asked for, in order (it still resolves them)."""
    import tasks.data as data

    names, real = [], data.resolve_device
    monkeypatch.setattr(data, "resolve_device", lambda name: names.append(name) or real(name))
    return names


def test_the_flow_chooses_the_device_once_and_training_takes_it(workspace, prefect_server, resolved):
    """One flow per command: ``train-federated`` resolves the device where it starts; the training
    below takes the ``torch.device`` (no sub-flow resolves it again), and the command's ``--rounds``
    reaches the training without touching the workspace's params."""
    from flows.train import train_federated
    from stores.workspace import ScenarioScope, Workspace

    # act
    result = train_federated(scenario=SCENARIO, root=str(workspace), rounds=1, device="cpu", client_tasks=False)

    # assert
    ws = Workspace.open(workspace)
    run = ws.registry.client.get_run(result.run_id)
    assert result.device == "cpu" and resolved == ["cpu"]
    assert run.data.params["train.rounds"] == "1" and run.data.params["device"] == "cpu"
    scope = ScenarioScope(ws, SCENARIO)
    assert scope.with_training(rounds=1).config.train.rounds == 1
    assert scope.config.train.rounds == ws.params.scenario(SCENARIO).train.rounds != 1  # the scope it came from


def test_outside_any_flow_the_device_is_resolved(workspace, resolved):
    """A command's first flow chooses the device: outside any flow, a concrete name is resolved too."""
    import torch

    import tasks.data as data
    from stores.workspace import Workspace

    # arrange
    ws = Workspace.open(workspace)

    # act
    device = data.command_device(ws, "cpu")

    # assert
    assert device == torch.device("cpu") and resolved == ["cpu"]
