"""End to end: the train flow on digits-hfl (3 clients × 2 rounds) through a real temporary
Prefect server, a real DVC repository and a real sqlite MLflow registry."""

import mlflow

from stores.registry import Registry, tracking_uri


def test_train_flow_registers_the_original_model(workspace, prefect_server):
    from flows.train import train_federated

    result = train_federated(scenario="digits-hfl", root=str(workspace))
    assert result.model_version == "1"
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))
    version = client.get_model_version_by_alias("digits-hfl", "original")
    assert str(version.version) == "1"
    assert version.tags["role"] == "original"
    assert version.tags["scenario"] == "digits-hfl"
    assert version.tags["data_version"] == result.data_version
    history = client.get_metric_history(result.run_id, "test_acc")
    assert [m.step for m in history] == [1, 2]
    assert len(client.get_metric_history(result.run_id, "train_loss")) == 2
    registered = Registry(workspace).load("digits-hfl", alias="original")
    state = registered.state
    assert registered.tags["role"] == "original" and "classifier.2.weight" in state
    # The inline path gives the same model as the mapped task runs (deterministic client updates).
    inline = train_federated(scenario="digits-hfl", root=str(workspace), client_tasks=False)
    inline_state = Registry(workspace).load("digits-hfl", alias="original").state
    assert inline.model_version == "2"
    assert all((state[k] == inline_state[k]).all() for k in state)


def test_cli_ids_prints_the_current_sample_ids(workspace, capsys):
    from cli import main

    assert main(["--root", str(workspace), "prepare", "--scenario", "digits-hfl"]) == 0
    capsys.readouterr()
    assert main(["--root", str(workspace), "ids", "--scenario", "digits-hfl", "--client", "2", "--limit", "4"]) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == 4 and all(i.startswith("digits-") for i in ids)
    assert main(["--root", str(workspace), "ids", "--scenario", "digits-hfl", "--client", "7"]) == 2
    assert "unknown client 7" in capsys.readouterr().err


def test_a_sub_flow_takes_the_device_its_parent_chose(workspace, prefect_server, monkeypatch):
    import torch
    from prefect import flow

    import tasks.data as data
    from stores.workspace import Workspace

    ws, resolved = Workspace.open(workspace), []
    real = data.resolve_device
    monkeypatch.setattr(data, "resolve_device", lambda name: resolved.append(name) or real(name))

    @flow(name="device-child")
    def child(device: str | None) -> str:
        return str(data.command_device(ws, device))

    @flow(name="device-parent")
    def parent(device: str | None) -> tuple[str, str, str]:
        chosen = data.command_device(ws, device)
        return str(chosen), child(str(chosen)), child("auto")

    chosen, handed_down, auto = parent("cpu")

    # The parent's choice is made once; a concrete device handed down is taken as chosen, `auto` is not.
    assert (chosen, handed_down, auto) == ("cpu", "cpu", str(real("auto")))
    assert resolved == ["cpu", "auto"]
    # Outside any flow the device is resolved (a command's first flow chooses it).
    assert data.command_device(ws, "cpu") == torch.device("cpu") and resolved[-1] == "cpu"
